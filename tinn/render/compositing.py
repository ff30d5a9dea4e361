"""Alpha compositing of packed samples along rays (hand-written forward and backward: Triton launches on CUDA,
Taichi's kernels elsewhere).

alpha_i = 1 - exp(-sigma_i delta_i), T_i = prod_{j<i} (1 - alpha_j), w_i = T_i alpha_i,
C = sum_i w_i c_i + (1 - sum_i w_i) background, opacity = sum_i w_i, depth = sum_i w_i t_i.
Gradients flow to sigma, rgb, deltas, t and background (whichever require grad).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from .. import checks, runtime
from ..errors import InputError
from ..kernels import compositing as compositing_kernels
from ..kernels import triton_render_kernels


class Composited(NamedTuple):
    rgb: torch.Tensor                # (R, 3)
    opacity: torch.Tensor            # (R,)  = 1 - T_end
    depth: Optional[torch.Tensor]    # (R,)  = sum_i w_i t_i (not normalised by opacity); None without t


def _kernels(device):
    """The module of the two compositing kernels: Triton's on CUDA (`tuning.triton_render_kernels`), else Taichi's
    (the same arguments)."""
    if triton_render_kernels(device):
        from ..kernels import compositing_triton
        return compositing_triton
    return compositing_kernels


class _CompositeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sigma, rgb, deltas, t, ray_offsets, background):
        n_rays = ray_offsets.shape[0] - 1
        dev = sigma.device
        has_t = t is not None
        t_arg = t.detach() if has_t else torch.zeros(1, dtype=torch.float32, device=dev)
        out_rgb = torch.empty(n_rays, 3, dtype=torch.float32, device=dev)
        opacity = torch.empty(n_rays, dtype=torch.float32, device=dev)
        depth = torch.empty(n_rays, dtype=torch.float32, device=dev)
        t_end = torch.empty(n_rays, dtype=torch.float32, device=dev)
        trans_after = torch.empty(sigma.shape[0], dtype=torch.float32, device=dev)
        if n_rays:
            _kernels(dev).composite_forward(sigma.detach(), rgb.detach(), deltas.detach(), t_arg, int(has_t),
                                            ray_offsets, background.detach(), out_rgb, opacity, depth, t_end,
                                            trans_after)
        ctx.save_for_backward(sigma, rgb, deltas, t_arg, ray_offsets, background, t_end, trans_after)
        ctx.has_t = has_t
        if not has_t:
            ctx.mark_non_differentiable(depth)
        return out_rgb, opacity, depth

    @staticmethod
    @once_differentiable
    def backward(ctx, g_rgb_ray, g_opacity, g_depth):
        # Detached: a tensor that requires grad would make Taichi allocate a .grad for it.
        sigma, rgb, deltas, t_arg, ray_offsets, background, t_end, trans_after = (
            x.detach() for x in ctx.saved_tensors)
        n_rays = ray_offsets.shape[0] - 1
        m = sigma.shape[0]
        dev = sigma.device
        g_sigma = torch.empty(m, dtype=torch.float32, device=dev)
        g_rgb = torch.empty(m, 3, dtype=torch.float32, device=dev)
        g_deltas = torch.empty(m, dtype=torch.float32, device=dev)
        g_t = torch.empty(m if ctx.has_t else 1, dtype=torch.float32, device=dev)
        g_depth = g_depth if ctx.has_t else torch.zeros(1, dtype=torch.float32, device=dev)
        if n_rays:
            _kernels(dev).composite_backward(sigma, rgb, deltas, t_arg, int(ctx.has_t), ray_offsets, background,
                                             t_end, trans_after, g_rgb_ray.contiguous(), g_opacity.contiguous(),
                                             g_depth.contiguous(), g_sigma, g_rgb, g_deltas, g_t)
        need = ctx.needs_input_grad
        g_bg = None
        if need[5]:
            g_bg = g_rgb_ray * t_end[:, None]  # dC/dbackground = T_end per ray
            if background.shape[0] == 1:
                g_bg = g_bg.sum(dim=0, keepdim=True)
        return (g_sigma if need[0] else None, g_rgb if need[1] else None, g_deltas if need[2] else None,
                g_t if (ctx.has_t and need[3]) else None, None, g_bg)


def _float_tensor(name: str, v, shape: tuple) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(v).__name__}")
    if v.dtype != torch.float32:
        raise InputError(f"{name} has dtype {v.dtype}; allowed: torch.float32 (convert with .float())")
    if tuple(v.shape) != shape:
        want = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise InputError(f"{name} must have shape {want}, got {tuple(v.shape)}")
    checks.check_device(name, v)
    return v.contiguous()


_CONSTANT_BACKGROUNDS: dict = {}


def _constant_background(values, dev) -> torch.Tensor:
    """A background given as host data, as a tensor on `dev`. A flat sequence of numbers (one colour) is kept
    per value: torch builds a device tensor from host data with a blocking copy (the GPU drains first), which a
    render loop would pay on every call. Read-only (the kernels only read the background; it needs no
    gradient). Anything else (per-ray colours as nested lists or an array) is converted on each call."""
    try:
        key = (tuple(float(v) for v in values), str(dev))
    except (TypeError, ValueError):
        try:
            return torch.tensor(values, dtype=torch.float32, device=dev)
        except (TypeError, ValueError, RuntimeError):
            raise InputError(f"background must be None, three numbers or a float32 tensor of shape (3,) or (R, 3), "
                             f"got {values!r}") from None
    t = _CONSTANT_BACKGROUNDS.get(key)
    if t is None:
        if len(_CONSTANT_BACKGROUNDS) >= 16:
            _CONSTANT_BACKGROUNDS.clear()
        t = _CONSTANT_BACKGROUNDS[key] = torch.tensor(key[0], dtype=torch.float32, device=dev)
    return t


def _background(background, n_rays: int, dev) -> torch.Tensor:
    """The background as a (1, 3) or (R, 3) float32 tensor (a view of the caller's, so gradients reach it)."""
    if background is None:
        background = (0.0, 0.0, 0.0)
    if not isinstance(background, torch.Tensor):
        background = _constant_background(background, dev)
    if background.dtype != torch.float32:
        raise InputError(f"background has dtype {background.dtype}; allowed: torch.float32")
    if background.shape == (3,):
        background = background[None]
    elif background.shape != (n_rays, 3):
        raise InputError(f"background must have shape (3,) or (R, 3) = ({n_rays}, 3), got {tuple(background.shape)}")
    checks.check_device("background", background)
    return background.contiguous()


def composite(sigma, rgb, deltas, ray_offsets, background=None, t=None) -> Composited:
    """Composite packed samples front to back; see the module docstring for the formulas.

    sigma (M,), rgb (M, 3), deltas (M,), t (M,) or None: float32 on tinn's device. ray_offsets (R + 1,) int32,
    non-decreasing, from 0 to M: ray r owns samples ray_offsets[r]:ray_offsets[r + 1] (as `pack` returns).
    background: None (black), (3,) or (R, 3). sigma must be >= 0 (apply the density activation first).
    """
    runtime.require_init()
    if not isinstance(sigma, torch.Tensor):
        raise InputError(f"sigma must be a torch.Tensor (M,), got {type(sigma).__name__}")
    if sigma.dim() != 1:
        raise InputError(f"sigma must have shape (M,), got {tuple(sigma.shape)}")
    m = sigma.shape[0]
    sigma, rgb, deltas, t = _packed_samples(sigma, rgb, deltas, t, m)
    return _composite_checked(sigma, rgb, deltas, _offsets(ray_offsets, m), background, t)


def _packed_samples(sigma, rgb, deltas, t, m: int):
    """Validated, contiguous float32 per-sample inputs of M samples (t optional)."""
    return (_float_tensor("sigma", sigma, (m,)), _float_tensor("rgb", rgb, (m, 3)),
            _float_tensor("deltas", deltas, (m,)), None if t is None else _float_tensor("t", t, (m,)))


def _composite_checked(sigma, rgb, deltas, ray_offsets, background, t) -> Composited:
    background = _background(background, ray_offsets.shape[0] - 1, sigma.device)
    rgb_out, opacity, depth = _CompositeFn.apply(sigma, rgb, deltas, t, ray_offsets, background)
    return Composited(rgb_out, opacity, depth if t is not None else None)


def _offsets(ray_offsets, m: int) -> torch.Tensor:
    if not isinstance(ray_offsets, torch.Tensor):
        raise InputError(f"ray_offsets must be a torch.Tensor (R + 1,) of int32, got {type(ray_offsets).__name__}")
    if ray_offsets.dtype != torch.int32:
        raise InputError(f"ray_offsets has dtype {ray_offsets.dtype}; allowed: torch.int32")
    if ray_offsets.dim() != 1 or ray_offsets.shape[0] < 1:
        raise InputError(f"ray_offsets must have shape (R + 1,) with R >= 0, got {tuple(ray_offsets.shape)}")
    checks.check_device("ray_offsets", ray_offsets)
    if checks.sync_checks_enabled():
        first, last = int(ray_offsets[0]), int(ray_offsets[-1])
        if first != 0 or last != m:
            raise InputError(f"ray_offsets must start at 0 and end at M={m} (the number of samples), "
                             f"got first={first}, last={last}")
        if ray_offsets.shape[0] > 1 and not bool((ray_offsets[1:] >= ray_offsets[:-1]).all()):
            raise InputError("ray_offsets must be non-decreasing (ray r owns ray_offsets[r]:ray_offsets[r + 1])")
    return ray_offsets.contiguous()


def composite_dense(sigma, rgb, deltas, background=None, t=None) -> Composited:
    """`composite` on a dense layout: sigma (R, S), rgb (R, S, 3), deltas (R, S), t (R, S) or None."""
    if not isinstance(sigma, torch.Tensor) or sigma.dim() != 2:
        raise InputError(f"sigma must be a torch.Tensor of shape (R, S), got "
                         f"{tuple(sigma.shape) if isinstance(sigma, torch.Tensor) else type(sigma).__name__}")
    n_rays, n_samples = sigma.shape
    for name, v, shape in (("rgb", rgb, (n_rays, n_samples, 3)), ("deltas", deltas, (n_rays, n_samples)),
                           ("t", t, (n_rays, n_samples))):
        if v is None and name == "t":
            continue
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != shape:
            raise InputError(f"{name} must have shape {shape} to match sigma {tuple(sigma.shape)}, got "
                             f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
    if n_rays * n_samples >= 2**31:
        raise InputError(f"{n_rays} x {n_samples} samples exceed int32 offsets; composite in chunks of rays")
    runtime.require_init()
    m = n_rays * n_samples
    sigma, rgb, deltas, t = _packed_samples(sigma.reshape(-1), rgb.reshape(-1, 3), deltas.reshape(-1),
                                            None if t is None else t.reshape(-1), m)
    # Offsets built here are valid by construction: no checks (and no device sync) needed.
    offsets = torch.arange(0, n_rays + 1, dtype=torch.int32, device=sigma.device) * n_samples
    return _composite_checked(sigma, rgb, deltas, offsets, background, t)
