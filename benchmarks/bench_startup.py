"""Start-up time of the image demo: seconds from process start to each phase, cold and warm kernel cache.

    python -m benchmarks.bench_startup                                   # CPU or CUDA (auto), config_hash.json
    python -m benchmarks.bench_startup --arch cuda --json out.json
    python -m benchmarks.bench_startup --runs cold,warm,warm --cache-dir /tmp/ticache

Each run is a fresh Python process that does what demos/mlp_learning_an_image.py does before and during
its first steps: import torch, tinn and the kernel language, tinn.init, build the image task and the
trainer from the config, train (each step's batch drawn by the task), then render the image once
(inference). "cold" runs start from an empty Taichi offline-cache directory (a new temporary one unless
--cache-dir is given); every later run reuses the same directory, so "warm" is the second process.

Phase times are wall seconds since the parent launched the child (interpreter start included), with a
device sync after the steps. The child also counts the kernel instances it builds: Taichi turns each
(kernel, template arguments) pair into IR in Python (`materialize`) and then compiles it, or loads it from
the offline cache, at its first launch; both are timed per instance. "new cache files" counts files the
run added to the cache directory: kernels compiled rather than loaded.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
PHASES = ("python", "import torch", "import tinn", "import taichi", "tinn.init", "task + trainer",
          "first step", "step N", "first inference")


def _cache_files(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


# ---- child: one process, one measurement ------------------------------------------------------------------
def _instrument_kernels(ti, log: list) -> None:
    """Time Taichi's per-instance work: IR building (materialize) and compile-or-load at first launch."""
    from taichi.lang import kernel_impl  # quadrants has other internals: counting is skipped there

    materialize, launch = kernel_impl.Kernel.materialize, kernel_impl.Kernel.launch_kernel
    launched = set()

    def timed_materialize(self, key=None, args=None, arg_features=None):
        k = key if key is not None else (self.func, 0, self.autodiff_mode)
        fresh = k not in self.compiled_kernels
        t0 = time.perf_counter()
        materialize(self, key, args, arg_features)
        if fresh:
            log.append({"kernel": f"{self.func.__module__}.{self.func.__name__}",
                        "mode": str(self.autodiff_mode).split(".")[-1], "ir_s": time.perf_counter() - t0,
                        "first_launch_s": None, "_id": id(self.compiled_kernels[k])})

    def timed_launch(self, t_kernel, *args):
        if id(t_kernel) in launched:
            return launch(self, t_kernel, *args)
        launched.add(id(t_kernel))
        t0 = time.perf_counter()
        out = launch(self, t_kernel, *args)
        for entry in reversed(log):
            if entry["_id"] == id(t_kernel):
                entry["first_launch_s"] = time.perf_counter() - t0
                break
        return out

    kernel_impl.Kernel.materialize = timed_materialize
    kernel_impl.Kernel.launch_kernel = timed_launch


def child(args) -> None:
    t_start = float(os.environ["TINN_BENCH_T0"])
    marks = {"python": time.time() - t_start}

    def mark(name):
        marks[name] = time.time() - t_start

    import torch  # noqa: F401
    mark("import torch")
    import tinn
    mark("import tinn")
    ti = tinn.backend.load()
    mark("import taichi")
    kernels: list = []
    if args.count_kernels and tinn.backend.name() == "taichi":
        _instrument_kernels(ti, kernels)
    arch = tinn.init(args.arch, offline_cache_file_path=args.cache_dir)
    mark("tinn.init")
    from tinn.tasks.image import ImageTask, default_image
    from tinn.trainer import Trainer

    config = tinn.load_config(args.config)
    task = ImageTask(default_image(args.size), tiles=args.tiles, seed=1337)
    trainer = Trainer.from_config(config, 2, 3, n_networks=task.n_networks, seed=1337)
    mark("task + trainer")
    batch = args.batch or (1 << 18 if arch == "cuda" else 1 << 13)
    n_kernels = {}
    for step in range(1, args.steps + 1):
        x, target, ids = task.batch(batch)
        with tinn.checks.disabled():  # as the demo: the task makes its own batches
            loss = trainer.training_step(x, target, ids)
        if step == 1:
            float(loss)
            tinn.runtime.sync()
            mark("first step")
            n_kernels["first step"] = len(kernels)
    tinn.runtime.sync()
    mark("step N")
    n_kernels["step N"] = len(kernels)
    with trainer.inference_weights():
        prediction = task.render(trainer.model)
    float(prediction.sum())
    tinn.runtime.sync()
    mark("first inference")
    n_kernels["first inference"] = len(kernels)
    for entry in kernels:
        entry.pop("_id")
    json.dump({"arch": arch, "backend": tinn.backend.name(), "batch": batch, "marks": marks,
               "kernel_counts": n_kernels, "kernels": kernels, "loss": float(loss)}, sys.stdout)


# ---- parent -----------------------------------------------------------------------------------------------
def run_child(args, cache_dir: str, label: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_startup", "--child", "--config", args.config, "--steps", str(args.steps),
           "--size", str(args.size), "--tiles", str(args.tiles), "--cache-dir", cache_dir]
    if args.arch:
        cmd += ["--arch", args.arch]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    if not args.count_kernels:
        cmd += ["--no-count-kernels"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    before = _cache_files(cache_dir)
    env["TINN_BENCH_T0"] = repr(time.time())
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{label} run failed (exit {proc.returncode})")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["run"] = label
    result["new_cache_files"] = _cache_files(cache_dir) - before
    return result


def summarise(result: dict) -> dict:
    row = {"run": result["run"], **{p: result["marks"].get(p) for p in PHASES}}
    row["kernels"] = result["kernel_counts"].get("first inference")
    row["kernels_step1"] = result["kernel_counts"].get("first step")
    row["new_cache_files"] = result["new_cache_files"]
    ks = result["kernels"]
    row["ir_s"] = sum(k["ir_s"] for k in ks)
    row["first_launch_s"] = sum(k["first_launch_s"] or 0.0 for k in ks)
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "tinn", "configs", "config_hash.json"))
    p.add_argument("--arch", default=None, help="cpu, cuda or auto (default: TINN_ARCH or auto)")
    p.add_argument("--steps", type=int, default=10, help="N: the step whose end is reported as 'step N'")
    p.add_argument("--batch", type=int, default=None, help="samples per step (default: the demo's, 2^18 GPU / 2^13 CPU)")
    p.add_argument("--size", type=int, default=256, help="side of the embedded image")
    p.add_argument("--tiles", type=int, default=1)
    p.add_argument("--runs", default="cold,warm", help="comma-separated labels; the first uses the cache as "
                   "found (empty: a new temporary directory), the rest reuse it")
    p.add_argument("--cache-dir", default=None, help="Taichi offline-cache directory (default: a new temporary one)")
    p.add_argument("--json", default=None, help="write every run (phases and per-kernel times) here")
    p.add_argument("--kernels", action="store_true", help="also print each run's kernel instances")
    p.add_argument("--no-count-kernels", dest="count_kernels", action="store_false")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return

    tmp = None
    if args.cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tinn_ticache_")
        args.cache_dir = tmp.name
    results = [run_child(args, args.cache_dir, label) for label in args.runs.split(",")]
    rows = [summarise(r) for r in results]
    r0 = results[0]
    print(f"start-up, {os.path.basename(args.config)}, arch {r0['arch']} ({r0['backend']}), batch {r0['batch']}, "
          f"N = {args.steps}; seconds since process start")
    from benchmarks.common import print_table  # noqa: E402  (imports tinn and torch: only after the children ran)

    print_table(rows, [("run", "run", "s")] + [(ph, ph, ".2f") for ph in PHASES] +
                [("kernels_step1", "kernels (1st step)", "d"), ("kernels", "kernels (all)", "d"),
                 ("new_cache_files", "new cache files", "d"), ("ir_s", "IR s", ".2f"),
                 ("first_launch_s", "compile/load s", ".2f")])
    if args.kernels:
        for r in results:
            print(f"\n{r['run']}: kernel instances in build order (IR s, first launch s)")
            for k in r["kernels"]:
                fl = "-" if k["first_launch_s"] is None else f"{k['first_launch_s']:.3f}"
                print(f"  {k['ir_s']:.3f} {fl:>7}  {k['kernel']} [{k['mode']}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": os.path.relpath(args.config, ROOT), "steps": args.steps, "runs": results,
                       "rows": rows}, f, indent=1)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
