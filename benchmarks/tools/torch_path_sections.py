"""Host time of tcnn's sample loop through `tinn.torch`, by section, next to torch's own autograd cost.

Wall time inside selected functions, no syncs inside a block of steps (the GPU runs behind), so each
figure is what that code costs the Python threads per step. Inclusive: an outer section contains its inner
ones. torch runs a CUDA backward on its own device thread: the sections under `loss.backward` run there.
For scale it also times autograd alone: a backward through one torch op, and through a Python
`autograd.Function` that does nothing. The torch path is also timed with
`torch.autograd.set_multithreading_enabled(False)` (the backward on the calling thread). Whole steps (both paths) are also timed under `--variant` settings,
in alternating rounds in the same process.

    python -m benchmarks.tools.torch_path_sections [--log2-batch 18] [--steps 200] [--variant name=value] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402

import tinn  # noqa: E402
from benchmarks.bench_torch_path import ImageSteps, on_calling_thread, relative_l2, torch_adam  # noqa: E402
from benchmarks.common import Sections, settings_installed  # noqa: E402


class _Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g):
        return g


def per_step(fn, steps: int, sync) -> float:
    """Host microseconds per call, median of five blocks."""
    times = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for i in range(steps):
            fn()
            if i % 8 == 7:
                sync()
        times.append((time.perf_counter() - t0) / steps)
    times.sort()
    return 1e6 * times[2]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None)
    p.add_argument("--config", default=os.path.join(HERE, "..", "..", "tinn", "configs", "config_hash.json"))
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", action="append", default=[],
                   help="settings to time the whole steps under as well, in TINN_SETTINGS form (repeatable)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    with tinn.checks.disabled():
        from tinn import models, networks, part
        from tinn.encodings import grid
        sync = tinn.runtime.sync
        dev = tinn.runtime.device()
        sections = Sections()

        # autograd alone
        w = torch.randn(1 << 16, device=dev, requires_grad=True)
        plain = per_step(lambda: (w * 2).sum().backward(), args.steps, sync)
        nothing = per_step(lambda: _Nothing.apply(w).sum().backward(), args.steps, sync)
        plain_here = per_step(on_calling_thread(lambda: (w * 2).sum().backward()), args.steps, sync)

        config = tinn.load_config(args.config)
        image = ImageSteps(config, args.log2_batch)
        optimizer = torch_adam(image.model.parameters(), config.get("optimizer", {}))
        step = image.torch_loop(optimizer, sections.timed("relative_l2 (torch ops)", relative_l2),
                                backward=sections.timed("loss.backward", torch.Tensor.backward),
                                step=sections.timed("optimizer.step", optimizer.step))

        # tinn's own autograd-driven step (Trainer.optimize, as the scene trainers use it) on the same objective
        objective_model = image.tcnn_model()
        objective_trainer = tinn.Trainer(objective_model, None, config.get("optimizer", {}))

        def optimize():
            x, t, _ = image.next_batch()
            objective_trainer.optimize(lambda: relative_l2(objective_model(x), t))

        rows = [{"section": "autograd: backward through one torch op", "us": plain},
                {"section": "autograd: backward through a no-op Python Function", "us": nothing},
                {"section": "autograd: backward through one torch op, on the calling thread", "us": plain_here}]
        # Whole steps under the process's settings and under each --variant, in alternating rounds (a host's
        # speed drifts within a process too), medians of the rounds.
        base = tinn.settings.installed()
        variants = {"": base}
        for text in args.variant:
            variants[text] = base.replace(**tinn.settings.parse(text))
        timings = collections.defaultdict(list)
        for _ in range(args.rounds):
            for label, chosen in variants.items():
                with settings_installed(chosen):
                    for path, fn in (("Trainer step", image.native), ("torch path step", step),
                                     ("torch path step, backward on the calling thread", on_calling_thread(step)),
                                     ("Trainer.optimize on that objective", optimize)):
                        for _ in range(10):
                            fn()
                        timings[(path, label)].append(per_step(fn, args.steps, sync))
        for (path, label), values in timings.items():
            rows.append({"section": f"{path}{f' [{label}]' if label else ''} (unwrapped)",
                         "us": statistics.median(values)})

        sections.wrap(part.Part, "forward", "Part.forward (module call)")
        sections.wrap(part._PartFunction, "forward", "_PartFunction.forward")
        sections.wrap(part._PartFunction, "backward", "_PartFunction.backward")
        sections.wrap(models.NetworkWithInputEncoding, "forward_with_context")
        sections.wrap(models.NetworkWithInputEncoding, "backward")
        sections.wrap(networks.NetworkArray, "forward_with_context")
        sections.wrap(networks.NetworkArray, "backward")
        sections.wrap(networks.NetworkArray, "_gemm_weight_gradients")
        sections.wrap(grid.GridEncoding, "forward_with_context")
        sections.wrap(grid.GridEncoding, "backward")
        sections.wrap_launches()
        for _ in range(3):
            step()
        sync()
        sections.clear()
        timed_step = sections.timed("step", step)
        for i in range(args.steps):
            timed_step()
            if i % 8 == 7:
                sync()
        sync()
        rows += sections.rows(args.steps)
        print(f"torch path host sections, {arch}, {os.path.basename(args.config)}, batch 2^{args.log2_batch}"
              + (f", {torch.cuda.get_device_name(0)}" if arch == "cuda" else ""))
        print(f"{'section':56s} {'calls/step':>10s} {'us/step':>9s}")
        for r in rows:
            c = f"{r['calls']:10.1f}" if "calls" in r else " " * 10
            print(f"{r['section']:56s} {c} {r['us']:9.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"arch": arch, "log2_batch": args.log2_batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
