"""Where the bare training loop's window-to-window spread comes from, with no viewer at all.

    python -m benchmarks.tools.host_noise_probe --task octree,kilonerf

For each scene source (the web viewer cost tool's: the octree demo, KiloNeRF fine-tuning) it times short windows of
the bare loop in four settings one after the other: as it is, with Python's garbage collector frozen and off, with
the process on half of the machine's CPUs, and as it is again. If the spread came from the collector or from
threads moving between cores, one of the middle settings would narrow it; if the host's own speed changes in
stretches (another guest's load, clocks), every setting shows it and the first and last medians differ. Prints the
median, extremes and interquartile range over the median of each setting, and the process's CPU seconds per wall
second (below 1: the loop waited for something other than the CPU).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import tinn  # noqa: E402

TASKS = ("octree", "kilonerf")


def source_for(task: str, arch: str):
    from benchmarks.tools import web_viewer_scenes

    small = [] if arch == "cuda" else ["--small"]
    if task == "octree":
        return web_viewer_scenes.octree_source(small, arch, "out/host_noise_probe")[0]
    return web_viewer_scenes.kilonerf_source(small, arch, "out/host_noise_probe", "finetune", 300)[0]


def windows(source, label: str, task: str, n: int, seconds: float) -> dict:
    from benchmarks.tools.web_viewer_cost import plain_rate

    rates = [plain_rate(source, seconds, warm_steps=3)["rate"] for _ in range(n)]
    median = statistics.median(rates)
    q = statistics.quantiles(rates, n=4) if len(rates) > 1 else [median, median, median]
    print(f"{task} {label:>18}: median {median:6.1f} steps/s, min {min(rates):6.1f}, max {max(rates):6.1f}, "
          f"IQR/median {(q[2] - q[0]) / median:.3f}: " + " ".join(f"{r:.0f}" for r in rates), flush=True)
    return {"median": median, "rates": rates}


def probe(task: str, arch: str, n: int, seconds: float) -> dict:
    from benchmarks.tools.web_viewer_cost import plain_rate, sync

    source = source_for(task, arch)
    plain_rate(source, seconds)  # compiles, settles
    out = {"default": windows(source, "default", task, n, seconds)}
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        out["gc_off"] = windows(source, "gc frozen, off", task, n, seconds)
    finally:
        gc.enable()
        gc.unfreeze()
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[:max(2, len(cpus) // 2)])
    try:
        out["half_cpus"] = windows(source, "half of the CPUs", task, n, seconds)
    finally:
        os.sched_setaffinity(0, cpus)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < 3 * seconds:
        source.train_step()
    sync()
    out["cpu_per_wall"] = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    print(f"{task}: process CPU seconds per wall second {out['cpu_per_wall']:.2f}", flush=True)
    out["default_again"] = windows(source, "default again", task, n, seconds)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="octree,kilonerf", help="comma list of " + ", ".join(TASKS))
    p.add_argument("--windows", type=int, default=12, help="windows per setting")
    p.add_argument("--seconds", type=float, default=1.5, help="seconds per window")
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    if not tasks or any(t not in TASKS for t in tasks):
        p.error(f"--task {args.task!r}: allowed: a comma list of {', '.join(TASKS)}")
    if args.windows < 1 or args.seconds <= 0:
        p.error("--windows must be >= 1 and --seconds > 0")
    arch = tinn.init(args.arch)
    return {task: probe(task, arch, args.windows, args.seconds) for task in tasks}


if __name__ == "__main__":
    main()
