"""Learn an image (x, y) -> RGB, like tiny-cuda-nn's mlp_learning_an_image sample.

    python demos/mlp_learning_an_image.py                      # embedded default image, one network
    python demos/mlp_learning_an_image.py --tiles 8            # array mode: 64 tiny networks, one per tile
    python demos/mlp_learning_an_image.py --image photo.png --config tinn/configs/config_hash.json
    python demos/mlp_learning_an_image.py --tiles 4 --viewer web   # watch and steer it at http://127.0.0.1:8080

The demo lives in the package (tinn/tasks/image_demo.py) so that an installed tinn runs it as `tinn-image`;
this file runs it from a checkout. Writes PNGs of the prediction at the chosen steps and prints step, loss,
PSNR, steps/s.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tinn.tasks.image_demo import DEFAULT_CONFIG, main, parse_args, run  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
