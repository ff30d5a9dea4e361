"""Input validation shared by every module: shapes, dtypes, devices, network ids.

Checks that need a device-to-host sync (NaN scans, id range) can be switched off
for hot loops with `with tinn.checks.disabled():` once a pipeline is trusted.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

from . import runtime
from .errors import InputError

_enabled = {"sync_checks": True}


@contextlib.contextmanager
def disabled(off: bool = True):
    """Inside the block, the checks that cost a device sync (id range, NaN scan) are skipped (with `off`
    False they run, so that one loop can time both); the previous state is restored after it."""
    old = _enabled["sync_checks"]
    _enabled["sync_checks"] = not off
    try:
        yield
    finally:
        _enabled["sync_checks"] = old


def sync_checks_enabled() -> bool:
    """Whether the checks that read the device on the host run: on unless `disabled()`, and never while the work
    goes into a CUDA graph (a capture cannot read the device; the eager warm-up steps before it were checked)."""
    return _enabled["sync_checks"] and not runtime.stream_capturing()


def check_device(name: str, t: torch.Tensor) -> None:
    want = runtime.device()
    if t.device.type != want.type:
        raise InputError(
            f"{name} is on {t.device} but tinn runs on {runtime.arch()!r} and expects tensors on {want}; "
            f"move it with .to('{want.type}')"
        )


def check_points(name: str, points) -> torch.Tensor:
    """(M, 3) float32 points on tinn's device."""
    if not isinstance(points, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor of shape (M, 3), got {type(points).__name__}")
    if points.dim() != 2 or points.shape[1] != 3:
        raise InputError(f"{name} must have shape (M, 3), got {tuple(points.shape)}")
    if points.dtype != torch.float32:
        raise InputError(f"{name} has dtype {points.dtype}; allowed: torch.float32 (convert with .float())")
    check_device(name, points)
    return points


def all_finite(t: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor (no sync): whether every value of `t` is finite. One min/max pass over `t`, as NaN
    propagates through both reductions and an infinity becomes the minimum or the maximum: `isfinite(t).all()`
    is an elementwise pass writing a mask of t's size, then a reduction over it."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    return torch.isfinite(torch.stack(torch.aminmax(t))).all()


def float_input(name: str, t, n_dims: int | None, *, check_finite: bool = False) -> torch.Tensor:
    """A (batch, n_dims) float32 tensor on tinn's device, contiguous (copied only if it was not)."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise InputError(f"{name} has dtype {t.dtype}; allowed: torch.float32 (convert with .float())")
    if t.dim() != 2:
        raise InputError(f"{name} must have shape (batch, {n_dims if n_dims is not None else 'dims'}), got {tuple(t.shape)}")
    if n_dims is not None and t.shape[1] != n_dims:
        raise InputError(f"{name} has last dimension {t.shape[1]}; expected {n_dims}")
    check_device(name, t)
    if check_finite and sync_checks_enabled() and t.numel() and not bool(all_finite(t)):
        raise InputError(f"{name} contains NaN or Inf")
    return t.contiguous()


_ZERO_IDS: dict = {}


def _zero_ids(batch: int) -> torch.Tensor:
    """All-zero ids for a single network, kept per batch size: a training loop asks for the same size
    every step, and kernels only read ids (callers must not write into the returned tensor)."""
    dev = runtime.device()
    key = (batch, dev)
    ids = _ZERO_IDS.get(key)
    if ids is None:
        if len(_ZERO_IDS) >= 8:
            _ZERO_IDS.clear()
        ids = runtime.keep(_ZERO_IDS, key, torch.zeros(batch, dtype=torch.int32, device=dev))
    return ids


def net_ids(ids, batch: int, n_networks: int) -> torch.Tensor:
    """Validate per-sample network ids; returns an int32 contiguous tensor.

    `None` is allowed only for a single network (all samples go to network 0).
    """
    if ids is None:
        if n_networks != 1:
            raise InputError(f"net_ids is required: this array holds {n_networks} networks")
        return _zero_ids(batch)
    if not isinstance(ids, torch.Tensor):
        raise InputError(f"net_ids must be a torch.Tensor of int32, got {type(ids).__name__}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise InputError(f"net_ids has dtype {ids.dtype}; allowed: torch.int32 (or torch.int64)")
    if ids.dim() != 1 or ids.shape[0] != batch:
        raise InputError(f"net_ids must have shape ({batch},) to match the batch, got {tuple(ids.shape)}")
    check_device("net_ids", ids)
    if sync_checks_enabled() and batch:
        # On the ids as given: an int64 id of 2^32 + 1 must not pass as 1 after the cast.
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()  # one sync for both
        if lo < 0 or hi >= n_networks:
            bad = lo if lo < 0 else hi
            raise InputError(f"net_ids contains {bad}; allowed: 0 <= id < n_networks={n_networks}")
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    return ids.contiguous()


def zero_ids(batch: int) -> torch.Tensor:
    """int32 zeros: the ids of a single network's samples (shared per batch size; read-only)."""
    return _zero_ids(batch)


def part_inputs(owner: str, x, ids, n_dims: int, n_networks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked path of every part's forward: x as (batch, n_dims) float32 on tinn's device, ids as
    int32, and one device sync for the finite-values scan of x and the id range together."""
    x = float_input(f"{owner} input", x, n_dims)
    batch = x.shape[0]
    with disabled():
        ids32 = net_ids(ids, batch, n_networks)
    if sync_checks_enabled() and batch:
        conditions = [all_finite(x)]
        if ids is not None:
            lo, hi = torch.aminmax(ids)
            conditions += [lo >= 0, hi < n_networks]
        if not bool(torch.stack(conditions).all()):
            float_input(f"{owner} input", x, n_dims, check_finite=True)
            net_ids(ids, batch, n_networks)
    return x, ids32


def training_batch(name_inputs: str, inputs: torch.Tensor, name_targets: str, targets: torch.Tensor,
                   ids: torch.Tensor | None, n_networks: int) -> None:
    """NaN/Inf scan of inputs and targets plus the id range, with one device sync for all three.

    The shapes, dtypes and devices must already be checked. Only when something is wrong
    do the detailed checks run again to name the field and the bad value.
    """
    if inputs.shape[0] == 0 or not sync_checks_enabled():
        return
    conditions = [all_finite(inputs), all_finite(targets)]
    # (ids are the caller's, before any cast: see net_ids)
    if ids is not None:
        lo, hi = torch.aminmax(ids)
        conditions += [lo >= 0, hi < n_networks]
    if bool(torch.stack(conditions).all()):
        return
    float_input(name_inputs, inputs, inputs.shape[1], check_finite=True)
    float_input(name_targets, targets, targets.shape[1], check_finite=True)
    net_ids(ids, inputs.shape[0], n_networks)


def table(name: str, p: torch.Tensor, shape: tuple, dtype: torch.dtype = torch.float32) -> None:
    """A parameter table a kernel is about to read: of `dtype` (float32, or bfloat16 for a compact grid
    table), on tinn's device, contiguous, of `shape`."""
    if p.dtype != dtype:
        hint = "convert it back with .float()" if dtype == torch.float32 else f"convert it back with .to({dtype})"
        raise InputError(f"{name} has dtype {p.dtype}; this module's kernels read {dtype} parameters "
                         f"(was the module converted with .double() / .half()? {hint})")
    check_device(name, p)
    if tuple(p.shape) != tuple(shape):
        raise InputError(f"{name} has shape {tuple(p.shape)}; expected {tuple(shape)}")
    if not p.is_contiguous():
        raise InputError(f"{name} is not contiguous; tinn kernels read it in place (assign a contiguous tensor)")


def cast_like_tcnn(owner: str, x, ids):
    """tcnn's input handling: a floating-point input of any dtype becomes float32; tensors on the CPU while
    tinn runs on CUDA move there, with a warning (each move is a copy)."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float32:
        x = x.float()
    dev = runtime.device()
    moved = []
    if dev.type == "cuda":  # only CPU -> GPU, as tcnn; any other mismatch is left to the checks' error
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            x, _ = x.to(dev), moved.append("input")
        if isinstance(ids, torch.Tensor) and ids.device.type == "cpu":
            ids, _ = ids.to(dev), moved.append("net_ids")
    if moved:
        warnings.warn(f"{owner}: {' and '.join(moved)} moved from the CPU to {dev} (a copy per call); create them "
                      f"on {dev} to avoid it", UserWarning, stacklevel=4)
    return x, ids
