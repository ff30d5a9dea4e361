"""Samples along rays: stratified distances, and packing of the samples worth evaluating."""
from __future__ import annotations

import torch

from ..errors import InputError


def stratified_t(t_near: torch.Tensor, t_far: torch.Tensor, n_samples: int, jitter: bool, generator=None,
                 uniforms: torch.Tensor | None = None):
    """n_samples equal bins between t_near and t_far per ray; one sample per bin.

    Returns t (R, S) (bin midpoints, or a uniform point in each bin with jitter) and deltas (R, S), the bin
    lengths used by the compositing quadrature. Rays that miss (t_far <= t_near) get deltas 0, so they composite
    to pure background. `generator` is a torch.Generator on the rays' device (used only with jitter);
    `uniforms` (R, S), jitter's random numbers drawn by the caller instead (a batch drawn in parts).
    """
    for name, v in (("t_near", t_near), ("t_far", t_far)):
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.dim() != 1:
            raise InputError(f"{name} must be a 1-D floating torch.Tensor (R,), got "
                             f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
    if t_far.shape != t_near.shape:
        raise InputError(f"t_far has shape {tuple(t_far.shape)}; expected the shape of t_near {tuple(t_near.shape)}")
    n_samples = int(n_samples)
    if n_samples < 1:
        raise InputError(f"n_samples must be >= 1, got {n_samples}")
    length = (t_far - t_near).clamp_min(0.0)
    step = (length / n_samples)[:, None]
    k = torch.arange(n_samples, dtype=t_near.dtype, device=t_near.device)[None, :]
    if jitter and uniforms is not None:
        if uniforms.shape != (t_near.shape[0], n_samples):
            raise InputError(f"uniforms must have shape ({t_near.shape[0]}, {n_samples}), got {tuple(uniforms.shape)}")
        u = uniforms
    elif jitter:
        u = torch.rand(t_near.shape[0], n_samples, dtype=t_near.dtype, device=t_near.device, generator=generator)
    else:
        u = torch.full((1, n_samples), 0.5, dtype=t_near.dtype, device=t_near.device)
    t = t_near[:, None] + (k + u) * step
    deltas = step.expand(-1, n_samples).contiguous()
    return t.contiguous(), deltas


def pack(mask: torch.Tensor):
    """Keep the masked samples of each ray, front to back.

    mask: (R, S) bool. Returns sample_index (M,) int64 into the flattened (R * S) samples and ray_offsets
    (R + 1,) int32: ray r owns packed samples ray_offsets[r]:ray_offsets[r + 1]. Gather per-sample data with
    `x.reshape(R * S, ...)[sample_index]`.
    """
    offsets = ray_offsets(mask)
    return torch.nonzero(mask.reshape(-1), as_tuple=False).reshape(-1), offsets


def positions(mask: torch.Tensor, size: int, fill_value: int = -1) -> torch.Tensor:
    """Flat positions (int64, ascending) of the True entries of `mask`, exactly `size` of them (cut after `size`,
    padded with `fill_value`), without reading the device: the caller knows the size (torch.nonzero would read
    the count). A torch without `nonzero_static` gets the same result through `torch.nonzero`, which waits."""
    flat = mask.reshape(-1)
    if hasattr(torch, "nonzero_static"):
        return torch.nonzero_static(flat, size=size, fill_value=fill_value).reshape(-1)
    found = torch.nonzero(flat).reshape(-1)[:size]
    return torch.cat([found, found.new_full((size - found.numel(),), fill_value)])


def ray_offsets(mask: torch.Tensor) -> torch.Tensor:
    """(R + 1,) int32 offsets of each ray's kept samples in `pack`'s order, from the (R, S) bool mask, on the
    device (nothing is read back)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        raise InputError(f"mask must be a 2-D torch.bool tensor (R, S), got "
                         f"{(mask.dtype, tuple(mask.shape)) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    if mask.numel() >= 2**31:
        raise InputError(f"mask has {mask.numel()} samples; ray_offsets are int32, pack at most 2**31 - 1 at once")
    offsets = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=mask.device)
    torch.cumsum(mask.sum(dim=1, dtype=torch.int32), 0, out=offsets[1:])
    return offsets


def march(origins: torch.Tensor, directions: torch.Tensor, t_near: torch.Tensor, t_far: torch.Tensor,
          rays: torch.Tensor, first_bin: int, end_bin: int, n_samples: int, occupancy=None,
          transmittance: torch.Tensor | None = None, early_stop: float = 0.0):
    """The kept samples of bins first_bin..end_bin-1 of the listed rays, packed, without a rays x samples array.

    Bins and sample points are `stratified_t`'s without jitter (n_samples bins over [t_near, t_far]). A sample is
    kept where `occupancy` (an object with `occupied` (G, G, G) bool, `box_min`, `box_max`, `voxel_size`, as
    `tinn.scenes.OccupancyGrid`) says it is occupied, or always with occupancy None; rays that miss the box
    keep none, and so do rays whose `transmittance` (R,) is at most `early_stop` > 0 (finished rays). rays: (K,) int32 indices into origins. Returns points (M, 3), deltas (M,) and ray_offsets
    (K + 1,) int32 (the listed ray k owns samples ray_offsets[k]:ray_offsets[k + 1], front to back).
    """
    from ..kernels import march as march_kernels

    if rays.dtype != torch.int32 or rays.dim() != 1:
        raise InputError(f"rays must be a 1-D torch.int32 tensor of ray indices, got {rays.dtype} {tuple(rays.shape)}")
    if not 0 <= first_bin <= end_bin <= n_samples:
        raise InputError(f"bins {first_bin}..{end_bin} must lie in 0..n_samples={n_samples}")
    dev = origins.device
    if occupancy is None:
        box = torch.zeros(9, device=dev)
        occupied, resolution = torch.zeros(1, dtype=torch.uint8, device=dev), 0
    elif occupancy.occupied.dim() != 3:
        raise InputError(f"occupancy must hold one (G, G, G) grid, got occupied of shape {tuple(occupancy.occupied.shape)}")
    else:
        box = torch.cat([occupancy.box_min, occupancy.box_max, occupancy.voxel_size.expand(3)]).float().to(dev)
        occupied, resolution = occupancy.occupied.reshape(-1).view(torch.uint8), int(occupancy.resolution)
    if transmittance is None:
        transmittance = torch.ones(origins.shape[0], device=dev)
    cutoff = float(early_stop) if early_stop > 0 else -1.0
    args = (origins.contiguous(), directions.contiguous(), t_near.contiguous(), t_far.contiguous(),
            transmittance.contiguous(), cutoff, rays.contiguous(), int(first_bin), int(end_bin), int(n_samples), box.contiguous(), occupied.contiguous(),
            resolution)
    k = rays.shape[0]
    ray_offsets = torch.zeros(k + 1, dtype=torch.int32, device=dev)
    if k:
        counts = torch.empty(k, dtype=torch.int32, device=dev)
        march_kernels.march_count(*args, counts)
        torch.cumsum(counts, 0, out=ray_offsets[1:])
    m = int(ray_offsets[-1])
    if m >= 2**31 - 1:
        raise InputError(f"{m} kept samples exceed int32 offsets; march fewer rays at once")
    points = torch.empty(m, 3, device=dev)
    deltas = torch.empty(m, device=dev)
    if m:
        march_kernels.march_emit(*args, ray_offsets, points, deltas)
    return points, deltas, ray_offsets


def frame_runs(n_samples: int, segments: int, early_stop: float, chunk: int) -> list[tuple[int, int]]:
    """Checks a frame's marching options and returns the bin ranges of its runs: `segments` runs front to back
    with early ray termination (early_stop > 0), one run of every bin without it."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise InputError(f"chunk={chunk!r} must be an integer >= 1 (rays marched at once)")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise InputError(f"n_samples={n_samples!r} must be an integer >= 1")
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= n_samples:
        raise InputError(f"segments={segments!r} must be an integer in 1..n_samples={n_samples}")
    if not 0.0 <= float(early_stop) < 1.0:
        raise InputError(f"early_stop={early_stop!r} must be a transmittance in [0, 1)")
    runs = segments if early_stop > 0 else 1
    return [(n_samples * k // runs, n_samples * (k + 1) // runs) for k in range(runs)]
