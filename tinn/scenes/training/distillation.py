"""Distillation: a student field (a `KiloNeRF`) fitted to a teacher field at random points of occupied space."""
from __future__ import annotations

import math

import torch

from ...errors import InputError
from ...trainer import Trainer
from ..acceleration.occupancy import OccupancyGrid
from .photometric import SceneTrainer, decaying_adam

__all__ = ["Distiller"]


class Distiller(SceneTrainer):
    """Fits a student field to a teacher at random points of occupied space (`occupancy.sample`).

    Loss per point: (alpha_s - alpha_t)^2 + alpha_t-weighted (rgb_s - rgb_t)^2, alpha = 1 - exp(-sigma * step_size)
    for a fixed `step_size` (the render step): densities are compared by what they do to a ray — a cell that is
    opaque either way costs nothing — and colours matter where the teacher has matter.
    """

    def __init__(self, student, teacher, occupancy: OccupancyGrid, step_size: float, batch: int = 1 << 16,
                 learning_rate: float = 1e-2, total_steps: int | None = None, final_lr_factor: float = 0.1,
                 seed: int = 0, adam_options: dict | None = None):
        if not float(step_size) > 0:
            raise InputError(f"step_size={step_size!r} must be a positive distance (the render step)")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InputError(f"batch={batch!r} must be an integer >= 1")
        self.student, self.teacher, self.occupancy = student, teacher, occupancy
        self.step_size, self.batch = float(step_size), batch
        self.trainer = Trainer(student, self.loss,
                               decaying_adam(learning_rate, total_steps, final_lr_factor, **(adam_options or {})))
        self.generator = torch.Generator(device=occupancy.occupied.device).manual_seed(seed)

    def targets(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            sigma, rgb = self.teacher(points)
        return 1.0 - torch.exp(-sigma * self.step_size), rgb

    def loss(self, points: torch.Tensor | None = None) -> torch.Tensor:
        """The distillation loss at `points` (default: a fresh batch of occupied points)."""
        if points is None:
            points = self.occupancy.sample(self.batch, self.generator)
        alpha_t, rgb_t = self.targets(points)
        sigma, rgb = self.student(points)
        alpha = 1.0 - torch.exp(-sigma * self.step_size)
        return ((alpha - alpha_t) ** 2).mean() + (alpha_t[:, None] * (rgb - rgb_t) ** 2).mean()

    @torch.no_grad()
    def error(self, n_points: int = 1 << 15, seed: int = 12345) -> dict:
        """Student-teacher error at fresh occupied points: RMS alpha and alpha-weighted RMS colour difference."""
        gen = torch.Generator(device=self.occupancy.occupied.device).manual_seed(seed)
        points = self.occupancy.sample(n_points, gen)
        alpha_t, rgb_t = self.targets(points)
        sigma, rgb = self.student(points)
        alpha = 1.0 - torch.exp(-sigma * self.step_size)
        w = alpha_t[:, None].expand_as(rgb)
        return {"alpha_rms": math.sqrt(float(((alpha - alpha_t) ** 2).mean())),
                "rgb_rms": math.sqrt(float((w * (rgb - rgb_t) ** 2).sum() / w.sum().clamp_min(1e-12)))}
