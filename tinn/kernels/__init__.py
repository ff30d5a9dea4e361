"""Taichi kernels. Everything Taichi-specific lives in this package; the Python API
around it only validates, allocates torch tensors and launches."""
