"""Fit a signed distance field with an eikonal loss: a second-order use of tinn's arrays.

Space [0, 1]^3 is split into 2x2x2 octants, each with its own hash grid + MLP (one network array, samples
routed by octant). The loss is the L1 distance error on samples near the surface plus the eikonal term
(|grad f| - 1)^2 on samples everywhere; the eikonal term differentiates the network's input gradient, so
training runs through the backward of the backward (`create_graph=True`).

    python demos/sdf_eikonal.py [--steps 400] [--batch 4096] [--arch cpu]
    python demos/sdf_eikonal.py --viewer web      # watch the slice y = 0.5 train at http://127.0.0.1:8080

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
from tinn.viewer.cli import add_viewer_args, open_viewer, viewer_kind  # noqa: E402

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


class SDFTraining:
    """The model, its trainer and the loss; also a viewer source showing the slice y = 0.5 of the field."""

    def __init__(self, batch: int = 4096, learning_rate: float = 1e-2, eikonal_weight: float = 0.1, seed: int = 0,
                 slice_res: int = 64):
        self.dev = tinn.runtime.device()
        self.batch, self.eikonal_weight = batch, eikonal_weight
        self.model = tinn.NetworkWithInputEncoding(3, 1, ENCODING, NETWORK, n_networks=8, seed=seed)
        self.trainer = tinn.Trainer(self.model, optimizer={"otype": "Adam", "learning_rate": learning_rate,
                                                           "beta2": 0.99, "epsilon": 1e-15})
        self.gen = torch.Generator().manual_seed(seed)
        s = (torch.arange(slice_res, dtype=torch.float32) + 0.5) / slice_res
        gz, gx = torch.meshgrid(s, s, indexing="ij")
        self.slice_xy = torch.stack([gx, gz], dim=-1).reshape(-1, 2)
        self.slice_res = slice_res

    def objective(self):
        p = near_surface(self.batch, self.gen, self.dev)
        target = torus_sdf(p)
        x = p.requires_grad_()
        ids = octant(x.detach())
        f = self.model(x, ids)[:, 0]
        (grad,) = torch.autograd.grad(f.sum(), x, create_graph=True)  # second order from here on
        return (f - target).abs().mean() + self.eikonal_weight * (grad.norm(dim=1) - 1).square().mean()

    def train_step(self):
        return self.trainer.optimize(self.objective)

    # viewer source: the slice through the torus' ring, x right and z down, distances colour-mapped
    @staticmethod
    def slice_points(xy: torch.Tensor) -> torch.Tensor:
        return torch.stack([xy[:, 0], torch.full_like(xy[:, 0], 0.5), xy[:, 1]], dim=1)

    def render_points(self, xy: torch.Tensor) -> torch.Tensor:
        p = self.slice_points(xy.cpu().float()).to(self.dev)
        with torch.no_grad():
            return distance_colors(self.model(p, octant(p))[:, 0].float().cpu())

    def render(self):
        return self.render_points(self.slice_xy).reshape(self.slice_res, self.slice_res, 3)

    def reference(self):
        return distance_colors(torus_sdf(self.slice_points(self.slice_xy))).reshape(self.slice_res, self.slice_res, 3)

    def ownership(self):
        return octant(self.slice_points(self.slice_xy)).reshape(self.slice_res, self.slice_res)

    @property
    def learning_rate(self) -> float:
        return self.trainer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.trainer.learning_rate = value


def distance_colors(d: torch.Tensor) -> torch.Tensor:
    """(N,) signed distances -> (N, 3): blue inside, orange outside, fading with distance, dark on the surface."""
    inside = torch.tensor([0.25, 0.45, 0.95])
    outside = torch.tensor([0.95, 0.6, 0.25])
    base = torch.where((d < 0)[:, None], inside, outside)
    shade = 0.35 + 0.65 * torch.exp(-d.abs() * 8.0)[:, None]
    surface = torch.exp(-(d / 0.006) ** 2)[:, None]
    return (base * shade * (1 - surface)).clamp(0, 1)


def train(steps: int = 400, batch: int = 4096, learning_rate: float = 1e-2, eikonal_weight: float = 0.1,
          seed: int = 0, log_every: int = 100, viewer_args=None) -> dict:
    run = SDFTraining(batch, learning_rate, eikonal_weight, seed)
    dev = run.dev
    test_points = torch.rand(8192, 3, generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    test_ids = octant(test_points)
    before = evaluate(run.model, test_points, test_ids)

    t0 = time.perf_counter()
    viewer = None if viewer_args is None else open_viewer(viewer_args, run, viewer_args.out, "tinn SDF")
    if viewer is not None:
        steps = viewer.run(steps)["steps"]
    else:
        for step in range(1, steps + 1):
            loss = run.train_step()
            if log_every and step % log_every == 0:
                print(f"step {step:5d}  loss {float(loss):.5f}", flush=True)
    seconds = time.perf_counter() - t0
    after = evaluate(run.model, test_points, test_ids)
    return {"before": before, "after": after, "seconds": seconds, "steps": steps}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--arch", default=None)
    p.add_argument("--out", default="out/sdf", help="viewer output: frames, snapshots, summary.json")
    add_viewer_args(p)
    args = p.parse_args(argv)
    tinn.init(args.arch)
    r = train(args.steps, args.batch, viewer_args=args if viewer_kind(args) else None)
    print(f"\n{'':18s} {'before':>10s} {'after':>10s}")
    for key in ("distance_error", "eikonal_residual"):
        print(f"{key:18s} {r['before'][key]:10.4f} {r['after'][key]:10.4f}")
    print(f"{r['steps']} steps in {r['seconds']:.1f} s ({r['steps'] / r['seconds']:.1f} steps/s)")
    return r


if __name__ == "__main__":
    main()
