"""Every GPU kernel of an MLP-array training step, Taichi's and torch's alike, and what the routing sort costs.

    python -m benchmarks.tools.step_kernels [--cases 4096:64,64:64] [--log2-samples 22] [--json FILE]

Per case (NETWORKS:WIDTH; 32 in, 16 out, 2 hidden layers, even routing, L2 loss, Adam, input checks off):
the wall time per step, the GPU time per kernel from torch.profiler's CUDA trace (so the time outside the
MLP kernels is named too), and the sort of the network ids alone with int32 keys against the narrow keys
`tinn.routing.sort_keys` picks (CUDA events, median of 20).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import tinn  # noqa: E402
from benchmarks.common import gpu_ms  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="4096:64,64:64")
    p.add_argument("--log2-samples", type=int, default=22)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    arch = tinn.init()
    if arch != "cuda":
        sys.exit("step_kernels.py needs CUDA (torch.profiler's CUDA trace)")
    from torch.profiler import ProfilerActivity, profile

    from tinn import routing
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    batch = 1 << args.log2_samples
    results = []
    for case in args.cases.split(","):
        n, width = (int(v) for v in case.split(":"))
        net = NetworkArray(32, 16, {"n_neurons": width, "n_hidden_layers": 2}, n_networks=n)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam"})
        x, y = torch.rand(batch, 32, device=dev), torch.rand(batch, 16, device=dev)
        ids = torch.randint(0, n, (batch,), device=dev, dtype=torch.int32)
        with tinn.checks.disabled():
            for _ in range(3):
                trainer.training_step(x, y, ids)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                trainer.training_step(x, y, ids)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3 / args.steps
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.steps):
                    trainer.training_step(x, y, ids)
                torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = sorted(({"kernel": e.key[:80], "calls_per_step": e.count / args.steps,
                           "ms_per_step": e.device_time_total / 1e3 / args.steps} for e in events),
                         key=lambda r: -r["ms_per_step"])
        sort32 = gpu_ms(lambda: torch.sort(ids, stable=True))
        keys = routing.sort_keys(ids, n)
        sort_narrow = gpu_ms(lambda: torch.sort(routing.sort_keys(ids, n), stable=True))
        whole = gpu_ms(lambda: routing.sort_by_network(ids, n))
        busy = sum(k["ms_per_step"] for k in kernels)
        results.append({"networks": n, "width": width, "log2_samples": args.log2_samples, "wall_ms": wall,
                        "gpu_busy_ms": busy, "kernels": kernels, "sort_int32_ms": sort32,
                        "sort_keys": str(keys.dtype), "sort_narrow_ms": sort_narrow, "sort_by_network_ms": whole})
        print(f"== N={n} width={width} batch=2^{args.log2_samples}: wall {wall:.3f} ms/step, GPU busy {busy:.3f} ms")
        print(f"{'kernel':80s} {'calls':>6s} {'ms/step':>8s}")
        for k in kernels[:20]:
            print(f"{k['kernel']:80s} {k['calls_per_step']:6.1f} {k['ms_per_step']:8.3f}")
        print(f"sort of the ids: int32 keys {sort32:.3f} ms, {keys.dtype} keys {sort_narrow:.3f} ms "
              f"(with the cast); sort_by_network {whole:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
