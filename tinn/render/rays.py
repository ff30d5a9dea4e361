"""Camera rays (NeRF/Blender convention) and ray-box intersection.

Convention: a camera-to-world matrix c2w maps camera space, where the camera looks down -z with +y up and +x
right, to world space. Pixel (i, j) (column i, row j from the top) is seen through its centre (i + 0.5, j + 0.5);
the principal point is the image centre.
"""
from __future__ import annotations

import torch

from .. import checks
from ..errors import InputError


def _check_float_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise InputError(f"{name} has dtype {t.dtype}; allowed: a floating dtype (torch.float32)")


def camera_rays(c2w: torch.Tensor, width: int, height: int, focal: float):
    """Rays through every pixel centre of one or several views.

    c2w: (4, 4) or (V, 4, 4) (a (3, 4) or (V, 3, 4) top part works too). Returns origins (R, 3) and unit
    directions (R, 3), R = V * height * width, ordered view-major then row-major (ray = (v * H + j) * W + i).
    Computed in c2w's dtype on c2w's device.
    """
    _check_float_tensor("c2w", c2w)
    if c2w.dim() == 2:
        c2w = c2w[None]
    if c2w.dim() != 3 or c2w.shape[1] not in (3, 4) or c2w.shape[2] != 4:
        raise InputError(f"c2w must have shape (4, 4) or (V, 4, 4), got {tuple(c2w.shape)}")
    width, height = int(width), int(height)
    if width <= 0 or height <= 0:
        raise InputError(f"width and height must be positive, got width={width}, height={height}")
    focal = float(focal)
    if not focal > 0:
        raise InputError(f"focal must be a positive number of pixels, got {focal}")
    dt, dev = c2w.dtype, c2w.device
    jj, ii = torch.meshgrid(torch.arange(height, dtype=dt, device=dev), torch.arange(width, dtype=dt, device=dev),
                            indexing="ij")  # (H, W)
    cam = pixel_directions(ii, jj, width, height, focal)
    rot = c2w[:, :3, :3]  # (V, 3, 3)
    dirs = torch.einsum("vab,hwb->vhwa", rot, cam)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    origins = c2w[:, None, None, :3, 3].expand_as(dirs)
    return origins.reshape(-1, 3).contiguous(), dirs.reshape(-1, 3).contiguous()


def pixel_directions(column: torch.Tensor, row: torch.Tensor, width, height, focal) -> torch.Tensor:
    """Camera-space directions (..., 3), not normalised, through the centres of pixels (column, row) of a
    width x height frame whose focal length is `focal` pixels (the module's convention). The sizes and focal length
    broadcast against the pixels: numbers for one frame, or a tensor per pixel for pixels of frames of several
    sizes."""
    x = (column + 0.5 - 0.5 * width) / focal
    return torch.stack([x, -(row + 0.5 - 0.5 * height) / focal, torch.full_like(x, -1.0)], dim=-1)


def pixel_radius(focal: float) -> float:
    """Angular radius of one pixel's cone: half a pixel's width at unit distance, 0.5 / focal.

    A sample at distance t along a (unit) ray covers a disc of radius about t * pixel_radius(focal) (used to
    pick a level of detail). Off-axis pixels are slightly smaller in angle; this ignores it.
    """
    focal = float(focal)
    if not focal > 0:
        raise InputError(f"focal must be a positive number of pixels, got {focal}")
    return 0.5 / focal


def ray_box(origins: torch.Tensor, directions: torch.Tensor, box_min, box_max):
    """Slab test of rays against an axis-aligned box.

    origins, directions: (R, 3); box_min, box_max: (3,) tensors or sequences. Returns t_near, t_far (R,) with
    t_near clamped to >= 0 (a ray starting inside the box starts at 0); a ray that misses has t_far <= t_near.
    """
    _check_float_tensor("origins", origins)
    _check_float_tensor("directions", directions)
    if origins.dim() != 2 or origins.shape[1] != 3:
        raise InputError(f"origins must have shape (R, 3), got {tuple(origins.shape)}")
    if directions.shape != origins.shape:
        raise InputError(f"directions must have the shape of origins {tuple(origins.shape)}, got {tuple(directions.shape)}")
    lo = torch.as_tensor(box_min, dtype=origins.dtype, device=origins.device).reshape(-1)
    hi = torch.as_tensor(box_max, dtype=origins.dtype, device=origins.device).reshape(-1)
    if lo.shape != (3,) or hi.shape != (3,):
        raise InputError(f"box_min and box_max must have 3 entries, got {tuple(lo.shape)} and {tuple(hi.shape)}")
    # Reading the comparison waits for the device: skipped where the caller vouches for the box (tinn's fields
    # validate theirs when built; the training steps run with the sync checks off).
    if checks.sync_checks_enabled() and not bool((hi > lo).all()):
        raise InputError(f"box_max must exceed box_min on every axis, got box_min={lo.tolist()}, box_max={hi.tolist()}")
    # Axis-parallel rays: a tiny direction component instead of 0 keeps 0 * inf (a NaN) out of the slabs.
    tiny = torch.finfo(directions.dtype).tiny ** 0.5
    d = torch.where(directions.abs() < tiny, tiny, directions)
    inv = 1.0 / d
    t0 = (lo - origins) * inv
    t1 = (hi - origins) * inv
    t_near = torch.minimum(t0, t1).amax(dim=1).clamp_min(0.0)
    t_far = torch.maximum(t0, t1).amin(dim=1)
    return t_near, t_far
