"""Host cost of routing a training step: `route_fused` (all tile sizes at once) against one
`route_bounded` call per size after one sort, in host time per call (best of five bursts, no sync inside
one) and top-level torch ops (each op is a kernel launch on a GPU, paid by the host before the step's
kernels start). `results/cpu/routing_cost.log` was measured when `route_bounded` had code of its own
(93 ops for the three sizes); it is now a one-size call of the same code.

    python -m benchmarks.tools.routing_cost [--arch cpu|cuda]
"""
import argparse

import torch

import tinn  # noqa: E402
from benchmarks.common import host_ms_per_step  # noqa: E402


def per_size(routing, ids, n, sizes):
    presorted = routing.sort_by_network(ids, n)
    return tuple(routing.route_bounded(ids, n, size, presorted) for size in sizes)


def top_level_ops(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def best_us(fn) -> float:
    for _ in range(5):
        fn()
    return 1e3 * host_ms_per_step(fn, bursts=5, steps=50)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    from tinn import routing
    dev = tinn.runtime.device()
    sizes = (64, 2048, 32)  # forward tiles, weight-gradient chunks, backward-deltas tiles
    print(f"routing, {arch}, tile sizes {sizes}")
    print(f"{'networks':>8s} {'batch':>8s} | {'per size us':>11s} {'ops':>4s} | {'fused us':>8s} {'ops':>4s}")
    for n, log2 in ((64, 12), (4096, 12), (64, 16), (4096, 22)):
        if log2 > 16 and arch != "cuda":
            continue
        ids = torch.randint(0, n, (1 << log2,), dtype=torch.int32, device=dev)
        a = (best_us(lambda: per_size(routing, ids, n, sizes)), top_level_ops(lambda: per_size(routing, ids, n, sizes)))
        b = (best_us(lambda: routing.route_fused(ids, n, sizes)), top_level_ops(lambda: routing.route_fused(ids, n, sizes)))
        print(f"{n:8d} {1 << log2:8d} | {a[0]:11.0f} {a[1]:4d} | {b[0]:8.0f} {b[1]:4d}")


if __name__ == "__main__":
    main()
