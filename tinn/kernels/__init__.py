"""Taichi kernels, and the Triton kernels of the GPU's matrix products and row passes (tensor_cores/,
row_gather.py). Everything Taichi- or Triton-specific lives in this package; the Python API around it only
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
