"""Radiance fields made of tinn networks, rendered with `tinn.render` and trained on posed images.

A *field* is a torch module with `box_min`, `box_max` ((3,) tensors: where it is defined) and
`forward(points (M, 3)) -> (sigma (M,), rgb (M, 3))`. `HashGridField` (one hash grid + one MLP, the
teacher) and `tinn.scenes.kilonerf.KiloNeRF` (a grid of tiny networks) are fields; anything with
that shape renders and trains with the functions here:

- `render_rays` / `render_image`: stratified samples inside the box, optionally only those in
  occupied voxels (`tinn.render.sampling.pack`), networks evaluated on the kept samples only,
  composited with `tinn.render.compositing.composite` (whose backward trains the networks).
- `PhotometricTrainer`: random rays from all training views, L2 to the pixel colours, tinn Adam.
- `psnr`, `timed`, `seconds_per_frame`.

Outputs: rgb = sigmoid(raw[1:4]); sigma = `density_activation(raw[0])`, a truncated exponential
(exp with its argument clamped to <= 15, as in instant-ngp): densities of the order of 10-100 are
reached from small raw values, which tiny networks find easier than a softplus ramp.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .. import runtime
from ..errors import InputError
from ..models import NetworkWithInputEncoding
from ..optimizers import create_optimizer
from ..render import camera_rays, composite, pack, ray_box, stratified_t
from ..tasks.image import psnr  # noqa: F401  (the project's one PSNR, offered here next to the scene helpers)
from .occupancy import as_box, check_points

MAX_LOG_DENSITY = 15.0


def density_activation(raw: torch.Tensor) -> torch.Tensor:
    """exp(min(raw, 15)): the truncated exponential density (gradient 0 above the clamp)."""
    return torch.exp(raw.clamp(max=MAX_LOG_DENSITY))


def activate(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, 4) raw network outputs -> sigma (M,), rgb (M, 3)."""
    return density_activation(raw[:, 0]).contiguous(), torch.sigmoid(raw[:, 1:4]).contiguous()


class HashGridField(torch.nn.Module):
    """One multiresolution hash grid + one MLP over the whole box (the teacher of distillation)."""

    def __init__(self, box_min, box_max, n_levels: int = 16, n_features_per_level: int = 2,
                 log2_hashmap_size: int = 19, base_resolution: int = 16, finest_resolution: int = 512,
                 n_neurons: int = 64, n_hidden_layers: int = 2, seed: int = 1337):
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
        self.model = NetworkWithInputEncoding(3, 4, self.encoding_config, self.network_config, seed=seed)

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


# ---- rendering ----------------------------------------------------------------------------------

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
    if index.numel():
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


# ---- photometric training -------------------------------------------------------------------------

def adam(named_parameters, learning_rate: float):
    """tinn's Adam with NeRF-style moments (beta2 0.99, tiny epsilon: hash-table entries see sparse gradients)."""
    return create_optimizer({"otype": "Adam", "learning_rate": learning_rate, "beta1": 0.9, "beta2": 0.99,
                             "epsilon": 1e-15}, named_parameters)


class DecayingStep:
    """Shared by the scene trainers: an optimizer step under an exponential learning-rate decay.

    Subclasses set `optimizer`, `base_lr`, `total_steps` (None = constant rate), `final_lr_factor`
    and `step_count = 0`, and call `_optimize(loss)` from their `step()`.
    """

    def _optimize(self, loss: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.step_count += 1
        return loss.detach()

    def _apply_schedule(self) -> None:
        if self.total_steps:
            progress = min(self.step_count / self.total_steps, 1.0)
            self.optimizer.learning_rate = self.base_lr * self.final_lr_factor ** progress

    @property
    def learning_rate(self) -> float:
        return self.optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.base_lr = float(value)
        self.optimizer.learning_rate = value


class PhotometricTrainer(DecayingStep):
    """Trains a field on posed images: each `step()` renders `batch_rays` random training rays (jittered samples,
    empty space skipped when an occupancy grid is given) and takes one Adam step on the mean squared colour error.

    The learning rate decays exponentially from `learning_rate` to `learning_rate * final_lr_factor` over
    `total_steps` (constant when total_steps is None).
    """

    def __init__(self, field, data, n_samples: int, batch_rays: int, learning_rate: float, occupancy=None,
                 total_steps: int | None = None, final_lr_factor: float = 0.1, seed: int = 0):
        if isinstance(batch_rays, bool) or not isinstance(batch_rays, int) or batch_rays < 1:
            raise InputError(f"batch_rays={batch_rays!r} must be an integer >= 1")
        self.field, self.n_samples, self.batch_rays, self.occupancy = field, int(n_samples), batch_rays, occupancy
        dev = runtime.device()
        origins, directions, colors = data.rays()
        self.origins = origins.to(dev, torch.float32).contiguous()
        self.directions = directions.to(dev, torch.float32).contiguous()
        self.colors = colors.to(dev, torch.float32).contiguous()
        self.background = data.background.to(dev, torch.float32)
        self.optimizer = adam(field.named_parameters(), learning_rate)
        self.base_lr, self.total_steps, self.final_lr_factor = float(learning_rate), total_steps, float(final_lr_factor)
        self.generator = torch.Generator(device=dev).manual_seed(seed)
        self.step_count = 0

    def step(self) -> torch.Tensor:
        self._apply_schedule()
        pick = torch.randint(0, self.origins.shape[0], (self.batch_rays,), device=self.origins.device,
                             generator=self.generator)
        out = render_rays(self.field, self.origins[pick], self.directions[pick], self.n_samples, self.background,
                          self.occupancy, jitter=True, generator=self.generator)
        return self._optimize(((out.rgb - self.colors[pick]) ** 2).mean())
