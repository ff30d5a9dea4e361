"""What the input checks of a checked call cost: the NaN/Inf scan of inputs and targets as one min/max pass each
(`tinn.checks.all_finite`) against torch's `isfinite(t).all()` (an elementwise pass writing a mask, then a
reduction), and a whole checked `NetworkArray` forward against the same call with the checks off.

    python -m benchmarks.tools.check_cost [--arch cpu|cuda] [--log2-samples 13,16,18]
"""
from __future__ import annotations

import argparse

import torch

import tinn
from benchmarks.common import time_fn


def ms(fn) -> float:
    """Median milliseconds of 20 calls, each with device syncs around it."""
    return 1e3 * time_fn(fn, reps=20)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None)
    p.add_argument("--log2-samples", default="13,16,18")
    p.add_argument("--networks", type=int, default=64)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    from tinn import checks
    from tinn.networks import NetworkArray

    dev = tinn.runtime.device()
    net = NetworkArray(32, 16, {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
                                "n_neurons": 64, "n_hidden_layers": 2}, n_networks=args.networks)
    print(f"{arch}: 32 inputs, 16 targets; forward: {args.networks} networks x 64, 2 hidden layers, inference")
    print(f"{'samples':>8s} | {'isfinite.all ms':>15s} {'all_finite ms':>13s} | {'forward checked':>15s} "
          f"{'unchecked':>9s}")
    for log2 in (int(v) for v in args.log2_samples.split(",")):
        x = torch.rand(1 << log2, 32, device=dev)
        y = torch.rand(1 << log2, 16, device=dev)
        ids = torch.randint(0, args.networks, (1 << log2,), dtype=torch.int32, device=dev)
        torch_scan = ms(lambda: bool(torch.stack([torch.isfinite(x).all(), torch.isfinite(y).all()]).all()))
        scan = ms(lambda: bool(torch.stack([checks.all_finite(x), checks.all_finite(y)]).all()))
        with torch.no_grad():
            checked = ms(lambda: net(x, ids))
            with checks.disabled():
                unchecked = ms(lambda: net(x, ids))
        print(f"{'2^' + str(log2):>8s} | {torch_scan:15.3f} {scan:13.3f} | {checked:15.3f} {unchecked:9.3f}")


if __name__ == "__main__":
    main()
