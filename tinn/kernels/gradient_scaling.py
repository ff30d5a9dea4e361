"""The dynamic gradient scaler's device work in two launches (tinn/gradient_scaling.py): recording whether
gradients hold an inf or NaN, and the end-of-step update of the skip flag, scale, inverse and counters. As torch
ops these were ten small launches a step, host time a float16 step paid in full.

Non-finite values are found on their exponent bits (all ones: inf or NaN), not by comparisons, which fast math
may fold away for NaN."""
from ..backend import ti
from .launch import fast_kernel

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

EXPONENT = 0x7F800000


@ti.func
def non_finite(v) -> ti.i32:
    return ti.cast((ti.bit_cast(v, ti.i32) & EXPONENT) == EXPONENT, ti.i32)


@fast_kernel
@ti.kernel
def record_non_finite(values: f32_1d, found: f32_1d):
    """found[0] = 1 where any value is inf or NaN (left as it is otherwise: it accumulates over a step)."""
    for i in range(values.shape[0]):
        if non_finite(values[i]):
            found[0] = 1.0


@fast_kernel
@ti.kernel
def update_scale(found: f32_1d, scale: f32_1d, inverse: f32_1d, tracker: i32_1d, skip: i32_1d, skipped: i32_1d,
                 growth: ti.f32, backoff: ti.f32, interval: ti.i32):
    """torch's `_amp_update_scale_` plus the scaler's flags: skip = found; after a non-finite step the scale backs
    off and the finite-step counter restarts; after `interval` finite steps in a row it grows (unless that
    overflows); then the inverse follows the scale and `found` is cleared for the next step."""
    for _ in range(1):
        bad = found[0] > 0.5
        skip[0] = ti.cast(bad, ti.i32)
        skipped[0] += ti.cast(bad, ti.i32)
        if bad:
            scale[0] = scale[0] * backoff
            tracker[0] = 0
        else:
            finite_steps = tracker[0] + 1
            if finite_steps == interval:
                grown = scale[0] * growth
                if not non_finite(grown):
                    scale[0] = grown
                finite_steps = 0
            tracker[0] = finite_steps
        inverse[0] = 1.0 / scale[0]
        found[0] = 0.0
