"""Rendering fields (see tinn/scenes/fields.py) with `tinn.render`, and timing helpers.

`render_rays` / `render_image`: stratified samples inside the box, optionally only those in occupied
voxels (`tinn.render.sampling.pack`), networks evaluated on the kept samples only, composited with
`tinn.render.compositing.composite` (whose backward trains the networks).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .. import runtime
from ..errors import InputError
from ..render import camera_rays, composite, pack, ray_box, stratified_t
from ..tasks.image import psnr  # noqa: F401  (the project's one PSNR, offered here next to the scene helpers)
from .fields import activate
from .occupancy import check_points

def _collective(field) -> bool:
    """Whether calling `field` runs collectives (tinn.distributed), so every rank must call it."""
    return any(getattr(m, "collective_calls", False) for m in field.modules()) if hasattr(field, "modules") else False


@dataclass
class RenderedRays:
    rgb: torch.Tensor          # (R, 3)
    opacity: torch.Tensor      # (R,)
    n_candidates: torch.Tensor  # 0-d int64: samples inside the box (what a renderer without skipping evaluates)
    n_evaluated: int           # samples the field was evaluated on


def render_rays(field, origins: torch.Tensor, directions: torch.Tensor, n_samples: int, background=None,
                occupancy=None, jitter: bool = False, generator: torch.Generator | None = None) -> RenderedRays:
    """Volume-render rays through `field`: `n_samples` stratified samples over each ray's span inside the field's
    box; with an `OccupancyGrid` only samples in occupied voxels are evaluated (the others count as empty)."""
    origins = check_points("origins", origins)
    directions = check_points("directions", directions)
    if directions.shape != origins.shape:
        raise InputError(f"directions must have the shape of origins {tuple(origins.shape)}, "
                         f"got {tuple(directions.shape)}")
    t_near, t_far = ray_box(origins, directions, field.box_min, field.box_max)
    t, deltas = stratified_t(t_near, t_far, n_samples, jitter, generator)
    n_rays = origins.shape[0]
    points = (origins[:, None, :] + t[..., None] * directions[:, None, :]).reshape(-1, 3)
    mask = deltas > 0
    n_candidates = mask.sum()
    if occupancy is not None:
        mask = mask & occupancy.query(points).reshape(n_rays, n_samples)
    index, offsets = pack(mask)
    if index.numel() or _collective(field):  # a sharded field's ranks must all join each call
        sigma, rgb = field(points[index].contiguous())
    else:  # nothing to evaluate: every ray shows the background
        sigma = torch.zeros(0, device=origins.device)
        rgb = torch.zeros(0, 3, device=origins.device)
    out = composite(sigma, rgb, deltas.reshape(-1)[index].contiguous(), offsets, background)
    return RenderedRays(out.rgb, out.opacity, n_candidates, int(index.numel()))


@dataclass
class RenderedImage:
    rgb: torch.Tensor       # (H, W, 3)
    opacity: torch.Tensor   # (H, W)
    n_candidates: int       # in-box samples
    n_evaluated: int        # samples evaluated after skipping

    @property
    def skipped_fraction(self) -> float:
        """Share of the in-box samples that empty-space skipping left out."""
        return 1.0 - self.n_evaluated / self.n_candidates if self.n_candidates else 0.0


@torch.no_grad()
def render_image(model, c2w: torch.Tensor, width: int, height: int, focal: float, n_samples: int = 128,
                 background=None, occupancy="auto", chunk: int = 1 << 14) -> RenderedImage:
    """Render one view of a field in chunks of `chunk` rays (no gradients).

    `occupancy="auto"` uses `model.occupancy` when the model has one (KiloNeRF does), None renders every sample.
    """
    if not isinstance(c2w, torch.Tensor) or tuple(c2w.shape[-2:]) not in ((4, 4), (3, 4)) or c2w.dim() != 2:
        raise InputError(f"c2w must be a (4, 4) torch.Tensor, got "
                         f"{tuple(c2w.shape) if isinstance(c2w, torch.Tensor) else type(c2w).__name__}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise InputError(f"chunk={chunk!r} must be an integer >= 1 (rays per launch)")
    if isinstance(occupancy, str):
        if occupancy != "auto":
            raise InputError(f"occupancy={occupancy!r}; allowed: 'auto', None or an OccupancyGrid")
        occupancy = getattr(model, "occupancy", None)
    dev = runtime.device()
    origins, directions = camera_rays(c2w.to(dev, torch.float32), width, height, focal)
    if background is not None and isinstance(background, torch.Tensor):
        background = background.to(dev, torch.float32)
    rgb, opacity, n_candidates, n_evaluated = [], [], 0, 0
    for start in range(0, origins.shape[0], chunk):
        out = render_rays(model, origins[start:start + chunk], directions[start:start + chunk], n_samples,
                          background, occupancy)
        rgb.append(out.rgb)
        opacity.append(out.opacity)
        n_candidates += int(out.n_candidates)
        n_evaluated += out.n_evaluated
    return RenderedImage(torch.cat(rgb).reshape(height, width, 3), torch.cat(opacity).reshape(height, width),
                         n_candidates, n_evaluated)


def timed(fn, *args, **kwargs):
    """(fn(*args, **kwargs), seconds), device work included."""
    runtime.sync()
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    runtime.sync()
    return result, time.perf_counter() - t0


def seconds_per_frame(render, repeats: int = 10) -> float:
    """Mean seconds of `render()` over `repeats` calls after one warm-up call (compiles, caches), device included."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats={repeats!r} must be an integer >= 1")
    render()
    _, seconds = timed(lambda: [render() for _ in range(repeats)])
    return seconds / repeats
