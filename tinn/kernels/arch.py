"""Compile-time arch switches for kernels whose fastest loop shape differs between the CPU and CUDA.

Taichi's CPU code is scalar: a 2-D struct-for or ndrange pays a division and a remainder per element and a 2-D
address per access, which costs as much as a light elementwise update, while rows walked serially (or storage
walked flat) do not. On CUDA the opposite holds: one thread per element keeps a warp's accesses contiguous.
`ti.static(walks_rows())` picks the CPU's shape when a kernel instance is compiled; a process has one arch.
"""


def walks_rows() -> bool:
    """True on the CPU (loops over rows, or flat storage), False on CUDA (one thread per element)."""
    from .. import runtime

    return runtime.arch() != "cuda"
