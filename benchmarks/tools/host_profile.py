"""Which Python functions issue the image step's host time, per path (cProfile, on the backend tinn runs).

Runs tcnn's sample loop through `tinn.torch` (torch loss, torch Adam) and the native Trainer step for a few
hundred steps each under cProfile and prints the functions with the most own time and the tinn functions
with the most inclusive time. cProfile adds its own cost per Python call, so the figures rank the code; the
host time itself is `host_overhead.py`'s.

    python benchmarks/tools/host_profile.py [--arch cuda] [--log2-batch 18] [--steps 300] [--out DIR]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))

import tinn  # noqa: E402
from bench_torch_path import ImageSteps, torch_adam  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None)
    p.add_argument("--config", default=os.path.join(HERE, "..", "..", "tinn", "configs", "config_hash.json"))
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    tinn.checks.set_enabled(False)
    config = tinn.load_config(args.config)
    image = ImageSteps(config, args.log2_batch)
    torch_loop = image.torch_loop(torch_adam(image.model.parameters(), config.get("optimizer", {})))

    report = []
    for name, step in (("tinn.torch + torch loss + torch Adam", torch_loop), ("Trainer", image.native)):
        for _ in range(10):
            step()
        tinn.runtime.sync()
        prof = cProfile.Profile()
        prof.enable()
        for i in range(args.steps):
            step()
            if i % 16 == 15:
                tinn.runtime.sync()  # a bounded launch queue: no launch waits on a full one
        prof.disable()
        tinn.runtime.sync()
        for order, title in (("tottime", "own time"), ("cumulative", "inclusive time")):
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf)
            stats.sort_stats(order).print_stats(args.rows)
            report.append(f"== {name}: {title}, {arch}, batch 2^{args.log2_batch}, {args.steps} steps ==\n"
                          + buf.getvalue())
    text = "\n".join(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "host_profile.txt"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
