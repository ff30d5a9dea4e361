"""A step's bookkeeping kernels (Adam, the gradient scaler) on both launch paths side by side in one process
(`tuning.triton_step_kernels`: Taichi's kernels, Triton launches), alternating in rounds because a host's speed
drifts within a process and differs between processes.

    python -m benchmarks.tools.triton_step_kernels [--rounds 4] [--steps 100] [--json out.json]

Cases: tcnn's image step (`config_hash.json`, 2^18 samples) in float32, float16 (with the gradient scaler) and
bfloat16, and an array of 4096 MLPs (32 -> 2 x 64 -> 16, float16 on the tensor cores with the scaler) on 2^22
samples. Per case and path: the step's wall time (steps issued back to back), its host time alone,
`optimizer.step()`'s own host time, and Adam's device time (torch.profiler). CUDA only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import tinn  # noqa: E402
from benchmarks.common import cuda_kernels, host_ms_per_step, pipelined_ms, print_table, sync, write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PATHS = (("taichi", False), ("triton", True))


def image_case(precision: str):
    from tinn.tasks.image import ImageTask, default_image
    from tinn.trainer import Trainer
    tinn.settings.install(tinn.settings.installed().replace(precision=precision))
    task = ImageTask(default_image(256))
    trainer = Trainer.from_config(tinn.load_config(os.path.join(HERE, "..", "..", "tinn", "configs",
                                                                "config_hash.json")), 2, 3)
    batches = [task.batch(1 << 18) for _ in range(4)]
    return trainer, batches


def array_case():
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer
    tinn.settings.install(tinn.settings.installed().replace(precision="auto"))
    n, batch = 4096, 1 << 22
    dev = tinn.runtime.device()
    trainer = Trainer(NetworkArray(32, 16, {"n_neurons": 64, "n_hidden_layers": 2}, n_networks=n), {"otype": "L2"},
                      {"otype": "Adam"})
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(batch, 32, device=dev, generator=gen)
    y = torch.rand(batch, 16, device=dev, generator=gen)
    ids = (torch.arange(batch, device=dev) % n).to(torch.int32)
    return trainer, [(x, y, ids)]


def optimizer_kernel_ms(step) -> float:
    """Device ms per step of the kernels whose names say Adam (Taichi's `adam_step*`, Triton's `adam_kernel`)."""
    return sum(k["ms"] for k in cuda_kernels(step, 10) if "adam" in k["kernel"].lower())


def optimizer_host_us(trainer, n: int = 200) -> float:
    """Host us of `optimizer.step()` alone, on the gradients the last step left."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        trainer.optimizer.step()
    t1 = time.perf_counter()
    sync()
    return (t1 - t0) / n * 1e6


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("triton_step_kernels needs CUDA (the Triton path's default and torch.profiler's CUDA trace)")
    base = tinn.settings.installed()
    cases = {"image float32": lambda: image_case("float32"), "image float16": lambda: image_case("float16"),
             "image bfloat16": lambda: image_case("bfloat16"), "array 4096 x 64": array_case}
    rows = []
    for label, build in cases.items():
        trainer, batches = build()
        counter = iter(range(1 << 30))

        def step():
            trainer.training_step(*batches[next(counter) % len(batches)])

        measured = {name: {"wall": [], "host": [], "opt": []} for name, _ in PATHS}
        with tinn.checks.disabled():
            for name, flag in PATHS:  # compile both paths before timing
                tinn.settings.install(tinn.settings.installed().replace(triton_step_kernels=flag))
                for _ in range(5):
                    step()
            for _ in range(args.rounds):
                for name, flag in PATHS:
                    tinn.settings.install(tinn.settings.installed().replace(triton_step_kernels=flag))
                    measured[name]["wall"].append(pipelined_ms(step, args.steps))
                    measured[name]["host"].append(host_ms_per_step(step))
                    measured[name]["opt"].append(optimizer_host_us(trainer))
            for name, flag in PATHS:
                tinn.settings.install(tinn.settings.installed().replace(triton_step_kernels=flag))
                rows.append({"case": label, "path": name,
                             "wall_ms": statistics.median(measured[name]["wall"]),
                             "wall_spread_ms": [min(measured[name]["wall"]), max(measured[name]["wall"])],
                             "host_ms": statistics.median(measured[name]["host"]),
                             "optimizer_host_us": statistics.median(measured[name]["opt"]),
                             "optimizer_device_ms": optimizer_kernel_ms(step)})
        tinn.settings.install(base)
    print_table(rows, [("case", "case", "s"), ("path", "launches", "s"), ("wall_ms", "step ms", ".3f"),
                       ("host_ms", "host ms", ".3f"), ("optimizer_host_us", "optimizer.step() host us", ".1f"),
                       ("optimizer_device_ms", "Adam device ms", ".3f")])
    payload = {"device": torch.cuda.get_device_name(), "rounds": args.rounds, "steps": args.steps, "rows": rows}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
