"""Fit a signed distance field with an eikonal loss: a second-order use of tinn's arrays.

Space [0, 1]^3 is split into 2x2x2 octants, each with its own hash grid + MLP (one network array, samples
routed by octant). The loss is the L1 distance error on samples near the surface plus the eikonal term
(|grad f| - 1)^2 on samples everywhere; the eikonal term differentiates the network's input gradient, so
training runs through the backward of the backward (`create_graph=True`).

    python demos/sdf_eikonal.py [--steps 400] [--batch 4096] [--arch cpu]

Prints the mean absolute distance error and the mean eikonal residual on held-out points, before and after.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tinn  # noqa: E402

ENCODING = {"otype": "HashGrid", "n_levels": 6, "n_features_per_level": 2, "log2_hashmap_size": 12,
            "base_resolution": 4, "per_level_scale": 1.5}
NETWORK = {"otype": "CutlassMLP", "n_neurons": 32, "n_hidden_layers": 1, "activation": "Softplus",
           "output_activation": "None"}


def torus_sdf(p: torch.Tensor, major: float = 0.28, minor: float = 0.1) -> torch.Tensor:
    """Signed distance to a torus centred in the unit cube (exact, so |grad| = 1 almost everywhere)."""
    q = p - 0.5
    ring = torch.sqrt(q[:, 0] ** 2 + q[:, 2] ** 2) - major
    return torch.sqrt(ring ** 2 + q[:, 1] ** 2) - minor


def octant(p: torch.Tensor) -> torch.Tensor:
    cell = (p >= 0.5).long()
    return cell[:, 0] * 4 + cell[:, 1] * 2 + cell[:, 2]


def near_surface(n: int, gen: torch.Generator, device) -> torch.Tensor:
    """Uniform points, half of them pulled towards the surface so the zero set is well sampled."""
    p = torch.rand(n, 3, generator=gen, device="cpu")
    d = torus_sdf(p)
    keep = d.abs() < 0.08
    return torch.cat([p[keep], p[: n - int(keep.sum())]]).to(device)


def evaluate(model, points, ids) -> dict:
    x = points.clone().requires_grad_()
    f = model(x, ids)[:, 0]
    (g,) = torch.autograd.grad(f.sum(), x)
    truth = torus_sdf(points)
    return {"distance_error": float((f.detach() - truth).abs().mean()),
            "eikonal_residual": float((g.norm(dim=1) - 1).abs().mean())}


def train(steps: int = 400, batch: int = 4096, learning_rate: float = 1e-2, eikonal_weight: float = 0.1,
          seed: int = 0, log_every: int = 100) -> dict:
    dev = tinn.runtime.device()
    model = tinn.NetworkWithInputEncoding(3, 1, ENCODING, NETWORK, n_networks=8, seed=seed)
    trainer = tinn.Trainer(model, optimizer={"otype": "Adam", "learning_rate": learning_rate, "beta2": 0.99,
                                             "epsilon": 1e-15})
    gen = torch.Generator().manual_seed(seed)
    test_points = torch.rand(8192, 3, generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    test_ids = octant(test_points)
    before = evaluate(model, test_points, test_ids)

    def objective():
        p = near_surface(batch, gen, dev)
        target = torus_sdf(p)
        x = p.requires_grad_()
        ids = octant(x.detach())
        f = model(x, ids)[:, 0]
        (grad,) = torch.autograd.grad(f.sum(), x, create_graph=True)  # second order from here on
        return (f - target).abs().mean() + eikonal_weight * (grad.norm(dim=1) - 1).square().mean()

    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        loss = trainer.optimize(objective)
        if log_every and step % log_every == 0:
            print(f"step {step:5d}  loss {float(loss):.5f}", flush=True)
    seconds = time.perf_counter() - t0
    after = evaluate(model, test_points, test_ids)
    return {"before": before, "after": after, "seconds": seconds, "steps": steps}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    tinn.init(args.arch)
    r = train(args.steps, args.batch)
    print(f"\n{'':18s} {'before':>10s} {'after':>10s}")
    for key in ("distance_error", "eikonal_residual"):
        print(f"{key:18s} {r['before'][key]:10.4f} {r['after'][key]:10.4f}")
    print(f"{r['steps']} steps in {r['seconds']:.1f} s ({r['steps'] / r['seconds']:.1f} steps/s)")
    return r


if __name__ == "__main__":
    main()
