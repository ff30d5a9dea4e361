"""Before/after on one machine: the target MLP-array case and the image step, measured alternately in two
checkouts of tinn (separate processes, so each tree compiles and imports its own kernels).

    python -m benchmarks.tools.compare_trees OLD_TREE NEW_TREE [--rounds 2] [--widths 64,128] [--json out.json]

A tree may carry settings for its processes, `TREE@name=value,name=value` (what `TINN_SETTINGS` takes):
`. .@fused_staged_weights=none` compares one setting in one checkout.

Each round runs, for each tree in turn, `benchmarks/bench_mlp_array.py` on the target case (4096 networks
x 64 wide, 32 in, 16 out, 2 hidden, 2^22 samples, even and ragged routing, torch skipped) and
`benchmarks/profile_image.py` (config_hash, batch 2^18). Alternating rounds spread drifts of the machine
over both trees. Prints the best time of each tree and new/old per quantity.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def run_tree(spec: str, out_dir: str, tag: str, widths: str = "64") -> dict:
    tree, _, settings = spec.partition("@")
    tree = os.path.abspath(tree)
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    if settings:
        env["TINN_SETTINGS"] = settings
    bench_json = os.path.join(out_dir, f"bench_{tag}.json")
    image_json = os.path.join(out_dir, f"image_{tag}.json")
    subprocess.run([sys.executable, "-m", "benchmarks.bench_mlp_array", "--networks", "4096",
                    "--log2-samples", "22", "--routing", "even,ragged", "--widths", widths, "--skip-torch",
                    "--no-vmap", "--json", bench_json], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "benchmarks.profile_image", "--steps", "300",
                    "--json", image_json], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(bench_json) as f:
        rows = json.load(f)["rows"]
    with open(image_json) as f:
        image = json.load(f)["ms_per_step"]
    out = {"image step ms": image["checks off"], "image host ms": image["host only"]}
    for r in rows:
        name = r["routing"] if widths == "64" else f"w{r['width']} {r['routing']}"
        out[f"{name} fwd ms"] = r["tinn_fwd_ms"]
        out[f"{name} step ms"] = r["tinn_train_ms"]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--widths", default="64", help="widths of the target case (comma list)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    trees = {"old": args.old, "new": args.new}
    runs = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for tag in (("old", "new") if k % 2 == 0 else ("new", "old")):
                runs[tag].append(run_tree(trees[tag], tmp, f"{tag}{k}", args.widths))
                print(f"round {k} {tag}: {runs[tag][-1]}", flush=True)
    best = {tag: {q: min(r[q] for r in rs) for q in rs[0]} for tag, rs in runs.items()}
    print(f"\n{'quantity':22s} {'old':>9s} {'new':>9s} {'new/old':>8s}")
    for q in best["old"]:
        print(f"{q:22s} {best['old'][q]:9.3f} {best['new'][q]:9.3f} {best['new'][q] / best['old'][q]:8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "best": best}, f, indent=1)


if __name__ == "__main__":
    main()
