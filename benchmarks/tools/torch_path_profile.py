"""Where the image step's time goes on the PyTorch path (tcnn's sample loop) against the native Trainer.

Same model and batches as `benchmarks/bench_torch_path.py` (config_hash.json, one network, 2^18 samples by
default). For each path it reports, per step: wall time over a synced block, host time (the Python that
issues a step, no sync inside the block), GPU time (CUDA events between consecutive steps), and then a
torch.profiler table of a few steps by device time (Taichi's kernels appear under their own names).

    python -m benchmarks.tools.torch_path_profile [--log2-batch 18] [--steps 50] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

import tinn  # noqa: E402
from benchmarks.bench_torch_path import ImageSteps, on_calling_thread, torch_adam  # noqa: E402


def timeline(step, steps: int) -> dict:
    """Per-step wall, host and GPU milliseconds (medians)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    host = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        starts[i].record()
        h = time.perf_counter()
        step()
        host.append(time.perf_counter() - h)
    starts[steps].record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
    gpu = [starts[i].elapsed_time(starts[i + 1]) for i in range(steps)]
    return {"wall_ms": 1e3 * wall, "host_ms": 1e3 * statistics.median(host), "gpu_ms": statistics.median(gpu)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(HERE, "..", "..", "tinn", "configs", "config_hash.json"))
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--out", default=None, help="directory for the profiler tables and JSON")
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("torch_path_profile.py times CUDA events: run it on a GPU")
    from torch.profiler import ProfilerActivity, profile

    config = tinn.load_config(args.config)
    with tinn.checks.disabled():
        image = ImageSteps(config, args.log2_batch)
        optimizer = torch_adam(image.model.parameters(), config.get("optimizer", {}))
        fused = torch_adam(image.model.parameters(), config.get("optimizer", {}), fused=True)
        tinn_loss = tinn.create_loss({"otype": "RelativeL2"})

        paths = {"native Trainer": image.native,
                 "tinn.torch + torch loss + Adam (foreach)": image.torch_loop(optimizer),
                 "  the same, backward on the calling thread": on_calling_thread(image.torch_loop(optimizer)),
                 "tinn.torch + tinn loss + Adam (foreach)": image.torch_loop(optimizer, tinn_loss),
                 "tinn.torch + tinn loss + Adam (fused)": image.torch_loop(fused, tinn_loss)}
        rows, tables = [], {}
        for name, step in paths.items():
            for _ in range(10):
                step()
            rows.append({"path": name, **timeline(step, args.steps)})
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            tables[name] = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25)
        for name, table in tables.items():
            print(f"\n== {name} (5 steps) ==\n{table}")
        print(f"\nimage step, {os.path.basename(args.config)}, batch 2^{args.log2_batch}, "
              f"{torch.cuda.get_device_name(0)}, medians over {args.steps} steps")
        print(f"{'path':44} | wall ms | host ms | GPU ms")
        for r in rows:
            print(f"{r['path']:44} | {r['wall_ms']:7.3f} | {r['host_ms']:7.3f} | {r['gpu_ms']:6.3f}")
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "torch_path_profile.json"), "w") as f:
                json.dump({"config": os.path.basename(args.config), "log2_batch": args.log2_batch,
                           "device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
            with open(os.path.join(args.out, "torch_path_profile_tables.txt"), "w") as f:
                for name, table in tables.items():
                    f.write(f"== {name} (5 steps) ==\n{table}\n")


if __name__ == "__main__":
    main()
