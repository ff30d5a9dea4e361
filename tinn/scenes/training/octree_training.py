"""Training an `OctreeField` from posed images through image pyramids, and evaluating it.

Pyramid level k is the image set downscaled by 2^k: its pixels have 2^k times wider footprints, so its
samples select nodes about k levels coarser. Every batch draws rays from every pyramid level, so every octree
level gets trained (coarse nodes learn the low-pass scene the coarse images show). The full resolution gets
`finest_share` of each batch and the coarser levels split the rest (level k a share proportional to 2^-k): the
rays of one pyramid level train only the nodes of one octree depth, so the share is the fraction of the steps
the finest nodes see.
The loss is photometric L2 through `tinn.render.composite`; torch autograd carries it into the node array.
"""
from __future__ import annotations

import math
import time

import torch

from ... import checks, runtime
from ...errors import ConfigError, InputError
from ...trainer import Trainer
from ...render import octree as octree_rendering
from ...render.rays import pixel_directions, pixel_radius
from ...tasks.image import psnr
from .photometric import SceneTrainer
from ..fields.octree_field import OctreeField, photometric_loss

# The full resolution's share of an OctreeTrainer batch: its rays are the only ones that train the finest
# nodes, which draw the closest views (docs/design-notes.md, octree quality).
DEFAULT_FINEST_SHARE = 0.8

# Batches an OctreeTrainer draws at once (`batches_per_draw=None`): up to this many, within this many samples
# (each sample's node, local coordinates and bin length held until its step).
MAX_BATCHES_PER_DRAW, MAX_DRAWN_SAMPLES = 8, 1 << 24

# `level_dither`'s limit: a footprint shrunk by more than 2^8 selects the deepest node of any tree the capture
# rule builds, so more only spends random numbers.
MAX_LEVEL_DITHER = 8.0

DEFAULT_OPTIMIZER = {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15,
                     "l2_reg": 1e-6}


def image_pyramid(images, n_levels: int) -> list:
    """[images, images.downscaled(2), images.downscaled(4), ...]: n_levels entries, each at least 1 pixel wide."""
    if not isinstance(n_levels, int) or isinstance(n_levels, bool) or n_levels < 1:
        raise ConfigError(f"pyramid_levels={n_levels!r} must be an integer >= 1")
    factor = 2 ** (n_levels - 1)
    if images.width // factor < 1 or images.height // factor < 1:
        raise ConfigError(f"pyramid_levels={n_levels} downscales {images.width}x{images.height} images by {factor}: "
                          f"below one pixel; allowed: at most {int(math.log2(min(images.width, images.height))) + 1}")
    if images.width % factor or images.height % factor:
        raise ConfigError(f"pyramid_levels={n_levels} needs width and height divisible by {factor}, got "
                          f"{images.width}x{images.height}; lower pyramid_levels or change the resolution")
    return [images] + [images.downscaled(2 ** k) for k in range(1, n_levels)]


class PyramidRays:
    """Every ray of every pyramid level (target colours and coverage on the device; origins, directions and pixel
    radius computed from each drawn ray's camera and pixel, so a capture costs its pixels' colours and no more: the
    ray stored beside them would take 28 more bytes a pixel, too many for a capture that feeds deep nodes)."""

    def __init__(self, images, n_levels: int, finest_share: float | None = None):
        if finest_share is not None and not (isinstance(finest_share, (int, float)) and 0.0 < finest_share <= 1.0):
            raise ConfigError(f"finest_share={finest_share!r} must be a number in (0, 1] (or None: 2^-k shares)")
        self.finest_share = finest_share
        dev = runtime.device()
        # The pyramid's images are not kept: their colours and coverage are, concatenated, and each level's
        # cameras, size and focal length (what a drawn ray is computed from).
        levels = [level.to(dev) for level in image_pyramid(images, n_levels)]
        self.colors = torch.cat([level.images.reshape(-1, 3) for level in levels]).float().contiguous()
        alphas = [level.alphas() for level in levels]
        self.alpha = torch.cat(alphas).float().contiguous() if all(a is not None for a in alphas) else None
        counts = [len(level) * level.height * level.width for level in levels]
        self.counts = torch.tensor(counts, device=dev)
        self.offsets = torch.tensor([0] + counts[:-1], device=dev).cumsum(0)
        self._cameras = torch.cat([level.c2w[:, :3, :4] for level in levels]).float().contiguous()
        self._first_camera = torch.tensor([0] + [len(level) for level in levels[:-1]], device=dev).cumsum(0)
        self._size = torch.tensor([[level.width, level.height] for level in levels], device=dev)
        self._focal = torch.tensor([float(level.focal) for level in levels], device=dev)
        self._radius = torch.tensor([pixel_radius(level.focal) for level in levels], device=dev)
        # ((batch size, rays drawn), level of every slot), rebuilt when either changes
        self._level_of_slot = (None, None)

    @property
    def n_levels(self) -> int:
        return self.counts.shape[0]

    def level_counts(self, n_rays: int) -> list[int]:
        """Rays per pyramid level in a batch of n_rays: the full resolution `finest_share` of them (None: a
        share proportional to 2^-k for every level k, about half for the full resolution), the coarser levels
        the rest in shares proportional to 2^-k, and every level at least one."""
        if n_rays < self.n_levels:
            raise ConfigError(f"batch of {n_rays} rays cannot cover {self.n_levels} pyramid levels; "
                              f"allowed: >= {self.n_levels}")
        weights = [2.0 ** -k for k in range(self.n_levels)]
        if self.finest_share is not None and self.n_levels > 1:
            rest = sum(weights[1:])
            weights = [self.finest_share] + [(1.0 - self.finest_share) * w / rest for w in weights[1:]]
        counts = [max(1, int(n_rays * w / sum(weights))) for w in weights]
        counts[0] += n_rays - sum(counts)
        return counts

    def sample(self, n_rays: int, generator: torch.Generator | None = None):
        """n_rays random rays, `level_counts(n_rays)` from each pyramid level: (origins, directions, colors,
        radius)."""
        return self.sample_rgba(n_rays, generator)[:4]

    def sample_rgba(self, n_rays: int, generator: torch.Generator | None = None):
        """`sample`, plus the rays' pixel coverage (n_rays, 1) when the images have alpha (else None)."""
        return self.rays_at(torch.rand(n_rays, device=self.counts.device, generator=generator), n_rays)

    def rays_at(self, u: torch.Tensor, n_rays: int):
        """`sample_rgba`'s rays for its uniform numbers `u`, for one or several batches of n_rays back to back
        (each batch `level_counts(n_rays)` rays from each pyramid level)."""
        dev = self.counts.device
        if u.dim() != 1 or u.shape[0] % n_rays:
            raise InputError(f"u must have shape (k * {n_rays},), got {tuple(u.shape)}")
        if self._level_of_slot[0] != (n_rays, u.shape[0]):
            counts = torch.tensor(self.level_counts(n_rays), device=dev)
            level = torch.repeat_interleave(torch.arange(self.n_levels, device=dev), counts)
            self._level_of_slot = ((n_rays, u.shape[0]), level.repeat(u.shape[0] // n_rays))
        level = self._level_of_slot[1]
        count = self.counts[level]
        local = torch.minimum((u * count).long(), count - 1)
        idx = self.offsets[level] + local
        alpha = None if self.alpha is None else self.alpha[idx]
        origins, directions = self._rays(level, local)
        return origins, directions, self.colors[idx], self._radius[level], alpha

    def _rays(self, level: torch.Tensor, local: torch.Tensor):
        """Origins and unit directions of the rays `local` (view-major, then row-major, as
        `tinn.render.camera_rays` orders a level's rays) of the pyramid levels `level`."""
        size, focal = self._size[level], self._focal[level]
        width, pixels = size[:, 0], size[:, 0] * size[:, 1]
        view = local // pixels
        pixel = local - view * pixels
        row = pixel // width
        column = pixel - row * width
        cam = pixel_directions(column.float(), row.float(), width.float(), size[:, 1].float(), focal)
        camera = self._cameras[self._first_camera[level] + view]           # (n, 3, 4)
        directions = torch.bmm(camera[:, :, :3], cam[:, :, None])[:, :, 0]
        directions = directions / directions.norm(dim=1, keepdim=True)
        return camera[:, :, 3].contiguous(), directions


class OctreeTrainer(SceneTrainer):
    """One optimisation step per `step()`: a batch of pyramid rays, composited, L2 against their pixels.
    `finest_share` of every batch comes from the full-resolution images (None: 2^-k shares per level k).
    `batches_per_draw`: how many steps' batches are drawn and assigned at once (None: MAX_BATCHES_PER_DRAW
    within MAX_DRAWN_SAMPLES samples; 1: each the step before its own).

    `level_dither` (0: off): each training ray's footprint is shrunk by 2^-u, u uniform in [0, level_dither), so
    its samples may train nodes up to that many levels finer than the ones the level rule gives them at render
    time. A deep node is otherwise fit only by the views close enough to select it; with close-up captures
    those are few, and the deeper tree lost to a shallower one on them (docs/guides/scenes.md)."""

    def __init__(self, field: OctreeField, images, pyramid_levels: int = 4, n_samples: int = 64,
                 batch_rays: int = 4096, optimizer_config: dict | None = None, seed: int = 0,
                 random_background: bool = True, finest_share: float | None = DEFAULT_FINEST_SHARE,
                 batches_per_draw: int | None = None, level_dither: float = 0.0):
        for name, value, lo in (("n_samples", n_samples, 1), ("batch_rays", batch_rays, 1)):
            if not isinstance(value, int) or value < lo:
                raise ConfigError(f"{name}={value!r} must be an integer >= {lo}")
        if isinstance(level_dither, bool) or not isinstance(level_dither, (int, float)) \
                or not 0.0 <= level_dither <= MAX_LEVEL_DITHER:
            raise ConfigError(f"level_dither={level_dither!r} must be a number in [0, {MAX_LEVEL_DITHER}] (levels)")
        self.level_dither = float(level_dither)
        self.field, self.n_samples, self.batch_rays = field, n_samples, batch_rays
        self.rays = PyramidRays(images, pyramid_levels, finest_share)
        self.background = images.background.to(runtime.device()).float()
        # Images with alpha train on a random background per ray, as PhotometricTrainer does.
        self.random_background = bool(random_background) and self.rays.alpha is not None
        self.optimizer_config = dict(optimizer_config or DEFAULT_OPTIMIZER)
        self.trainer = Trainer(field.model, self.loss, self.optimizer_config)
        self.generator = torch.Generator(device=runtime.device()).manual_seed(seed)
        self.batches_per_draw = self._batches_per_draw(batches_per_draw)
        self.train_seconds = 0.0
        self._ahead: list[tuple] = []  # batches drawn and not yet evaluated, the next step's first (see loss)

    def _batches_per_draw(self, wanted: int | None) -> int:
        if wanted is None:
            return max(1, min(MAX_BATCHES_PER_DRAW, MAX_DRAWN_SAMPLES // (self.batch_rays * self.n_samples)))
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
            raise ConfigError(f"batches_per_draw={wanted!r} must be an integer >= 1 (or None: up to "
                              f"{MAX_BATCHES_PER_DRAW}, within {MAX_DRAWN_SAMPLES} samples)")
        return wanted

    def draw_batch(self) -> tuple:
        """`batch_rays` random pyramid rays (on random backgrounds where the images have alpha), assigned to their
        nodes: (target colours, background, `AssignedRays`); only device work is issued."""
        return self.draw_batches(1)[0]

    def draw_batches(self, n_batches: int) -> list[tuple]:
        """`draw_batch` for the next `n_batches` steps at once: the random numbers of each batch drawn as that
        batch alone would draw them, in the same order, then the rays of all of them gathered, cut by the box,
        sampled and assigned to their nodes together (one set of launches for all)."""
        n_rays, dev, gen = self.batch_rays, self.rays.counts.device, self.generator
        ray_u, backgrounds, jitter, dither = [], [], [], []
        for _ in range(n_batches):
            ray_u.append(torch.rand(n_rays, device=dev, generator=gen))
            if self.random_background:
                backgrounds.append(torch.rand(n_rays, 3, device=dev, generator=gen))
            jitter.append(torch.rand(n_rays, self.n_samples, device=dev, generator=gen))
            if self.level_dither:  # drawn only when on: without it every batch's random numbers are as before
                dither.append(torch.rand(n_rays, device=dev, generator=gen))
        cat = (lambda parts: parts[0]) if n_batches == 1 else torch.cat
        origins, directions, colors, radius, alpha = self.rays.rays_at(cat(ray_u), n_rays)
        if self.level_dither:
            radius = radius * torch.exp2(-self.level_dither * cat(dither))
        background = self.background
        if self.random_background:
            background = cat(backgrounds)
            colors = colors + (1.0 - alpha) * (background - self.background)
        assigned = octree_rendering.assign_rays(self.field, origins, directions, radius, self.n_samples, jitter=True,
                                                uniforms=cat(jitter))
        batches = octree_rendering.split_assigned(assigned, n_batches)
        rows = [slice(b * n_rays, (b + 1) * n_rays) for b in range(n_batches)]
        return [(colors[r], background[r] if self.random_background else background, a)
                for r, a in zip(rows, batches)]

    def loss(self) -> torch.Tensor:
        """The step's batch was drawn and assigned before this step (the nodes do not depend on the parameters):
        `batches_per_draw` batches at a time, the next draw issued in the step that takes the last of the
        previous one, before that batch is evaluated: the counts of assigned samples reach the host while the
        device works, so the host does not wait for the device within a step, and one draw's torch ops and
        launches serve several steps (the host's issue time bounds a step). The batches and random numbers are
        those of drawing each batch in its own step."""
        if not self._ahead:
            self._ahead = self.draw_batches(self.batches_per_draw)
        batch = self._ahead.pop(0)
        if not self._ahead:
            self._ahead = self.draw_batches(self.batches_per_draw)
        colors, background, assigned = batch
        with checks.disabled():  # shapes and ids come from this pipeline; skip the syncing scans
            result = octree_rendering.shade_assigned(self.field, assigned, background)
        return photometric_loss(result.rgb, colors)

    def step(self) -> torch.Tensor:
        t0 = time.perf_counter()
        loss = super().step()
        self.train_seconds += time.perf_counter() - t0
        return loss


@torch.no_grad()
def evaluate(field: OctreeField, images, n_samples: int, views=None, **render) -> dict:
    """Render views of `images` (all by default); PSNR over them (and per camera distance where the views stand on
    a few spheres, `views_by_distance`), per-frame touched-node reports and timing.
    `render`: options of `OctreeField.render_image` (occupancy, early_stop, segments)."""
    if len(images) == 0:
        raise InputError("evaluate needs at least one view")
    views = list(range(len(images))) if views is None else list(views)
    dev = runtime.device()
    images = images.to(dev)
    renders, reports, seconds = [], [], []
    for v in views:
        runtime.sync()
        t0 = time.perf_counter()
        frame = field.render_image(images.c2w[v], images.width, images.height, images.focal, n_samples,
                                   background=images.background.float(), **render)
        runtime.sync()
        seconds.append(time.perf_counter() - t0)
        renders.append(frame["image"])
        reports.append(field.touched_report(frame["touched"]))
    pred = torch.stack(renders)
    ref = images.images[views].to(dev)
    mean_s = sum(seconds) / len(seconds)
    groups = views_by_distance(images, views)
    # Views on a few spheres (a capture with close-ups); a capture whose views each stand at their own distance
    # has no spheres to report.
    rings = 1 < len(groups) <= len(views) // 2
    by_distance = {d: psnr(pred[rows], ref[rows]) for d, rows in groups.items()} if rings else {}
    return {"psnr": psnr(pred, ref), "psnr_by_distance": by_distance, "renders": pred, "reports": reports,
            "render_seconds": mean_s,
            "fps": 1.0 / mean_s if mean_s > 0 else float("inf"),
            "fraction_touched": sum(r["fraction_touched"] for r in reports) / len(reports)}


def views_by_distance(images, views=None) -> dict:
    """{distance: positions in `views` (all by default)} of the views grouped by their camera's distance from the
    scene box's centre, rounded to 0.01, nearest first: a capture with close-ups (cameras on several spheres) is
    judged sphere by sphere, as one PSNR pooled over all of them hides what the closest views ask."""
    views = list(range(len(images))) if views is None else list(views)
    centre = (images.box_min + images.box_max).float().to(images.c2w.device) / 2
    distances = (images.c2w[views, :3, 3].float() - centre).norm(dim=1).round(decimals=2).tolist()
    return {f"{d:g}": [k for k, x in enumerate(distances) if x == d] for d in sorted(set(distances))}


@torch.no_grad()
def foreground_points(images, resolution: int = 64, tolerance: float = 0.05, keep_fraction: float = 0.9,
                      chunk: int = 1 << 16, dilate: int = 0) -> torch.Tensor:
    """Visual hull of posed images, as voxel centres (n, 3): the points to build an octree over when a scene
    has no surface points (real captures).

    A voxel centre inside the box is kept when, among the views that see it, at least `keep_fraction` show a
    pixel that differs from the background by more than `tolerance`, or that the object covers where the images
    have alpha (`visual_hull.hull_votes`). `dilate` voxels
    are then added around every kept one: a voxel whose centre falls outside the hull can still hold some of the
    surface near its faces, and an octree built over the centres alone would prune that surface away.
    """
    from ..acceleration.visual_hull import dilated, hull_votes

    keep, centres = hull_votes(images, resolution, tolerance, keep_fraction, chunk)
    return centres[dilated(keep, resolution, dilate)]


# Hull voxels per edge of a deepest node, and the most per box edge: sampled at voxel centres only, a coarser
# hull pruned leaves that hold a sliver of the surface under one of their faces, between centres, and that
# surface then renders as background (docs/design-notes.md, octree quality). Voxels finer than
# HULL_VOXELS_PER_PIXEL per pixel of the image width carve nothing more.
HULL_VOXELS_PER_LEAF, MAX_HULL_RESOLUTION, HULL_VOXELS_PER_PIXEL = 32, 256, 2


def hull_octree(images, depth: int, min_points: int = 8):
    """The octree `depth` deep over the visual hull of posed images (`foreground_points`), for captures without
    surface points: the hull sampled HULL_VOXELS_PER_LEAF voxels per deepest-node edge (at most
    MAX_HULL_RESOLUTION per box edge, and HULL_VOXELS_PER_PIXEL per pixel of the image width) and dilated by one
    voxel, so that a node is pruned only where no voxel next to it holds any of the object."""
    from ..acceleration.octree import Octree

    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ConfigError(f"depth={depth!r} must be an integer >= 0")
    resolution = max(4, min(MAX_HULL_RESOLUTION, HULL_VOXELS_PER_LEAF * 2 ** depth,
                            HULL_VOXELS_PER_PIXEL * images.width))
    points = foreground_points(images, resolution=resolution, dilate=1)
    dev = points.device
    return Octree.build(points.float(), images.box_min.to(dev), images.box_max.to(dev), depth, min_points)


def octree_over(images, depth: int, min_points: int = 8, points=None):
    """The octree `depth` deep over `points` when given (a scene's surface points), else over the posed images'
    visual hull (`hull_octree`)."""
    if points is None:
        return hull_octree(images, depth, min_points)
    from ..acceleration.octree import Octree

    points = torch.as_tensor(points)
    return Octree.build(points.float(), images.box_min.to(points.device), images.box_max.to(points.device), depth,
                        min_points)
