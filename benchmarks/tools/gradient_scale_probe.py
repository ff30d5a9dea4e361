"""The image step's PSNR with float16's gradient scale changed (tcnn's and tinn's is 128): `image_paths.py` with
`settings.precision=float16` after `dense_mlp.GRADIENT_SCALES["float16"]` is set, next to float32.

    python -m benchmarks.tools.gradient_scale_probe SCALE [--quality-runs 3] [--train-steps 1000]
"""
import os
import sys


from tinn import dense_mlp  # noqa: E402

from benchmarks.tools import image_paths  # noqa: E402


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit(__doc__)
    dense_mlp.GRADIENT_SCALES["float16"] = float(argv[0])
    rest = argv[1:] or ["--quality-runs", "3", "--train-steps", "1000"]
    # A fixed scale: the dynamic scaling (the default for float16) would move it.
    image_paths.main(["--variant", "precision=float16,gradient_scaling=static", "--rounds", "1", "--steps", "20",
                      *rest])


if __name__ == "__main__":
    main()
