"""The one place that initialises Taichi.

`init()` picks the backend (argument, else `TINN_ARCH`, else GPU if one is present,
else CPU), is safe to call twice, and tells which torch device pairs with the
backend so tensors can be shared zero-copy.
"""
from __future__ import annotations

import os

import torch

from . import backend as _backend
from .errors import ConfigError, NotInitializedError

_ARCHS = {"cpu": "cpu", "cuda": "cuda", "gpu": "gpu", "auto": "auto"}
_state = {"arch": None, "device": None}


def _resolve(arch: str) -> str:
    key = arch.lower()
    if key not in _ARCHS:
        raise ConfigError(f"arch={arch!r} is not supported; allowed: {sorted(_ARCHS)}")
    if key in ("auto", "gpu"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if key == "cuda" and not torch.cuda.is_available():
        raise ConfigError("arch='cuda' was asked for but torch sees no CUDA device; use arch='cpu' or 'auto'")
    return key


def init(arch: str | None = None, *, backend: str | None = None, debug: bool = False, offline_cache: bool = True,
         **kwargs) -> str:
    """Initialise Taichi once. Returns the backend in use ('cpu' or 'cuda').

    A second call with the same (or no) arch is a no-op; asking for another arch
    after initialisation is an error, because Taichi state cannot migrate.
    `backend` picks the kernel language, 'taichi', 'quadrants' or 'auto' (see tinn.backend).
    """
    ti = _backend.load(backend)
    wanted = _resolve(arch or os.environ.get("TINN_ARCH", "auto"))
    if _state["arch"] is not None:
        if arch is not None and wanted != _state["arch"]:
            raise ConfigError(
                f"tinn is already initialised with arch={_state['arch']!r}; cannot switch to {wanted!r} in one process"
            )
        return _state["arch"]
    ti_arch = ti.cuda if wanted == "cuda" else ti.cpu
    # Reverse-mode autodiff over dynamic loops needs a deeper adstack than Taichi's default.
    kwargs.setdefault("ad_stack_size", 256)
    kwargs.setdefault("default_fp", ti.f32)
    kwargs.setdefault("log_level", ti.WARN)
    # The MLP kernels unroll up to 128 multiply-adds per row on purpose (register-resident vectors).
    kwargs.setdefault("unrolling_limit", 0)
    if wanted == "cuda" and os.environ.get("TINN_GPU_MAX_REG"):
        # Register cap per thread (occupancy vs spills), a tuning knob for the fused kernels.
        kwargs.setdefault("gpu_max_reg", int(os.environ["TINN_GPU_MAX_REG"]))
    ti.init(arch=ti_arch, debug=debug, offline_cache=offline_cache, **kwargs)
    _state["arch"] = wanted
    _state["device"] = torch.device("cuda", 0) if wanted == "cuda" else torch.device("cpu")
    return wanted


def backend_name() -> str:
    """'taichi' or 'quadrants': the kernel language tinn's kernels are compiled with."""
    return _backend.name()


def is_initialized() -> bool:
    return _state["arch"] is not None


def arch() -> str:
    require_init()
    return _state["arch"]


def device() -> torch.device:
    """The torch device whose tensors Taichi kernels use in place."""
    require_init()
    return _state["device"]


def require_init() -> None:
    if _state["arch"] is None:
        raise NotInitializedError("tinn is not initialised: call tinn.init() (or tinn.init(arch='cpu')) first")


def ensure_init() -> str:
    """Initialise with defaults if nobody did; used by module constructors."""
    return init() if _state["arch"] is None else _state["arch"]


def sync() -> None:
    """Wait for all device work (Taichi and torch)."""
    if _state["arch"] is not None:
        _backend.ti.sync()
        if _state["arch"] == "cuda":
            torch.cuda.synchronize()
