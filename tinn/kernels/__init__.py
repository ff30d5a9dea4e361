"""Taichi kernels. Everything Taichi-specific lives in this package; the Python API
around it only validates, allocates torch tensors and launches."""

# Internal: the kernels are reached through the parts, losses and optimizers that launch them.
__all__: list[str] = []
