"""The image step's single network computed different ways, side by side in one process.

Each variant is a settings change (`name=value[,name=value]`, as TINN_SETTINGS takes it) plus, with the
extra key `tf32=true`, torch's TF32 matmuls switched on while that variant runs. Per variant, in
alternating rounds (a host's speed drifts within a process): the Trainer step's wall time (steps issued
back to back, one sync per block) and its host time alone; the `tinn.torch` loop's wall time (tcnn's
sample: torch's relative L2, `torch.optim.Adam`, backward on the calling thread); then the step's GPU
kernels (torch.profiler) and the PSNR while training from the same seed on the same batches
(`--quality-runs` runs each: float atomics make runs differ).

    python -m benchmarks.tools.image_paths --variant "dense_single_network=true" \
        --variant "dense_single_network=true,tf32=true" [--log2-batch 18] [--train-steps 1000] [--json F]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402

import tinn  # noqa: E402
from benchmarks.bench_torch_path import ImageSteps, on_calling_thread, torch_adam  # noqa: E402
from benchmarks.common import (cuda_kernels, host_ms_per_step, mlp_path, pipelined_ms, print_table,  # noqa: E402
                               settings_installed, sync, tf32_matmuls, write_json)


def split_variant(text: str) -> tuple[dict, bool]:
    """(settings changes, tf32) of one --variant."""
    changes, tf32 = {}, False
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name.strip() == "tf32":
            tf32 = value.strip().lower() in ("1", "true", "yes", "on")
        else:
            changes.update(tinn.settings.parse(item))
    return changes, tf32


class Variant:
    def __init__(self, label: str, settings, tf32: bool, config: dict, log2_batch: int):
        self.label, self.settings, self.tf32 = label, settings, tf32
        with self.active():
            self.steps = ImageSteps(config, log2_batch)
            opt_cfg = config.get("optimizer", {})
            self.optimizer = torch_adam(self.steps.model.parameters(), opt_cfg)
            self.torch_step = on_calling_thread(self.steps.torch_loop(self.optimizer))
            self.kind = mlp_path(self.steps.trainer.model.network)

    @contextlib.contextmanager
    def active(self):
        with settings_installed(self.settings), tf32_matmuls(self.tf32):
            yield


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(HERE, "..", "..", "tinn", "configs", "config_hash.json"))
    p.add_argument("--width", type=int, default=0, help="the network's width instead of the config's")
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=100, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-steps", type=int, default=1000, help="steps of the PSNR comparison")
    p.add_argument("--quality-runs", type=int, default=1, help="training runs per variant for the PSNR")
    p.add_argument("--variant", action="append", default=[])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    arch = tinn.init()
    config = tinn.load_config(args.config)
    if args.width:
        config = dict(config, network=dict(config["network"], n_neurons=args.width))
    base = tinn.settings.installed()
    variants = [Variant("default", base, False, config, args.log2_batch)]
    for text in args.variant:
        changes, tf32 = split_variant(text)
        variants.append(Variant(text, base.replace(**changes), tf32, config, args.log2_batch))
    for v in variants:  # compile and warm up
        with v.active():
            for _ in range(5):
                v.steps.native()
                v.torch_step()
    sync()

    timings = collections.defaultdict(list)
    with tinn.checks.disabled():
        for _ in range(args.rounds):
            for v in variants:
                with v.active():
                    timings[(v.label, "trainer")].append(pipelined_ms(v.steps.native, args.steps))
                    timings[(v.label, "host")].append(host_ms_per_step(v.steps.native))
                    timings[(v.label, "torch")].append(pipelined_ms(v.torch_step, args.steps))
        kernels = {}
        if arch == "cuda":
            for v in variants:
                with v.active():
                    kernels[v.label] = cuda_kernels(v.steps.native)

    from tinn.tasks.image import ImageTask, default_image
    quality, curves = {}, {}
    marks = sorted({args.train_steps * k // 4 for k in range(1, 5)})
    for v in variants:  # the same seed and batches for each run; float atomics make runs differ slightly
        for run in range(args.quality_runs):
            with v.active():
                task = ImageTask(default_image(256), seed=0)
                trainer = tinn.Trainer.from_config(config, 2, 3, seed=7)
                curve = []
                for step in range(1, args.train_steps + 1):
                    trainer.training_step(*task.batch(1 << args.log2_batch)[:2])
                    if step in marks:
                        with torch.no_grad():
                            curve.append(task.psnr(task.render(trainer.model)))
            curves.setdefault(v.label, []).append(curve)
        quality[v.label] = statistics.median(c[-1] for c in curves[v.label])

    rows = []
    for v in variants:
        trainer_ms = statistics.median(timings[(v.label, "trainer")])
        torch_ms = statistics.median(timings[(v.label, "torch")])
        gpu = sum(r["ms"] for r in kernels[v.label]) if v.label in kernels else None
        rows.append({"variant": v.label, "path": v.kind, "trainer_ms": trainer_ms,
                     "host_ms": statistics.median(timings[(v.label, "host")]), "gpu_ms": gpu,
                     "torch_ms": torch_ms, "torch_x": torch_ms / trainer_ms, "psnr": quality[v.label]})
    for v in variants:
        print(f"\nkernels [{v.label}] ({v.kind}), ms per step")
        for r in kernels.get(v.label, [])[:14]:
            print(f"  {r['kernel']:60s} {r['calls']:5.1f} {r['ms']:7.3f}")
    print(f"\nPSNR (dB) after {marks} steps, per training run")
    for label, runs in curves.items():
        print(f"  {label:40s} " + " | ".join(" ".join(f"{p:.2f}" for p in c) for c in runs))
    print(f"\n{arch}, width {config['network']['n_neurons']}, batch 2^{args.log2_batch}, {args.rounds} rounds of {args.steps} steps, "
          f"PSNR after {args.train_steps} steps (median of {args.quality_runs} runs)")
    print_table(rows, [("variant", "variant", "s"), ("path", "MLP", "s"), ("trainer_ms", "Trainer ms", ".3f"),
                       ("host_ms", "host ms", ".3f"), ("gpu_ms", "GPU ms", ".3f"), ("torch_ms", "tinn.torch ms", ".3f"),
                       ("torch_x", "x Trainer", ".2f"), ("psnr", "PSNR dB", ".2f")])
    write_json(args.json, {"arch": arch, "log2_batch": args.log2_batch, "rows": rows, "kernels": kernels,
                           "psnr_curves": {"steps": marks, "runs": curves},
                           "rounds": {f"{k[0]}|{k[1]}": v for k, v in timings.items()}})


if __name__ == "__main__":
    main()
