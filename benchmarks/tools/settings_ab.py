"""Fused-kernel tunings side by side on one GPU: per-kernel times of MLP training steps and the image step.

    python -m benchmarks.tools.settings_ab --out DIR --settings "default;fused_backward_tile=64;..." \
        [--step-cases 4096:22:64,128] [--image] [--jobs 4]

Each entry of --settings is a TINN_SETTINGS value ("default" for none). Every variant compiles its own
kernel instances, so the variants first run once each, several processes at a time, at toy sizes (this
fills Taichi's offline cache); then each is measured alone: `profile_step.py` on the --step-cases
(NETWORKS:LOG2_SAMPLES:WIDTHS, cases separated by spaces) and, with --image, `profile_image.py`. Logs and
JSON per variant land in DIR; the last lines printed are one table, kernels x variants, in ms, and DIR/ab.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.loading import ROOT

TASK = re.compile(r"^(?P<kernel>.+?)_c\d+_\d+_kernel_\d+_(?P<kind>\w+)$")


def tag(setting: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", setting.lower()).strip("_") or "default"


def run(cmd: list[str], setting: str, log: str, timeout: float) -> int:
    env = dict(os.environ, TINN_SETTINGS="" if setting == "default" else setting)
    with open(log, "w") as f:
        try:
            return subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            return 124


def step_command(case: str, steps: int, json_path: str | None, toy: bool) -> list[str]:
    networks, log2, widths = case.split(":")
    cmd = [sys.executable, "-m", "benchmarks.profile_step", networks, "12" if toy else log2, widths,
           "--steps", "1" if toy else str(steps)]
    return cmd + (["--json", json_path] if json_path else [])


def image_command(json_path: str | None, toy: bool) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.profile_image"]
    cmd += ["--log2-batch", "12", "--steps", "2"] if toy else []
    return cmd + (["--json", json_path] if json_path else [])


def kernel_totals(kernel_ms: dict[str, float]) -> dict[str, float]:
    """Per kernel, the sum of its parallel tasks' mean ms (serial set-up tasks left out)."""
    totals: dict[str, float] = {}
    for name, ms in kernel_ms.items():
        m = TASK.match(name)
        if m and m["kind"] != "serial":
            totals[m["kernel"]] = totals.get(m["kernel"], 0.0) + ms
    return totals


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--settings", default="default")
    p.add_argument("--step-cases", default="4096:22:64,128")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--image", action="store_true")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--timeout", type=float, default=240)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    variants = [s.strip() for s in args.settings.split(";") if s.strip()]
    cases = args.step_cases.split() if args.step_cases else []

    t0 = time.perf_counter()
    warm = [(step_command(c, 1, None, True), v, f"{args.out}/warm_{tag(v)}_{i}.log")
            for v in variants for i, c in enumerate(cases)]
    warm += [(image_command(None, True), v, f"{args.out}/warm_{tag(v)}_image.log") for v in variants if args.image]
    with ThreadPoolExecutor(args.jobs) as pool:
        codes = list(pool.map(lambda job: run(*job, args.timeout), warm))
    print(f"compiled {len(warm)} variant runs in {time.perf_counter() - t0:.0f} s; return codes {codes}")

    results = {}
    for v in variants:
        entry = results.setdefault(v, {"steps": {}, "image": None, "rc": []})
        for i, case in enumerate(cases):
            path = f"{args.out}/step_{tag(v)}_{i}.json"
            rc = run(step_command(case, args.steps, path, False), v, f"{args.out}/step_{tag(v)}_{i}.log", args.timeout)
            entry["rc"].append(rc)
            if rc == 0:
                for r in json.load(open(path)):
                    entry["steps"][f"N={r['networks']} w={r['width']}"] = kernel_totals(r["kernel_ms"])
        if args.image:
            path = f"{args.out}/image_{tag(v)}.json"
            rc = run(image_command(path, False), v, f"{args.out}/image_{tag(v)}.log", args.timeout)
            entry["rc"].append(rc)
            if rc == 0:
                d = json.load(open(path))
                entry["image"] = {"ms_per_step": d["ms_per_step"]["checks off"], "host_ms": d["ms_per_step"]["host only"],
                                  "gpu_ms": sum(k["ms_per_step"] for k in d["kernels"])}
    with open(f"{args.out}/ab.json", "w") as f:
        json.dump(results, f, indent=1)

    rows = []
    for case in dict.fromkeys(c for v in variants for c in results[v]["steps"]):
        kernels = dict.fromkeys(k for v in variants for k in results[v]["steps"].get(case, {}))
        for k in kernels:
            rows.append((f"{case} {k}", [results[v]["steps"].get(case, {}).get(k) for v in variants]))
        rows.append((f"{case} sum", [sum(results[v]["steps"][case].values()) if case in results[v]["steps"] else None
                                     for v in variants]))
    if args.image:
        for key in ("ms_per_step", "gpu_ms", "host_ms"):
            rows.append((f"image {key}", [(results[v]["image"] or {}).get(key) for v in variants]))
    width = max([len(r[0]) for r in rows] + [10])
    print(f"{'ms':{width}s} | " + " | ".join(f"{tag(v)[:22]:>22s}" for v in variants))
    for name, values in rows:
        print(f"{name:{width}s} | " + " | ".join(f"{v:22.3f}" if v is not None else f"{'-':>22s}" for v in values))
    print("return codes: " + ", ".join(f"{tag(v)} {results[v]['rc']}" for v in variants))


if __name__ == "__main__":
    main()
