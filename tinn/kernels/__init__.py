"""Taichi kernels, and the Triton kernels of the GPU's matrix products and row passes (tensor_cores/,
row_gather.py), of a training step's bookkeeping (adam_triton.py, scaler_triton.py), of the grid's lookup and table
gradient (grid_triton.py) and of volume compositing (compositing_triton.py) on CUDA, where Taichi's launch costs the
host more or its kernels use the GPU less. Everything Taichi- or Triton-specific lives in this package; the Python API around it only
validates, allocates torch tensors and launches."""
import functools

# Internal: the kernels are reached through the parts, losses and optimizers that launch them.
__all__: list[str] = []


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports here (torch's CUDA builds ship it; a CPU install may lack it). The Triton modules
    of this package import it at their top, so callers ask first."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # an ImportError, or a broken install raising anything else
        return False
    return True


def triton_step_kernels(device) -> bool:
    """Whether a training step's bookkeeping kernels (Adam's dense tables, the gradient scaler's checks) run as
    Triton launches on `device` (`tuning.triton_step_kernels`): None = on CUDA where Triton imports; True =
    wherever Triton runs (CUDA, or its CPU interpreter in tests); False = never."""
    from .. import runtime
    return _triton_chosen(runtime.tuning().triton_step_kernels, device)


def triton_grid_kernels(device) -> bool:
    """Whether a grid encoding's lookup and table gradient run as Triton launches on `device` where the grid's
    options allow it (`tuning.triton_grid_kernels`; the same three choices as `triton_step_kernels`)."""
    from .. import runtime
    return _triton_chosen(runtime.tuning().triton_grid_kernels, device)


def triton_render_kernels(device) -> bool:
    """Whether a scene's volume compositing runs as Triton launches on `device` (`tuning.triton_render_kernels`;
    the same three choices as `triton_step_kernels`)."""
    from .. import runtime
    return _triton_chosen(runtime.tuning().triton_render_kernels, device)


def _triton_chosen(choice, device) -> bool:
    if choice is False or (choice is None and device.type != "cuda") or not triton_available():
        return False
    return device.type == "cuda" or triton_interpreted()


def triton_interpreted() -> bool:
    """Whether Triton runs its CPU interpreter (tests on machines without a GPU; it reads TRITON_INTERPRET as it
    decorates a kernel)."""
    import os
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
