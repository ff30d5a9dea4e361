"""bfloat16 tables: conversions, and the sparse Adam step of compact (bfloat16) grid tables.

A compact table holds each value as the upper 16 bits of its float32 (bfloat16: float32's exponent
range, 8 significant bits), handed to the kernels as an int16 view of the torch tensor, since neither
Taichi 1.7.4 nor Quadrants has a bfloat16 type. Values are widened to float32 for all arithmetic.

Weights are rounded stochastically when written: an Adam step much smaller than a weight's spacing
(late in training, or a small learning rate) then still moves it by the right amount on average,
where round-to-nearest would drop it every time. The moments are rounded to nearest (they are
averages; a relative error of 2^-9 per write does not accumulate in a direction).

The gradient of a compact table is sparse (the grid entries a batch touched, summed per entry), so
the step visits those entries alone: the lazy Adam of torch.optim.SparseAdam, with tcnn's update
per element and the tensor's step count for the bias correction.
"""
from ..backend import ti

from .image_sampling import pcg_hash
from .launch import fast_kernel
from .optimizers import adam_update_corrected

i16_1d = ti.types.ndarray(dtype=ti.i16, ndim=1)
i16_2d = ti.types.ndarray(dtype=ti.i16, ndim=2)
i64_1d = ti.types.ndarray(dtype=ti.i64, ndim=1)
f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)


@ti.func
def bf16_value(bits) -> ti.f32:
    """The float32 whose upper half is the bfloat16 `bits` (an int16)."""
    u = ti.cast(ti.cast(bits, ti.i32) & 0xFFFF, ti.u32) << ti.u32(16)
    return ti.bit_cast(u, ti.f32)


@ti.func
def _bits16(u: ti.u32):
    return ti.cast(ti.cast(u, ti.i32), ti.i16)


@ti.func
def bf16_nearest(x: ti.f32):
    """x rounded to the nearest bfloat16, ties to even (NaN stays NaN), as int16 bits."""
    u = ti.bit_cast(x, ti.u32)
    out = ti.u32(0x7FC0)
    if x == x:
        out = (u + ti.u32(0x7FFF) + ((u >> ti.u32(16)) & ti.u32(1))) >> ti.u32(16)
    return _bits16(out)


@ti.func
def bf16_stochastic(x: ti.f32, r: ti.u32):
    """x rounded to one of its two neighbouring bfloat16 values, up with probability equal to its distance
    from the lower one over their spacing (`r`: 32 random bits), as int16 bits. Adding random low bits to
    the magnitude and truncating does exactly that for either sign; Inf and NaN are kept."""
    u = ti.bit_cast(x, ti.u32)
    out = u >> ti.u32(16)
    if (u & ti.u32(0x7F800000)) != ti.u32(0x7F800000):
        out = (u + (r & ti.u32(0xFFFF))) >> ti.u32(16)
    elif (u & ti.u32(0x007FFFFF)) != ti.u32(0):
        out = ti.u32(0x7FC0)
    return _bits16(out)


@fast_kernel
@ti.kernel
def round_stochastic(x: f32_1d, out: i16_1d, seed: ti.u32):
    """out = x rounded stochastically to bfloat16 (tests of the rounding's mean)."""
    for i in range(x.shape[0]):
        out[i] = bf16_stochastic(x[i], pcg_hash(ti.cast(i, ti.u32) ^ pcg_hash(seed)))


@fast_kernel
@ti.kernel
def adam_sparse_bf16(w: i16_2d, m: i16_2d, v: i16_2d, rows: i64_1d, cols: i64_1d, g: i16_1d, lr_scale: f32_1d,
                     row_lo: ti.i64, lr: ti.f32, l2_reg: ti.f32, step: ti.i32, correction: ti.f32, seed: ti.u32,
                     beta1: ti.f32, beta2: ti.f32, epsilon: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32,
                     clip: ti.f32, grad_clip: ti.f32, lower: ti.f32, upper: ti.f32):
    """Adam on the elements (rows[k], cols[k]) of a bfloat16 table with gradient g[k] (bfloat16 bits; each
    element at most once). `w`, `m`, `v` are the row-chunk views starting at table row `row_lo`
    (tinn/chunks.py): elements of other rows are left to their chunk's launch. lr_scale has every row. The table
    counts one step for all its elements: `step` (which also seeds the rounding) and its bias correction,
    computed on the host (`Adam._correction_table`'s value)."""
    for k in range(rows.shape[0]):
        r = rows[k] - row_lo
        if r >= 0 and r < w.shape[0]:
            rr = ti.cast(r, ti.i32)
            c = ti.cast(cols[k], ti.i32)
            nw, mv, vv = adam_update_corrected(bf16_value(w[rr, c]), bf16_value(g[k]), bf16_value(m[rr, c]),
                                               bf16_value(v[rr, c]), lr * lr_scale[rows[k]] * correction, l2_reg,
                                               beta1, beta2, epsilon, rel_decay, abs_decay, clip, grad_clip, lower,
                                               upper)
            m[rr, c] = bf16_nearest(mv)
            v[rr, c] = bf16_nearest(vv)
            # A fresh random word per (element, step): the element's flat position and the step, hashed.
            pos = rows[k] * w.shape[1] + cols[k]
            key = pcg_hash(ti.cast(pos, ti.u32) ^ pcg_hash(ti.cast(pos >> 32, ti.u32) ^ seed))  # low, high words
            w[rr, c] = bf16_stochastic(nw, pcg_hash(key ^ ti.cast(step, ti.u32)))
