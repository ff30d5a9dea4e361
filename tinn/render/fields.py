"""Rendering fields (see tinn/scenes/fields/radiance.py) with `tinn.render`'s rays, samples and compositing, and
timing helpers.

`render_rays` (training): stratified samples inside the box, optionally only those in occupied voxels, networks
evaluated on the kept samples only, composited with `tinn.render.compositing.composite` (whose backward trains the
networks). It is `sample_rays` (device work only) then `shade` (reads the number of kept samples): a training
step can sample its next batch before evaluating this one, so that the count is on the host when it is needed.
`render_image` (viewing): the same samples without jitter produced packed by a marching kernel pair
(`tinn.render.march`), with early ray termination.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .. import checks, runtime
from ..checks import check_points
from ..errors import InputError
from .compositing import composite
from .rays import camera_rays, ray_box
from .pending import PendingCount
from .sampling import frame_runs, march, positions, ray_offsets, stratified_t


def _collective(field) -> bool:
    """Whether calling `field` runs collectives (tinn.distributed), so every rank must call it."""
    return any(getattr(m, "collective_calls", False) for m in field.modules()) if hasattr(field, "modules") else False


@dataclass
class RenderedRays:
    rgb: torch.Tensor          # (R, 3)
    opacity: torch.Tensor      # (R,)
    n_candidates: torch.Tensor  # 0-d int64: samples inside the box (what a renderer without skipping evaluates)
    n_evaluated: int           # samples the field was evaluated on


@dataclass
class RaySamples:
    """`render_rays`' samples of a batch of rays, those to evaluate marked but not yet gathered (`sample_rays`)."""
    points: torch.Tensor        # (R * S, 3) every sample point, ray-major
    deltas: torch.Tensor        # (R * S,) bin lengths (0 for rays that miss the box)
    keep: torch.Tensor          # (R * S,) bool: the samples to evaluate (in the box and, with a grid, occupied)
    ray_offsets: torch.Tensor   # (R + 1,) int32: ray r owns kept samples ray_offsets[r]:ray_offsets[r + 1]
    n_candidates: torch.Tensor  # 0-d int64: samples inside the box
    n_kept: PendingCount        # the number of kept samples, on its way to the host


def sample_rays(box_min, box_max, origins: torch.Tensor, directions: torch.Tensor, n_samples: int,
                occupancy=None, jitter: bool = False, generator: torch.Generator | None = None,
                spans: tuple[torch.Tensor, torch.Tensor] | None = None) -> RaySamples:
    """The samples `render_rays` evaluates, chosen on the device without waiting for it: stratified samples over
    each ray's span inside the box [box_min, box_max], kept where they lie in occupied voxels of `occupancy`
    (every in-box sample without one). `shade` evaluates and composites them. Sampling a batch ahead of its use
    (a training step preparing the next one's rays) lets the number of kept samples reach the host meanwhile.
    `spans`: the rays' (t_near, t_far) against the box (`ray_box`'s), where the caller keeps them."""
    origins = check_points("origins", origins)
    directions = check_points("directions", directions)
    if directions.shape != origins.shape:
        raise InputError(f"directions must have the shape of origins {tuple(origins.shape)}, "
                         f"got {tuple(directions.shape)}")
    t_near, t_far = ray_box(origins, directions, box_min, box_max) if spans is None else spans
    t, deltas = stratified_t(t_near, t_far, n_samples, jitter, generator)
    points = (origins[:, None, :] + t[..., None] * directions[:, None, :]).reshape(-1, 3)
    keep = deltas > 0
    n_candidates = keep.sum()
    if occupancy is not None:
        keep = keep & occupancy.query(points).reshape(keep.shape)
    offsets = ray_offsets(keep)
    return RaySamples(points, deltas.reshape(-1), keep.reshape(-1), offsets, n_candidates, PendingCount(offsets[-1]))


def shade(field, samples: RaySamples, background=None) -> RenderedRays:
    """`samples` (from `sample_rays`) through `field`: the kept ones gathered (this waits until the device has
    counted them), evaluated, and composited front to back over `background`; the others count as empty."""
    m = samples.n_kept.value()
    index = positions(samples.keep, m)
    if m or _collective(field):  # a sharded field's ranks must all join each call
        sigma, rgb = field(samples.points[index].contiguous())
    else:  # nothing to evaluate: every ray shows the background
        sigma = torch.zeros(0, device=samples.points.device)
        rgb = torch.zeros(0, 3, device=samples.points.device)
    with checks.disabled():  # the offsets were built with the samples: no check (a device sync) needed
        out = composite(sigma, rgb, samples.deltas[index].contiguous(), samples.ray_offsets, background)
    return RenderedRays(out.rgb, out.opacity, samples.n_candidates, m)


def render_rays(field, origins: torch.Tensor, directions: torch.Tensor, n_samples: int, background=None,
                occupancy=None, jitter: bool = False, generator: torch.Generator | None = None) -> RenderedRays:
    """Volume-render rays through `field`: `n_samples` stratified samples over each ray's span inside the field's
    box; with an `OccupancyGrid` only samples in occupied voxels are evaluated (the others count as empty).
    `sample_rays` then `shade`: the field's evaluation waits for the device to count the kept samples."""
    samples = sample_rays(field.box_min, field.box_max, origins, directions, n_samples, occupancy, jitter, generator)
    return shade(field, samples, background)


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
                 background=None, occupancy="auto", chunk: int = 1 << 20, early_stop: float = 1e-4,
                 segments: int = 4) -> RenderedImage:
    """Render one view of a field (no gradients): the samples of `render_rays` without jitter, marched by one
    kernel pair per run (`tinn.render.march`: only samples in occupied voxels are produced, nothing of size
    rays x samples is stored), the field evaluated on them, composited.

    `occupancy="auto"` uses `model.occupancy` when the model has one (KiloNeRF does), None renders every sample.
    Early ray termination: each ray's bins are taken in `segments` runs front to back, and a ray whose
    transmittance fell below `early_stop` is finished there (its pixel changes by at most `early_stop`);
    segments=1 or early_stop=0 evaluates every sample. `chunk`: rays marched at once.
    """
    if not isinstance(c2w, torch.Tensor) or tuple(c2w.shape[-2:]) not in ((4, 4), (3, 4)) or c2w.dim() != 2:
        raise InputError(f"c2w must be a (4, 4) torch.Tensor, got "
                         f"{tuple(c2w.shape) if isinstance(c2w, torch.Tensor) else type(c2w).__name__}")
    runs = frame_runs(n_samples, segments, early_stop, chunk)
    if isinstance(occupancy, str):
        if occupancy != "auto":
            raise InputError(f"occupancy={occupancy!r}; allowed: 'auto', None or an OccupancyGrid")
        occupancy = getattr(model, "occupancy", None)
    dev = runtime.device()
    origins, directions = camera_rays(c2w.to(dev, torch.float32), width, height, focal)
    t_near, t_far = ray_box(origins, directions, model.box_min, model.box_max)
    n_rays = origins.shape[0]
    bg = torch.zeros(3, device=dev) if background is None else torch.as_tensor(background).to(dev, torch.float32)
    if bg.shape != (3,):
        raise InputError(f"background must have shape (3,), got {tuple(bg.shape)}")
    color = torch.zeros(n_rays, 3, device=dev)
    trans = torch.ones(n_rays, device=dev)
    hits = t_far > t_near
    collective = _collective(model)  # every rank calls the field once per run, even with no samples
    n_evaluated = 0
    # Points, ids and offsets below are valid by construction (finite, in the box, ordered): the checked
    # path's device syncs are skipped, as they would be a large share of a frame's host time.
    # Finished rays stay in the list and march no samples (no compaction, no sync for it).
    with checks.disabled():
        for start in range(0, n_rays, chunk):
            end = min(start + chunk, n_rays)
            rays = torch.arange(start, end, dtype=torch.int32, device=dev)
            for a, b in runs:
                points, deltas, offsets = march(origins, directions, t_near, t_far, rays, a, b, n_samples,
                                                occupancy, trans, early_stop)
                sigma, rgb = _evaluate(model, points, collective)
                out = composite(sigma, rgb, deltas, offsets)   # black: the background goes behind every run
                n_evaluated += points.shape[0]
                color[start:end] += trans[start:end, None] * out.rgb
                trans[start:end] *= 1.0 - out.opacity
    rgb = color + trans[:, None] * bg
    return RenderedImage(rgb.reshape(height, width, 3), (1.0 - trans).reshape(height, width),
                         int(hits.sum()) * n_samples, n_evaluated)


EVALUATE_SLICE = 1 << 22  # samples per field call: bounds the field's activations whatever the frame size


def _evaluate(field, points: torch.Tensor, collective: bool):
    """sigma (M,), rgb (M, 3) of the field at points, in slices of EVALUATE_SLICE samples."""
    if points.shape[0] == 0 and not collective:
        return torch.zeros(0, device=points.device), torch.zeros(0, 3, device=points.device)
    if collective or points.shape[0] <= EVALUATE_SLICE:  # sharded: one call per run on every rank
        return field(points)
    parts = [field(points[i:i + EVALUATE_SLICE]) for i in range(0, points.shape[0], EVALUATE_SLICE)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


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
