"""Runs tiny-cuda-nn's own `samples/mlp_learning_an_image_pytorch.py` on tinn, changing only its import.

    python -m benchmarks.tools.tcnn_sample_check TCNN_ROOT [--steps 1000] [--json out.json]

TCNN_ROOT is a checkout of tiny-cuda-nn (its samples/, scripts/ and data/ folders; tinn does not ship
them). A copy of the sample with `import tinycudann as tcnn` replaced by `import tinn.torch as tcnn` (the
one line a tcnn user changes) runs in a temporary folder; its printed losses, wall time and the PSNR of its
final image against the reference image it writes are recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import imageio.v2 as iio
import numpy as np

ORIGINAL = "import tinycudann as tcnn"
REPLACEMENT = "import tinn.torch as tcnn"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tcnn_root")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    root = os.path.abspath(args.tcnn_root)
    source = open(os.path.join(root, "samples", "mlp_learning_an_image_pytorch.py"), encoding="utf-8").read()
    if source.count(ORIGINAL) != 1:
        raise SystemExit(f"the sample does not import tinycudann as expected ({ORIGINAL!r})")
    copy = os.path.join(root, "samples", "_tinn_mlp_learning_an_image_pytorch.py")
    with open(copy, "w", encoding="utf-8") as f:
        f.write(source.replace(ORIGINAL, REPLACEMENT))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, copy, os.path.join(root, "data", "images", "albert.jpg"),
                               os.path.join(root, "data", "config_hash.json"), str(args.steps), "result.jpg"],
                              cwd=work, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        os.remove(copy)
        text = proc.stdout + proc.stderr
        losses = [(int(i), float(v)) for i, v in re.findall(r"Step#(\d+): loss=([0-9.eE+-]+)", text)]
        psnr = None
        if proc.returncode == 0:
            ref = iio.imread(os.path.join(work, "reference.jpg")).astype(np.float64) / 255.0
            out = iio.imread(os.path.join(work, "result.jpg")).astype(np.float64) / 255.0
            psnr = float(-10 * np.log10(np.mean((out - ref) ** 2)))
    result = {"returncode": proc.returncode, "steps": args.steps, "seconds": round(seconds, 2), "losses": losses,
              "psnr_result_vs_reference_db": psnr, "log_tail": text[-3000:]}
    print(text[-1500:])
    print(f"\nsample rc={proc.returncode}, {args.steps} steps in {seconds:.1f} s (process wall, compile included), "
          f"first/last loss {losses[0][1] if losses else None} / {losses[-1][1] if losses else None}, "
          f"PSNR of the result against the reference {psnr if psnr is None else round(psnr, 2)} dB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
