"""Where the time of one image-learning training step goes (tcnn's mlp_learning_an_image setup).

    python -m benchmarks.profile_image [--config tinn/configs/config_hash.json] [--log2-batch 18] [--steps 200]

Prints the steady-state milliseconds per step (wall clock, with and without the input checks' sync) and a
table of GPU kernels (Taichi and torch alike, from torch.profiler's CUDA trace)
sorted by total time, so the slowest pieces of the step are named.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

import tinn  # noqa: E402
from benchmarks.common import host_ms_per_step, host_profile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(HERE, "..", "tinn", "configs", "config_hash.json"))
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    arch = tinn.init()
    from tinn.tasks.image import ImageTask, default_image
    from tinn.trainer import Trainer

    task = ImageTask(default_image(256))
    trainer = Trainer.from_config(tinn.load_config(args.config), 2, 3)
    batch = 1 << args.log2_batch
    for _ in range(5):  # compile and warm up
        trainer.training_step(*task.batch(batch))
    tinn.runtime.sync()
    timings = {}
    for label, checked in (("checks on", True), ("checks off", False)):
        with tinn.checks.disabled(not checked):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                loss = trainer.training_step(*task.batch(batch))
            float(loss)
            tinn.runtime.sync()
            timings[label] = (time.perf_counter() - t0) * 1e3 / args.steps
            print(f"{arch}: batch 2^{args.log2_batch}, {label}: {timings[label]:.3f} ms/step "
                  f"({timings[label]:.2f} s per 1000 steps)")
    with tinn.checks.disabled():  # the host time and the profile as the demo's training loop runs
        ms_step = timings["checks off"]  # as the demo's training loop runs
        timings["host only"] = host_ms_per_step(lambda: trainer.training_step(*task.batch(batch)))
        print(f"host side alone: {timings['host only']:.3f} ms/step")

        rows = []
        if arch == "cuda":
            host = host_profile(lambda: trainer.training_step(*task.batch(batch)), 20, 25)
            timings["waiting_calls"] = host["waiting_calls"]
            from torch.profiler import ProfilerActivity, profile
            n = 10
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    trainer.training_step(*task.batch(batch))
                tinn.runtime.sync()
            events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            for e in sorted(events, key=lambda e: -e.device_time_total):
                rows.append({"kernel": e.key[:70], "calls_per_step": e.count / n,
                             "ms_per_step": e.device_time_total / 1e3 / n})
            gpu_ms = sum(r["ms_per_step"] for r in rows)
            print(f"GPU busy {gpu_ms:.3f} ms of {ms_step:.3f} ms per step")
            print(f"{'kernel':70s} {'calls':>6s} {'ms/step':>8s}")
            for r in rows[:25]:
                print(f"{r['kernel']:70s} {r['calls_per_step']:6.1f} {r['ms_per_step']:8.3f}")
            cpu = sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:12]
            print("host side (top by CPU time):")
            for e in cpu:
                print(f"  {e.key[:60]:60s} {e.count / n:6.1f} {e.cpu_time_total / 1e3 / n:8.3f} ms/step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": arch, "log2_batch": args.log2_batch, "ms_per_step": timings, "kernels": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
