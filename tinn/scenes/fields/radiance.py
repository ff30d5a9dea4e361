"""Radiance fields made of tinn networks.

A *field* is a torch module with `box_min`, `box_max` ((3,) tensors: where it is defined) and
`forward(points (M, 3)) -> (sigma (M,), rgb (M, 3))`. `HashGridField` (one hash grid + one MLP, the
teacher) and `tinn.scenes.fields.kilonerf.KiloNeRF` (a grid of tiny networks) are fields; anything with
that shape renders (tinn/render/fields.py) and trains (tinn/scenes/training/photometric.py).

Outputs: rgb = sigmoid(raw[1:4]); sigma = `density_activation(raw[0])`, a truncated exponential
(exp with its argument clamped to <= 15, as in instant-ngp): densities of the order of 10-100 are
reached from small raw values, which tiny networks find easier than a softplus ramp.
"""
from __future__ import annotations

import math

import torch

from ...checks import check_points
from ...errors import InputError
from ...models import NetworkWithInputEncoding
from ..acceleration.occupancy import as_box

MAX_LOG_DENSITY = 15.0


def density_activation(raw: torch.Tensor) -> torch.Tensor:
    """exp(min(raw, 15)): the truncated exponential density (gradient 0 above the clamp)."""
    return torch.exp(raw.clamp(max=MAX_LOG_DENSITY))


def activate(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, 4) raw network outputs -> sigma (M,), rgb (M, 3)."""
    return density_activation(raw[:, 0]).contiguous(), torch.sigmoid(raw[:, 1:4]).contiguous()


class HashGridField(torch.nn.Module):
    """One multiresolution hash grid + one MLP over the whole box (the teacher of distillation). `precision`:
    the MLP's (`NetworkArray`'s argument; None for the settings' choice)."""

    def __init__(self, box_min, box_max, n_levels: int = 16, n_features_per_level: int = 2,
                 log2_hashmap_size: int = 19, base_resolution: int = 16, finest_resolution: int = 512,
                 n_neurons: int = 64, n_hidden_layers: int = 2, seed: int = 1337, precision: str | None = None):
        super().__init__()
        lo, hi = as_box(box_min, box_max)
        self.register_buffer("box_min", lo)
        self.register_buffer("box_max", hi)
        if not 1 <= base_resolution <= finest_resolution:
            raise InputError(f"finest_resolution={finest_resolution} must be >= base_resolution={base_resolution} >= 1")
        scale = math.exp(math.log(finest_resolution / base_resolution) / max(n_levels - 1, 1))
        self.encoding_config = {"otype": "HashGrid", "n_levels": n_levels, "n_features_per_level": n_features_per_level,
                                "log2_hashmap_size": log2_hashmap_size, "base_resolution": base_resolution,
                                "per_level_scale": scale}
        self.network_config = {"otype": "FullyFusedMLP", "n_neurons": n_neurons, "n_hidden_layers": n_hidden_layers,
                               "activation": "ReLU", "output_activation": "None"}
        self.model = NetworkWithInputEncoding(3, 4, self.encoding_config, self.network_config, seed=seed,
                                              precision=precision)

    def raw(self, points: torch.Tensor) -> torch.Tensor:
        points = check_points("points", points)
        unit = ((points - self.box_min) / (self.box_max - self.box_min)).clamp(0.0, 1.0)  # the grid's [0, 1]^3
        return self.model(unit.contiguous())

    def forward(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return activate(self.raw(points))

    def density(self, points: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(points)[0]

    def memory_bytes(self) -> int:
        return self.model.memory_bytes()


class RenderedField(torch.nn.Module):
    """A field as it renders with an occupancy grid: density 0 in the voxels the grid leaves empty.

    A teacher trained with a grid that tracks it has never been trained on samples outside that grid, and
    never renders them; its density there is whatever the hash grid left (faint floaters). Distilling from
    this view of it gives the student the teacher that was seen, not the one that was not.
    """

    def __init__(self, field, occupancy):
        super().__init__()
        self.field, self.occupancy = field, occupancy
        self.box_min, self.box_max = field.box_min, field.box_max

    def forward(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sigma, rgb = self.field(points)
        return torch.where(self.occupancy.query(points), sigma, torch.zeros_like(sigma)), rgb

    def density(self, points: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(points)[0]

