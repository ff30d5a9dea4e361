"""Quadrants' CUDA graphs on the image-learning step (config_hash.json, batch 2^18, checks off).

    python -m benchmarks.quadrants_graph_step --graph off|multi|all [--steps 300] [--json out.json]

Quadrants captures the top-level loops of a kernel declared `@kernel(graph=True)` into one CUDA graph
on its first launch and replays it afterwards (new arguments are patched in, no re-capture); a graph
spans one kernel, not a sequence of kernels, and non-CUDA backends ignore the flag. tinn's kernels
are defined when its modules are imported, so the mode is a process-wide choice made here before the
first tinn kernel module is imported, by wrapping the backend's `kernel` decorator:

    off    no graphs (the reference)
    multi  graph=True on kernels with two or more top-level loops (one launch instead of several)
    all    graph=True on every kernel (one-loop kernels too: graph launch instead of kernel launch)

Prints and writes per-step times: wall clock, the host side alone (steps enqueued right after a
sync), and on CUDA the GPU's own per-step time from events, plus which kernels got graph=True.
Run each mode in its own process (benchmarks/backend_compare.py does).
"""
import argparse
import ast
import functools
import inspect
import os
import statistics
import sys
import textwrap
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
import tinn  # noqa: E402
from benchmarks.common import host_ms_per_step, write_json  # noqa: E402

GRAPHED: list = []


def top_level_loops(fn) -> int:
    """Top-level `for` loops of a kernel body (also those inside a top-level `if`, e.g. `if ti.static(...)`):
    each is one offloaded task, i.e. one GPU launch without a graph."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
        return 1
    count = 0
    for node in body:
        if isinstance(node, ast.For):
            count += 1
        elif isinstance(node, ast.If):
            count += sum(isinstance(n, ast.For) for n in node.body + node.orelse)
    return count


def install_graph_mode(mode: str) -> None:
    """Wrap the backend's kernel decorator so tinn's kernels, defined after this, get graph=True per `mode`."""
    ti = tinn.backend.ti
    original = ti.kernel
    if "graph" not in inspect.signature(original).parameters:
        sys.exit(f"{tinn.backend.name()} {tinn.backend.version()}: its kernel decorator takes no graph= argument")

    def kernel(fn=None, **kwargs):
        if fn is None:  # @ti.kernel(...)
            return lambda f: kernel(f, **kwargs)
        loops = top_level_loops(fn)
        if mode == "all" or (mode == "multi" and loops >= 2):
            kwargs.setdefault("graph", True)
            GRAPHED.append(f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__} ({loops} loops)")
        return original(fn, **kwargs)

    functools.update_wrapper(kernel, original)
    ti.kernel = kernel


def quantiles(v):
    s = sorted(v)
    return {"p10": s[int(0.1 * (len(s) - 1))], "p50": s[int(0.5 * (len(s) - 1))], "p90": s[int(0.9 * (len(s) - 1))],
            "mean": statistics.mean(s)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--graph", choices=["off", "multi", "all"], default="off")
    p.add_argument("--config", default=os.path.join(HERE, "..", "tinn", "configs", "config_hash.json"))
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    arch = tinn.init()
    if tinn.runtime.backend_name() != "quadrants":
        sys.exit("quadrants_graph_step.py measures Quadrants' graphs: run it with TINN_BACKEND=quadrants")
    if args.graph != "off":
        install_graph_mode(args.graph)
    from tinn.tasks.image import ImageTask, default_image  # the first kernel definitions happen here
    from tinn.trainer import Trainer

    task = ImageTask(default_image(256))
    trainer = Trainer.from_config(tinn.load_config(args.config), 2, 3)
    batch = 1 << args.log2_batch
    with tinn.checks.disabled():
        first = time.perf_counter()
        for _ in range(args.warmup):  # compiles, then captures the graphs on their first launches
            loss0 = trainer.training_step(*task.batch(batch))
        tinn.runtime.sync()
        warmup_s = time.perf_counter() - first

        cuda = arch == "cuda"
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)] if cuda else []
        host = []
        tinn.runtime.sync()
        for i in range(args.steps):
            if cuda:
                events[i].record()
            host.append(time.perf_counter())
            loss = trainer.training_step(*task.batch(batch))
        if cuda:
            events[args.steps].record()
        host.append(time.perf_counter())
        tinn.runtime.sync()
        wall_ms = (time.perf_counter() - host[0]) * 1e3 / args.steps

        host_only = host_ms_per_step(lambda: trainer.training_step(*task.batch(batch)))

        result = {
            "backend": f"{tinn.backend.name()} {tinn.backend.version()}", "arch": arch, "graph": args.graph,
            "fast_launch": tinn.runtime.tuning().fast_launch, "log2_batch": args.log2_batch,
            "steps": args.steps, "warmup_s": warmup_s, "wall_ms_per_step": wall_ms, "host_only_ms_per_step": host_only,
            "host_ms_per_step": quantiles([(host[i + 1] - host[i]) * 1e3 for i in range(args.steps)]),
            "loss_first": float(loss0), "loss_last": float(loss), "graph_kernels": GRAPHED,
        }
        if cuda:
            result["gpu_ms_per_step"] = quantiles([events[i].elapsed_time(events[i + 1]) for i in range(args.steps)])
        print(f"{result['backend']} {arch} graph={args.graph}: wall {wall_ms:.3f} ms/step, host alone "
              f"{result['host_only_ms_per_step']:.3f} ms/step"
              + (f", GPU {result['gpu_ms_per_step']['p50']:.3f} ms/step (p50)" if cuda else "")
              + f"; loss {result['loss_first']:.4f} -> {result['loss_last']:.4f}")
        print(f"graph=True on {len(GRAPHED)} kernels: {', '.join(GRAPHED) or '-'}")
        write_json(args.json, result)
        return result


if __name__ == "__main__":
    main()
