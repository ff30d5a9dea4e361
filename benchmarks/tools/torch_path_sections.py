"""Host time of tcnn's sample loop through `tinn.torch`, by section, next to torch's own autograd cost.

Wall time inside selected functions, no syncs inside a block of steps (the GPU runs behind), so each
figure is what that code costs the Python threads per step. Inclusive: an outer section contains its inner
ones. torch runs a CUDA backward on its own device thread: the sections under `loss.backward` run there.
For scale it also times autograd alone: a backward through one torch op, and through a Python
`autograd.Function` that does nothing. The torch path is also timed with
`torch.autograd.set_multithreading_enabled(False)` (the backward on the calling thread). Whole steps (both paths) are also timed under `--variant` settings,
in alternating rounds in the same process.

    python benchmarks/tools/torch_path_sections.py [--log2-batch 18] [--steps 200] [--variant name=value] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402

import tinn  # noqa: E402
import tinn.torch as tcnn  # noqa: E402
from bench_torch_path import relative_l2, torch_adam  # noqa: E402

spent = collections.defaultdict(float)
calls = collections.Counter()


def timed(label, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t0
            calls[label] += 1
    return wrapper


def wrap(owner, name, label=None):
    setattr(owner, name, timed(label or f"{owner.__name__}.{name}", getattr(owner, name)))


class _Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g):
        return g


def on_calling_thread(fn):
    """`fn` with torch's autograd running the backward on the calling thread instead of its device thread."""
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return fn()
    return run


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
    p.add_argument("--config", default=os.path.join(HERE, "..", "..", "configs", "config_hash.json"))
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", action="append", default=[],
                   help="settings to time the whole steps under as well, in TINN_SETTINGS form (repeatable)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    tinn.checks.set_enabled(False)
    from tinn import models, networks, part
    from tinn.encodings import grid
    from tinn.kernels import launch
    from tinn.tasks.image import ImageTask, default_image
    sync = tinn.runtime.sync
    dev = tinn.runtime.device()

    # autograd alone
    w = torch.randn(1 << 16, device=dev, requires_grad=True)
    plain = per_step(lambda: (w * 2).sum().backward(), args.steps, sync)
    nothing = per_step(lambda: _Nothing.apply(w).sum().backward(), args.steps, sync)
    plain_here = per_step(on_calling_thread(lambda: (w * 2).sum().backward()), args.steps, sync)

    config = tinn.load_config(args.config)
    task = ImageTask(default_image(256), seed=0)
    batches = [task.batch(1 << args.log2_batch) for _ in range(4)]
    model = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], seed=1337)
    optimizer = torch_adam(model.parameters(), config.get("optimizer", {}))
    trainer = tinn.Trainer.from_config(config, 2, 3, seed=1337)
    state = {"i": 0}
    loss_fn = timed("relative_l2 (torch ops)", relative_l2)

    def step():
        state["i"] = (state["i"] + 1) % len(batches)
        x, t, _ = batches[state["i"]]
        y = model(x)
        loss = loss_fn(y, t)
        optimizer.zero_grad()
        timed("loss.backward", loss.backward)()
        timed("optimizer.step", optimizer.step)()

    # tinn's own autograd-driven step (Trainer.optimize, as the scene trainers use it) on the same objective
    objective_model = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], seed=1337)
    objective_trainer = tinn.Trainer(objective_model, None, config.get("optimizer", {}))

    def optimize():
        state["i"] = (state["i"] + 1) % len(batches)
        x, t, _ = batches[state["i"]]
        objective_trainer.optimize(lambda: relative_l2(objective_model(x), t))

    def native():
        state["i"] = (state["i"] + 1) % len(batches)
        x, t, _ = batches[state["i"]]
        trainer.training_step(x, t)

    rows = [{"section": "autograd: backward through one torch op", "us": plain},
            {"section": "autograd: backward through a no-op Python Function", "us": nothing},
            {"section": "autograd: backward through one torch op, on the calling thread", "us": plain_here}]
    # Whole steps under the process's settings and under each --variant, in alternating rounds (a host's
    # speed drifts within a process too), medians of the rounds.
    base = tinn.settings.current()
    variants = {"": base}
    for text in args.variant:
        variants[text] = dataclasses.replace(base, **tinn.settings.parse(text))
    timings = collections.defaultdict(list)
    for _ in range(args.rounds):
        for label, chosen in variants.items():
            tinn.settings.install(chosen)
            for path, fn in (("Trainer step", native), ("torch path step", step),
                             ("torch path step, backward on the calling thread", on_calling_thread(step)),
                             ("Trainer.optimize on that objective", optimize)):
                for _ in range(10):
                    fn()
                timings[(path, label)].append(per_step(fn, args.steps, sync))
    tinn.settings.install(base)
    for (path, label), values in timings.items():
        rows.append({"section": f"{path}{f' [{label}]' if label else ''} (unwrapped)", "us": statistics.median(values)})

    wrap(part.Part, "forward", "Part.forward (module call)")
    wrap(part._PartFunction, "forward", "_PartFunction.forward")
    wrap(part._PartFunction, "backward", "_PartFunction.backward")
    wrap(models.NetworkWithInputEncoding, "forward_ctx")
    wrap(models.NetworkWithInputEncoding, "backward")
    wrap(networks.NetworkArray, "forward_ctx")
    wrap(networks.NetworkArray, "backward")
    wrap(networks.NetworkArray, "_gemm_weight_gradients")
    wrap(grid.GridEncoding, "forward_ctx")
    wrap(grid.GridEncoding, "backward")
    orig = launch.FastKernel.__call__

    def kernel_call(self, *a):
        t0 = time.perf_counter()
        try:
            return orig(self, *a)
        finally:
            spent["launch " + self.__name__] += time.perf_counter() - t0
            calls["launch " + self.__name__] += 1

    launch.FastKernel.__call__ = kernel_call
    for _ in range(3):
        step()
    sync()
    spent.clear()
    calls.clear()
    n = args.steps
    for i in range(n):
        timed("step", step)()
        if i % 8 == 7:
            sync()
    sync()
    for label, t in sorted(spent.items(), key=lambda kv: -kv[1]):
        rows.append({"section": label, "calls": calls[label] / n, "us": 1e6 * t / n})
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
