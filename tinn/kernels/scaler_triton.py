"""The dynamic gradient scaler's two device steps (tinn/gradient_scaling.py) as Triton launches on CUDA: the same
work as `gradient_scaling.record_non_finite` and `update_scale` (Taichi), which stay the CPU's and the reference the
tests compare these with. Imported only where Triton runs (CUDA, or its CPU interpreter in tests).

Why: a float16 step runs both every step, and Taichi's launch path costs the host several times a Triton launch's
(docs/design-notes.md, "A step's bookkeeping as Triton launches"). Non-finite values are found on their exponent
bits (all ones: inf or NaN), as the Taichi kernels do."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gradient_scaling import EXPONENT

BLOCK = 4096  # values a program checks


@triton.jit(do_not_specialize=["n"])
def record_kernel(values_ptr, found_ptr, n, BLOCK: tl.constexpr, EXPONENT: tl.constexpr):
    """found[0] = 1 where any of values[0, n) is inf or NaN; left as it is otherwise (it accumulates over a step)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bits = tl.load(values_ptr + offs, mask=offs < n, other=0.0).to(tl.int32, bitcast=True)
    bad = tl.max(((bits & EXPONENT) == EXPONENT).to(tl.int32), axis=0)
    if bad != 0:
        tl.store(found_ptr, 1.0)


@triton.jit(do_not_specialize=["interval"])
def update_kernel(found_ptr, scale_ptr, inverse_ptr, tracker_ptr, skip_ptr, skipped_ptr, growth, backoff, interval,
                  EXPONENT: tl.constexpr):
    """torch's `_amp_update_scale_` plus the scaler's flags, as `gradient_scaling.update_scale`: skip = found; after a
    non-finite step the scale backs off and the finite-step counter restarts; after `interval` finite steps in a row
    it grows (unless that overflows); the inverse follows the scale and `found` is cleared for the next step."""
    bad = tl.load(found_ptr) > 0.5
    scale = tl.load(scale_ptr)
    tracker = tl.load(tracker_ptr)
    tl.store(skip_ptr, bad.to(tl.int32))
    tl.store(skipped_ptr, tl.load(skipped_ptr) + bad.to(tl.int32))
    finite_steps = tracker + 1
    grow = finite_steps == interval
    grown = scale * growth
    grown_finite = (grown.to(tl.int32, bitcast=True) & EXPONENT) != EXPONENT
    scale = tl.where(bad, scale * backoff, tl.where(grow & grown_finite, grown, scale))
    tracker = tl.where(bad | grow, 0, finite_steps)
    tl.store(scale_ptr, scale)
    tl.store(tracker_ptr, tracker)
    tl.store(inverse_ptr, 1.0 / scale)
    tl.store(found_ptr, 0.0)


def record_non_finite(values: torch.Tensor, found: torch.Tensor) -> None:
    """`values` (contiguous float32) into the (1,) float32 `found`."""
    n = values.numel()
    if n:
        record_kernel[(triton.cdiv(n, BLOCK),)](values, found, n, BLOCK=BLOCK, EXPONENT=EXPONENT)


def update_scale(found, scale, inverse, tracker, skip, skipped, growth: float, backoff: float, interval: int) -> None:
    """One program over the scaler's (1,) device tensors, in `gradient_scaling.update_scale`'s order."""
    update_kernel[(1,)](found, scale, inverse, tracker, skip, skipped, float(growth), float(backoff), int(interval),
                        EXPONENT=EXPONENT)
