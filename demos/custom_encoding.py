"""A custom encoding in a few lines of Taichi, trained inside an array of tiny networks.

Every tile of the image gets its own network and its own learnable Fourier features: frequencies and
phases per tile, y_k = sin(f_k . x + phi_k). Only the forward is written; Taichi's reverse mode
gives the gradients (tinn.autodiff). The networks behind it are tinn's fused MLP arrays.

    python demos/custom_encoding.py                 # 4 x 4 tiles of the embedded image
    python demos/custom_encoding.py --steps 2000 --tiles 8
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import tinn  # noqa: E402
from tinn.backend import ti  # noqa: E402

FEATURES = 32   # sin features per tile


@ti.func
def learnable_fourier(x: ti.template(), p: ti.template(), b, net, y: ti.template()):
    """Feature k of sample b: sin(p[k, 0] x0 + p[k, 1] x1 + p[k, 2]) with this tile's parameters p."""
    for k in ti.static(range(FEATURES)):
        y[b, k] = ti.sin(p[net, 3 * k] * x[b, 0] + p[net, 3 * k + 1] * x[b, 1] + p[net, 3 * k + 2])


def initial_frequencies(n_networks, n_params, gen):
    """Frequencies up to 2^5 * pi in random directions, random phases."""
    scale = 3.14159 * 2.0 ** (torch.rand(n_networks, FEATURES, 1, generator=gen) * 5)
    direction = torch.nn.functional.normalize(torch.randn(n_networks, FEATURES, 2, generator=gen), dim=2)
    phase = torch.rand(n_networks, FEATURES, 1, generator=gen) * 6.2832
    return torch.cat([scale * direction, phase], 2).reshape(n_networks, n_params)


def run(argv=None) -> dict:
    from tinn.autodiff import AutodiffPart
    from tinn.models import NetworkWithInputEncoding
    from tinn.tasks.image import ImageTask, default_image, psnr

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiles", type=int, default=4)
    p.add_argument("--steps", type=int, default=None, help="default: 1000 on a GPU, 300 on the CPU")
    p.add_argument("--batch", type=int, default=None, help="default: 2^18 on a GPU, 2^13 on the CPU")
    p.add_argument("--size", type=int, default=128, help="side of the embedded image")
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    gpu = arch == "cuda"
    steps = args.steps or (1000 if gpu else 300)
    batch = args.batch or (1 << 18 if gpu else 1 << 13)
    task = ImageTask(default_image(args.size), tiles=args.tiles)
    encoding = AutodiffPart(learnable_fourier, 2, FEATURES, 3 * FEATURES, n_networks=task.n_networks,
                            init=initial_frequencies)
    model = NetworkWithInputEncoding(2, 3, encoding, {"otype": "FullyFusedMLP", "n_neurons": 32,
                                                      "n_hidden_layers": 1}, n_networks=task.n_networks)
    trainer = tinn.Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x, target, ids = task.batch(batch)
        loss = trainer.training_step(x, target, ids)
        if step % max(steps // 5, 1) == 0:
            print(f"step {step}: loss {float(loss):.5f}")
    tinn.runtime.sync()
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        quality = psnr(task.render(model), task.image)
    print(f"{task.n_networks} tiles, custom Taichi encoding + MLP: PSNR {quality:.2f} dB after {steps} steps "
          f"({seconds:.1f} s)")
    return {"psnr": quality, "steps": steps, "seconds": seconds, "final_loss": float(loss)}


if __name__ == "__main__":
    run()
