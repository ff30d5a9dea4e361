"""Samples along rays: stratified distances, and packing of the samples worth evaluating."""
from __future__ import annotations

import torch

from ..errors import InputError


def stratified_t(t_near: torch.Tensor, t_far: torch.Tensor, n_samples: int, jitter: bool, generator=None):
    """n_samples equal bins between t_near and t_far per ray; one sample per bin.

    Returns t (R, S) (bin midpoints, or a uniform point in each bin with jitter) and deltas (R, S), the bin
    lengths used by the compositing quadrature. Rays that miss (t_far <= t_near) get deltas 0, so they composite
    to pure background. `generator` is a torch.Generator on the rays' device (used only with jitter).
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
    if jitter:
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
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        raise InputError(f"mask must be a 2-D torch.bool tensor (R, S), got "
                         f"{(mask.dtype, tuple(mask.shape)) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    if mask.numel() >= 2**31:
        raise InputError(f"mask has {mask.numel()} samples; ray_offsets are int32, pack at most 2**31 - 1 at once")
    sample_index = torch.nonzero(mask.reshape(-1), as_tuple=False).reshape(-1)
    counts = mask.sum(dim=1, dtype=torch.int32)
    ray_offsets = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=mask.device)
    ray_offsets[1:] = torch.cumsum(counts, dim=0)
    return sample_index, ray_offsets
