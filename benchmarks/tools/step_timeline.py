"""Image training step (config_hash.json, batch 2^18, checks off) on a timeline: a CUDA event before
every step gives the GPU's per-step time, perf_counter the host's, and their difference how far the GPU
runs behind the host. Tells a GPU-bound loop (GPU intervals = wall) from a host-bound one (GPU waits)."""
import os
import statistics
import sys
import time

import torch

import tinn  # noqa: E402


def quantiles(v):
    s = sorted(v)
    return " ".join(f"{s[int(q * (len(s) - 1))]:.3f}" for q in (0.1, 0.5, 0.9)) + f" max {s[-1]:.3f}"


def main(steps=400, log2_batch=18):
    if tinn.init() != "cuda":
        sys.exit("step_timeline.py times CUDA events: run it on a GPU")
    from tinn.tasks.image import ImageTask, default_image
    from tinn.trainer import Trainer
    here = os.path.dirname(os.path.abspath(__file__))
    task = ImageTask(default_image(256))
    trainer = Trainer.from_config(tinn.load_config(os.path.join(here, "..", "..", "tinn", "configs", "config_hash.json")), 2, 3)
    batch = 1 << log2_batch
    with tinn.checks.disabled():
        for _ in range(20):
            trainer.training_step(*task.batch(batch))
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        host = []
        tinn.runtime.sync()
        for i in range(steps):
            events[i].record()
            host.append(time.perf_counter())
            trainer.training_step(*task.batch(batch))
        events[steps].record()
        host.append(time.perf_counter())
        tinn.runtime.sync()
        end = time.perf_counter()
        gpu = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
        cpu = [(host[i + 1] - host[i]) * 1e3 for i in range(steps)]
        behind = [events[0].elapsed_time(events[i]) - (host[i] - host[0]) * 1e3 for i in range(steps + 1)]
        print(f"wall {(end - host[0]) * 1e3 / steps:.3f} ms/step over {steps} steps")
        print(f"host per step  p10 p50 p90: {quantiles(cpu)}  mean {statistics.mean(cpu):.3f}")
        print(f"GPU per step   p10 p50 p90: {quantiles(gpu)}  mean {statistics.mean(gpu):.3f}")
        print("GPU behind host (ms) at steps " + " ".join(f"{i}:{behind[i]:.2f}" for i in
                                                         (1, 10, 50, 100, 200, 300, steps - 1)))


if __name__ == "__main__":
    main()
