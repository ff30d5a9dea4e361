"""Adam's update against the memory it moves: device time of `optimizer.step()` per table size, and the bandwidth
that time implies.

    python -m benchmarks.tools.adam_bandwidth [--entries 1e6,1.07e7,1.6e8] [--steps 50] [--json out.json]

Each case is one hash-grid table (rows of 2 features, zero gradients skipped, so every entry keeps its own step
count, as tinn's grids do) and one network table of 7,168 values a row (an MLP 32-64-64-16) with one shared count,
stepped together as a Trainer steps an encoding and its network. About a tenth of the grid's entries get a zero
gradient each step. Bytes per grid entry: the gradient read, the weight and both moments read and written, the
step count read and written (36 B); the rate's row scale is shared by a row. Device time comes from CUDA events
around the steps; on the CPU it is wall time.
"""
from __future__ import annotations

import argparse
import json

import torch

GRID_BYTES = 4 + 3 * 8 + 8   # gradient; weight, m, v read and written; step count read and written
NETWORK_BYTES = 4 + 3 * 8    # one shared count


def measure(entries: int, steps: int, device: torch.device) -> dict:
    from tinn.optimizers import create_optimizer
    rows = max(1, entries // 2)
    grid = torch.nn.Parameter(torch.randn(rows, 2, device=device) * 1e-2)
    network = torch.nn.Parameter(torch.randn(16, 7168, device=device) * 1e-2)
    named = [("encoding.params", grid), ("network.params", network)]
    opt = create_optimizer({"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99,
                            "epsilon": 1e-15}, named)
    g = torch.Generator(device=device).manual_seed(0)
    grid.grad = torch.randn(rows, 2, device=device, generator=g)
    grid.grad[torch.rand(rows, 2, device=device, generator=g) < 0.1] = 0.0
    network.grad = torch.randn(16, 7168, device=device, generator=g)
    for _ in range(3):
        opt.step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    else:
        import time
        t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    if cuda:
        end.record()
        torch.cuda.synchronize(device)
        ms = start.elapsed_time(end) / steps
    else:
        ms = (time.perf_counter() - t0) * 1e3 / steps
    moved = grid.numel() * GRID_BYTES + network.numel() * NETWORK_BYTES
    return {"entries": grid.numel(), "ms": ms, "bytes": moved, "gb_per_s": moved / ms / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", default="1e6,1.07e7,1.6e8", help="grid entries per case, comma-separated")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import tinn
    tinn.init()
    device = tinn.runtime.device()
    results = [measure(int(float(e)), args.steps, device) for e in args.entries.split(",")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"Adam on {name}: grid entries (own step counts) + a 16 x 7168 network table, {args.steps} steps")
    print("| grid entries | ms a step | MB moved | GB/s |")
    print("| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['entries']:,} | {r['ms']:.3f} | {r['bytes'] / 1e6:.0f} | {r['gb_per_s']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "steps": args.steps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
