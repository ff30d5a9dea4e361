"""Whether a table fits the device, checked before it is allocated.

A table of billions of floats that does not fit fails deep inside an allocation (or, on the CPU,
takes the machine into swap); checking first gives an error that names the table and the sizes.
"""
from __future__ import annotations

import torch

from .errors import DeviceMemoryError

GIB = float(1 << 30)


def free_bytes(device: torch.device) -> int | None:
    """Bytes an allocation on `device` can still get: free device memory plus what torch's allocator
    holds unused (CUDA), MemAvailable from /proc/meminfo (CPU); None where it cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(what: str, needed: dict[str, int], device: torch.device, note: str = "") -> None:
    """Raise DeviceMemoryError unless the buffers in `needed` (name -> bytes) fit in the free memory."""
    total = sum(needed.values())
    free = free_bytes(device)
    if free is None or total <= free:
        return
    parts = ", ".join(f"{name} {b / GIB:.2f} GiB" for name, b in needed.items())
    raise DeviceMemoryError(f"{what} needs {total / GIB:.2f} GiB ({total} bytes: {parts}) but the {device.type} "
                            f"device has {free / GIB:.2f} GiB ({free} bytes) free{note}; use fewer networks or "
                            "smaller ones")


def table_fits(what: str, n_rows: int, row_elements: int, device: torch.device, compact: bool = False) -> None:
    """A float32 parameter table and its gradient (what any training needs) must fit; the message also
    gives what Adam's state (two moments and an int32 step count per element) would add. A compact
    (bfloat16) table has sparse gradients: the table itself must fit, and Adam adds two bfloat16 moments."""
    elements = n_rows * row_elements
    if compact:
        check_fits(what, {"parameters": 2 * elements}, device,
                   note=f" (Adam's state would add another {4 * elements / GIB:.2f} GiB)")
        return
    table = 4 * elements
    needs = {"parameters": table, "gradients": table}
    if first_backward_copies():
        needs["first backward's gradient copy"] = table
    check_fits(what, needs, device, note=f" (Adam's state would add another {3 * table / GIB:.2f} GiB)")


def first_backward_copies() -> bool:
    """Whether torch autograd copies a part's gradient on its kernels' first backward: on Quadrants, whose first
    launch keeps its arguments (on Taichi kernels compile from stand-ins first; docs/design-notes.md)."""
    from . import backend
    return backend.is_loaded() and backend.name() == "quadrants"
