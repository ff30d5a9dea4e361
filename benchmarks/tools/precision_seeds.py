"""A demo's held-out PSNR per precision over several seeds, each precision paired with the first on the same seed.

    python -m benchmarks.tools.precision_seeds --demo image --seeds 1,2,3,4,5 -- --tiles 8 --steps 2000
    python -m benchmarks.tools.precision_seeds --demo kilonerf --seeds 0,1,2 --precisions float32,bfloat16 \
        -- --mesh bunny.obj --res 800 --teacher-precision float16

Single runs of the demos differ by tenths of a dB to about a dB from the seed alone (it draws the networks'
initial values and the batches, and for KiloNeRF the views), so one pair of runs cannot tell a precision's cost
from the noise. Each (seed, precision) runs the demo in its own process with `TINN_SETTINGS=precision=...`
added to the environment's settings and `--seed`; the arguments after `--` go to every run. Prints the PSNR per
seed, the mean, and each precision's difference from the first precision on the same seed (mean and median);
`--json` writes the same.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMOS = {  # the demo's script and the summary.json key of the PSNR compared
    "image": (os.path.join(ROOT, "demos", "mlp_learning_an_image.py"), "final_psnr"),
    "kilonerf": (os.path.join(ROOT, "demos", "kilonerf.py"), "psnr_student"),
}
PRECISIONS = ("float32", "float16", "bfloat16", "tf32")


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: comma-separated integers")
    if not values:
        raise argparse.ArgumentTypeError("at least one seed")
    return values


def precision_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in PRECISIONS]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a comma-separated list of {', '.join(PRECISIONS)}")
    return values


def settings_with_precision(existing: str, precision: str) -> str:
    """The environment's TINN_SETTINGS with its precision replaced by `precision`."""
    kept = [item for item in existing.split(",") if item.strip() and item.split("=")[0].strip() != "precision"]
    return ",".join(kept + [f"precision={precision}"])


def run_one(demo: str, precision: str, seed: int, out: str, extra: list[str]) -> float:
    """The PSNR of one demo run (its summary.json), the run's output passed through."""
    script, key = DEMOS[demo]
    env = dict(os.environ, TINN_SETTINGS=settings_with_precision(os.environ.get("TINN_SETTINGS", ""), precision))
    command = [sys.executable, script, *extra, "--seed", str(seed), "--out", out]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        value = json.load(f).get(key)
    if value is None:
        raise SystemExit(f"{out}/summary.json has no {key!r}")
    return float(value)


def compare(psnr: dict[str, list[float]], precisions: list[str]) -> dict[str, dict]:
    """Per precision: the runs, their mean, and against the first precision on the same seed: mean and median."""
    first = psnr[precisions[0]]
    rows = {}
    for p in precisions:
        diffs = [a - b for a, b in zip(psnr[p], first)]
        rows[p] = {"psnr": psnr[p], "mean": statistics.mean(psnr[p]),
                   "diff_mean": statistics.mean(diffs), "diff_median": statistics.median(diffs)}
    return rows


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", choices=sorted(DEMOS), default="image")
    p.add_argument("--precisions", type=precision_list, default=["float32", "float16", "bfloat16"],
                   help="the first is the reference of the differences (default float32,float16,bfloat16)")
    p.add_argument("--seeds", type=int_list, default=[1, 2, 3, 4, 5])
    p.add_argument("--out", default="out/precision_seeds", help="each run's folder goes under it")
    p.add_argument("--json", default=None)
    args = p.parse_args(own)
    forbidden = [a for a in extra if a.split("=")[0] in ("--seed", "--out")]
    if forbidden:
        p.error(f"{forbidden[0]} after -- : the tool sets --seed and --out of every run itself")

    psnr: dict[str, list[float]] = {prec: [] for prec in args.precisions}
    for seed in args.seeds:
        for prec in args.precisions:
            value = run_one(args.demo, prec, seed, os.path.join(args.out, f"{args.demo}_{prec}_{seed}"), extra)
            psnr[prec].append(value)
            print(f"{args.demo} {prec} seed={seed}: {value:.2f} dB", flush=True)
    rows = compare(psnr, args.precisions)
    ref = args.precisions[0]
    print(f"\n| precision | PSNR per seed {','.join(map(str, args.seeds))} (dB) | mean | against {ref}, same seed: "
          f"mean / median |")
    print("| --- | --- | --- | --- |")
    for prec, r in rows.items():
        against = "" if prec == ref else f"{r['diff_mean']:+.2f} / {r['diff_median']:+.2f} dB"
        print(f"| {prec} | {', '.join(f'{v:.2f}' for v in r['psnr'])} | {r['mean']:.2f} | {against} |")
    result = {"demo": args.demo, "seeds": args.seeds, "extra_args": extra, "precisions": rows}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
