"""The one place that initialises Taichi, owns the settings and orders CUDA streams.

`init()` picks the arch (argument, else `TINN_ARCH`, else GPU if one is present,
else CPU), fixes the settings and the kernels' tuning (tinn/settings.py), is safe to call twice,
and tells which torch device pairs with the arch so tensors can be shared
zero-copy.
"""
from __future__ import annotations

import contextlib
import os
import threading

import torch

from . import settings as settings_module
from . import backend as _backend
from .errors import ConfigError, NotInitializedError
from .settings import Settings, Tuning

_ARCHS = {"cpu": "cpu", "cuda": "cuda", "gpu": "gpu", "auto": "auto"}
_state = {"arch": None, "device": None, "chosen": None}


def _resolve(arch: str) -> str:
    key = arch.lower()
    if key not in _ARCHS:
        raise ConfigError(f"arch={arch!r} is not supported; allowed: {sorted(_ARCHS)}")
    if key in ("auto", "gpu"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if key == "cuda" and not torch.cuda.is_available():
        raise ConfigError("arch='cuda' was asked for but torch sees no CUDA device; use arch='cpu' or 'auto'")
    return key


def init(arch: str | None = None, *, backend: str | None = None, settings: Settings | dict | None = None,
         tuning: Tuning | dict | None = None, debug: bool = False, offline_cache: bool = True, **kwargs) -> str:
    """Initialise the kernel backend once, before building models.

    A second call with the same (or no) arch and no settings is a no-op; asking for another arch or
    other settings or tuning after initialisation is an error, because compiled kernels and Taichi state cannot
    change.

    Args:
        arch: "cpu", "cuda" or "auto" (a GPU if present); None: `TINN_ARCH`, else "auto".
        backend: the kernel language, "taichi", "quadrants" or "auto" (see `tinn.backend`).
        settings: a `Settings` or a dict of its fields overriding the defaults (and `TINN_SETTINGS`).
        tuning: a `tinn.settings.Tuning` or a dict of its fields (the kernels' knobs), likewise.
        debug: Taichi's debug mode (bounds checks in kernels; slow).
        offline_cache: keep compiled kernels on disk for later processes.
        **kwargs: passed to `ti.init` (e.g. `offline_cache_file_path`).

    Returns:
        The arch in use, "cpu" or "cuda".

    Raises:
        ConfigError: an unknown arch or backend, a bad settings or tuning field, or another arch or other
            settings or tuning than those of an earlier call.
    """
    ti = _backend.load(backend)
    wanted = _resolve(arch or os.environ.get("TINN_ARCH", "auto"))
    if _state["arch"] is not None:
        if arch is not None and wanted != _state["arch"]:
            raise ConfigError(
                f"tinn is already initialised with arch={_state['arch']!r}; cannot switch to {wanted!r} in one process"
            )
        if settings is not None and settings_module.build(None, settings).settings != _state["chosen"].settings:
            raise ConfigError("tinn is already initialised with other settings; pass settings to the first "
                              "tinn.init() of the process")
        if tuning is not None and settings_module.build(None, tuning=tuning).tuning != _state["chosen"].tuning:
            raise ConfigError("tinn is already initialised with other tuning; pass tuning to the first "
                              "tinn.init() of the process")
        return _state["arch"]
    chosen = settings_module.build(os.environ.get(settings_module.ENV_VARIABLE), settings, tuning)
    ti_arch = ti.cuda if wanted == "cuda" else ti.cpu
    # Reverse-mode autodiff over dynamic loops needs a deeper adstack than Taichi's default.
    kwargs.setdefault("ad_stack_size", 256)
    kwargs.setdefault("default_fp", ti.f32)
    kwargs.setdefault("log_level", ti.WARN)
    # The MLP kernels unroll up to 128 multiply-adds per row on purpose (register-resident vectors).
    kwargs.setdefault("unrolling_limit", 0)
    kwargs.setdefault("advanced_optimization", chosen.tuning.ir_optimization is not False)
    if wanted == "cuda" and chosen.tuning.gpu_max_reg:
        kwargs.setdefault("gpu_max_reg", chosen.tuning.gpu_max_reg)
    ti.init(arch=ti_arch, debug=debug, offline_cache=offline_cache, **kwargs)
    _state["chosen"] = chosen
    settings_module.install(chosen)
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


def settings() -> Settings:
    """The settings of this process (initialises tinn with defaults if nobody did)."""
    ensure_init()
    return settings_module.current()


def tuning() -> Tuning:
    """The kernels' tuning in this process (initialises tinn with defaults if nobody did)."""
    ensure_init()
    return settings_module.current_tuning()


def cpu_threads() -> int:
    """Threads the backend runs a CPU kernel's parallel loop on."""
    require_init()
    cfg = _backend.ti.lang.impl.current_cfg()
    return int(getattr(cfg, "cpu_max_num_threads", 0) or os.cpu_count() or 1)


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


# ---- CUDA stream ordering ---------------------------------------------------------------------------
# torch's current-stream query without building Stream objects (a few microseconds per call, asked on
# every module call); stream id 0 is the default stream. Absent from CPU builds of torch.
_CURRENT_STREAM_ID = getattr(torch._C, "_cuda_getCurrentStream", None)


# Set in the thread that captures a training step as a CUDA graph (tinn/step_graphs.py): the step then issues no
# Taichi launch, so nothing is to be ordered with Taichi's stream, and switching streams inside a capture would break
# it. Per thread: another thread (a viewer rendering while a trainer's thread captures) keeps ordering its launches.
_CAPTURING = threading.local()


@contextlib.contextmanager
def capturing_step():
    """This thread captures a training step as a CUDA graph in the block: `stream_guard` leaves the capturing
    stream current."""
    before = getattr(_CAPTURING, "on", False)
    _CAPTURING.on = True
    try:
        yield
    finally:
        _CAPTURING.on = before


def capturing() -> bool:
    """Whether this thread is capturing a training step as a CUDA graph: caches of device tensors then keep nothing
    made inside the capture (its tensors hold their values only once the graph has run)."""
    return getattr(_CAPTURING, "on", False)


def _on_default_stream() -> bool:
    """Whether torch's current stream is surely the default one, from one stream-id query (False where that query
    is missing: the callers then ask torch)."""
    return _CURRENT_STREAM_ID is not None and _CURRENT_STREAM_ID(_state["device"].index)[0] == 0


def callers_capture() -> bool:
    """Whether torch's current stream is capturing a CUDA graph of the caller's own (`torch.cuda.graph` around a
    loop of tinn modules) rather than a step tinn captures itself (`capturing`). A capture never runs on the
    default stream, so the common case costs one stream-id query."""
    if _state["arch"] != "cuda" or capturing() or _on_default_stream():
        return False
    return torch.cuda.is_current_stream_capturing()


def stream_capturing() -> bool:
    """Whether this thread's work is going into a CUDA graph, tinn's capture or the caller's: nothing may then be
    read on the host, and no cache may keep a tensor made in it."""
    return capturing() or callers_capture()


def keep(cache: dict, key, value):
    """`cache[key] = value`, unless this thread's work is going into a CUDA graph (`stream_capturing`): a device
    tensor made inside a capture holds its values only once the graph has run, so no cache keeps one. Returns
    `value`."""
    if not stream_capturing():
        cache[key] = value
    return value


def foreign_stream():
    """torch's current CUDA stream when it is not the default stream Taichi launches on, else None (also while a
    graph is captured, tinn's or the caller's: the capturing stream must stay current)."""
    if _state["arch"] != "cuda" or capturing() or _on_default_stream():
        return None
    dev = _state["device"]
    cur = torch.cuda.current_stream(dev)
    if cur == torch.cuda.default_stream(dev) or torch.cuda.is_current_stream_capturing():
        return None
    return cur


def autograd_backward_here():
    """Context for a backward pass tinn starts itself: on the calling thread where the settings say so
    (`autograd_calling_thread`), else torch's default (CUDA backward passes on torch's device thread). The
    calling thread waits for the backward either way; running it there saves the hand-over."""
    if settings().autograd_calling_thread:
        return torch.autograd.set_multithreading_enabled(False)
    return contextlib.nullcontext()


@contextlib.contextmanager
def stream_guard():
    """Order Taichi launches (CUDA legacy default stream) with torch's current stream.

    No-op on the CPU backend and when torch's current stream already is the default stream. Otherwise:
    the default stream waits for the current one, the body runs with the default stream current (torch's
    own ops inside it, and the backward pass autograd runs on the forward's stream, stay ordered with the
    Taichi launches), and on exit the current stream waits for the default one. These are GPU-side event
    waits, not host syncs. Tensors created inside the block belong to the default stream's allocator
    pool; if one is kept alive and freed while the caller's stream may still use it, call
    `t.record_stream(torch.cuda.current_stream())`.
    """
    cur = foreign_stream()
    if cur is None:
        yield
        return
    default = torch.cuda.default_stream(cur.device)
    default.wait_stream(cur)
    try:
        with torch.cuda.stream(default):
            yield
    finally:
        cur.wait_stream(default)
