"""The visual hull of posed images: the voxels of the scene box that the views do not show as background.

An object lies inside the intersection of its silhouettes' cones, so a voxel that (nearly) every view sees as
background holds none of it. `visual_hull` votes per voxel centre and returns the kept voxels as an
`OccupancyGrid`; an octree is built over those voxels (`tinn.scenes.training.octree_training.hull_octree`), and
an `OctreeField` given the grid as its `hull` evaluates no sample outside it, in training or in rendering.

Why a field may skip the space outside: a training ray that meets no hull voxel ends on a background pixel of
its own view, and every other ray crosses that space only where some view saw background. Without the hull,
training spends most of its samples there (about nine in ten for a mesh capture with the octree's nine nodes
over the whole box; docs/design-notes.md, "Samples outside the visual hull") fitting zero density.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ... import runtime
from ...errors import ConfigError
from ...render.rays import pixel_radius
from .occupancy import OccupancyGrid, VoxelBox
from .octree_occupancy import LevelOccupancy

MAX_HULL_VOTE_RESOLUTION = 512
ALPHA_COVERED = 1e-3  # images with alpha: a pixel counts as foreground above this coverage, whatever its colour


def hull_votes(images, resolution: int, tolerance: float = 0.05, keep_fraction: float = 0.9,
               chunk: int = 1 << 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept (R^3,) bool, centres (R^3, 3)): voxel centres of the images' box, ix slowest, and whether, among the
    views that see a centre, at least `keep_fraction` show a pixel there that differs from the background by more
    than `tolerance`, or that the object covers where the images have alpha (a lenient vote: without alpha,
    background-coloured parts of an object would otherwise carve it away)."""
    if isinstance(resolution, bool) or not isinstance(resolution, int) or \
            not 2 <= resolution <= MAX_HULL_VOTE_RESOLUTION:
        raise ConfigError(f"resolution={resolution!r} must be an integer in 2..{MAX_HULL_VOTE_RESOLUTION}")
    if not (isinstance(keep_fraction, (int, float)) and 0.0 < keep_fraction <= 1.0):
        raise ConfigError(f"keep_fraction={keep_fraction!r} must be in (0, 1]")
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0.0):
        raise ConfigError(f"tolerance={tolerance!r} must be a number >= 0")
    dev = runtime.device()
    images = images.to(dev)
    lo, hi = images.box_min.float(), images.box_max.float()
    axis = (torch.arange(resolution, device=dev, dtype=torch.float32) + 0.5) / resolution
    grid = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
    centres = lo + grid * (hi - lo)
    foreground = ((images.images - images.background.float()).abs().amax(dim=-1) > tolerance)  # (V, H, W)
    if images.alpha is not None:
        # A pixel the object covers at all: a part coloured like the background is no less there.
        foreground |= images.alpha[..., 0] > ALPHA_COVERED
    w2c = torch.linalg.inv(images.c2w.float())                                             # (V, 4, 4)
    kept = []
    for start in range(0, centres.shape[0], chunk):
        p = centres[start:start + chunk]
        cam = torch.einsum("vab,nb->vna", w2c[:, :3, :3], p) + w2c[:, None, :3, 3]        # (V, n, 3)
        depth = -cam[..., 2]
        safe = depth.clamp(min=1e-6)
        col = torch.floor(cam[..., 0] / safe * images.focal + images.width / 2).long()
        row = torch.floor(-cam[..., 1] / safe * images.focal + images.height / 2).long()
        seen = (depth > 1e-6) & (col >= 0) & (col < images.width) & (row >= 0) & (row < images.height)
        view = torch.arange(len(images), device=dev)[:, None].expand_as(col)
        fg = foreground[view, row.clamp(0, images.height - 1), col.clamp(0, images.width - 1)] & seen
        n_seen = seen.sum(dim=0)
        kept.append((n_seen > 0) & (fg.sum(dim=0) >= keep_fraction * n_seen))
    return torch.cat(kept), centres


def dilated(keep: torch.Tensor, resolution: int, dilate: int) -> torch.Tensor:
    """(R^3,) bool `keep` grown by `dilate` voxels along every axis and diagonal."""
    if isinstance(dilate, bool) or not isinstance(dilate, int) or not 0 <= dilate < resolution:
        raise ConfigError(f"dilate={dilate!r} must be an integer in 0..{resolution - 1}")
    if not dilate:
        return keep
    cube = keep.view(1, 1, resolution, resolution, resolution).float()
    return F.max_pool3d(cube, 2 * dilate + 1, stride=1, padding=dilate).view(-1) > 0


# Voxels per box edge of the hull a field skips samples outside of.
DEFAULT_HULL_RESOLUTION = 128


def footprint_voxels(images, resolution: int) -> int:
    """How many voxels the widest pixel footprint of the views spans inside the box (at least 1): the margin a
    hull needs. A voxel whose centre a view sees as background may still hold surface that covers part of a
    pixel; at low resolution a pixel spans several voxels, and one voxel of margin would carve that surface."""
    centre = (images.box_min + images.box_max).float() / 2
    extent = (images.box_max - images.box_min).float()
    distance = (images.c2w[:, :3, 3].float() - centre.to(images.c2w.device)).norm(dim=1)
    footprint = 2.0 * (float(distance.max()) + float(extent.norm()) / 2) * pixel_radius(images.focal)
    return max(1, math.ceil(footprint / (float(extent.min()) / resolution)))


@torch.no_grad()
def visual_hull(images, resolution: int = DEFAULT_HULL_RESOLUTION, dilate: int | None = None,
                tolerance: float = 0.05, keep_fraction: float = 0.9) -> OccupancyGrid:
    """The images' visual hull over their box as an `OccupancyGrid` (`hull_votes`), grown by `dilate` voxels (None:
    `footprint_voxels`, a pixel's width or at least one voxel)."""
    keep, _ = hull_votes(images, resolution, tolerance, keep_fraction)
    if dilate is None:
        dilate = min(resolution - 1, footprint_voxels(images, resolution))
    keep = dilated(keep, resolution, dilate)
    return OccupancyGrid(keep.view(resolution, resolution, resolution), images.box_min.float(),
                         images.box_max.float())


def within_hull(occupancy: VoxelBox, hull: VoxelBox) -> VoxelBox:
    """`occupancy` with every voxel outside `hull` emptied, a grid of its own kind and resolution. The hull is
    brought to that resolution conservatively: a voxel counts as inside where any hull voxel it overlaps is."""
    r = occupancy.resolution
    inside = hull.occupied if hull.occupied.dim() == 4 else hull.occupied[None]         # (D or 1, Rh, Rh, Rh)
    cube = inside.float()[:, None]
    if hull.resolution >= r:
        cube = F.adaptive_max_pool3d(cube, r)   # each voxel: every hull voxel it overlaps
    else:
        # Grown by one hull voxel first: a voxel may straddle two hull voxels, nearest sampling sees one.
        cube = F.interpolate(F.max_pool3d(cube, 3, stride=1, padding=1), size=(r, r, r), mode="nearest")
    inside = cube[:, 0] > 0
    occupied = occupancy.occupied
    if occupied.dim() == 4:
        if inside.shape[0] not in (1, occupied.shape[0]):
            inside = inside[torch.arange(occupied.shape[0], device=inside.device).clamp(max=inside.shape[0] - 1)]
        result = occupied & inside.to(occupied.device)
        return LevelOccupancy(result, occupancy.box_min, occupancy.box_max)
    return OccupancyGrid(occupied & inside.to(occupied.device).any(dim=0), occupancy.box_min, occupancy.box_max)
