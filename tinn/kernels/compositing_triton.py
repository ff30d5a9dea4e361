"""Volume compositing of packed ray samples as Triton launches on CUDA: the same forward and backward as
`compositing.composite_forward` / `composite_backward` (Taichi; the formulas are in that module's docstring).
Imported only where Triton runs (CUDA, or its CPU interpreter in tests).

Why a second copy: Taichi's kernels give each ray one thread that walks its samples one by one, so a batch of a few
thousand rays keeps a few percent of the GPU's threads busy, each waiting on its loads in turn; and Taichi's launch
costs the host several times a Triton launch's time (design notes, "A step's bookkeeping as Triton launches"). Here
one program takes one ray, `BLOCK` samples at a time: the transmittance is exp of scans of sigma * delta within
the block, carried from block to block, and the backward's suffix sums are reverse scans walked from the ray's last
block to its first. Taichi's kernels stay the CPU's path and the tests' second reference.

Numerics: the transmittance is exp of the scanned optical depth, where Taichi's kernel multiplies the samples' exp(-x)
one by one; both are float32 and agree to a few ulps of the optical depth. The backward's suffix sums A_i are scans
of the *next* sample's contributions (w_{i+1} c_{i+1}, read again from memory), so no term is subtracted from a
running total, as in the Taichi kernel.
"""
from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 128  # samples of one ray a program takes at a time (tests lower it to cover rays of several blocks)


@triton.jit
def _one_minus_exp_neg(x):
    """1 - exp(-x), with a short series for small x, where the subtraction would lose most digits (as Taichi's)."""
    series = x * (1.0 - x * (0.5 - x * (1.0 / 6.0)))
    return tl.where(tl.abs(x) < 1e-2, series, 1.0 - tl.exp(-x))


@triton.jit
def _forward(sigma_ptr, rgb_ptr, deltas_ptr, t_ptr, offsets_ptr, bg_ptr, out_rgb_ptr, out_opacity_ptr,
             out_depth_ptr, out_t_end_ptr, trans_after_ptr, n_bg_rows, HAS_T: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    # Sample indices in 64 bits: a block past a ray's end may reach beyond 2^31 - 1 in a batch near int32's limit.
    start = tl.load(offsets_ptr + r).to(tl.int64)
    end = tl.load(offsets_ptr + r + 1).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    zero = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), axis=0)
    trans = zero + 1.0
    acc_r, acc_g, acc_b, acc_d, acc_w = zero, zero, zero, zero, zero
    for lo in range(start, end, BLOCK):
        i = lo + lanes
        inside = i < end
        x = tl.load(sigma_ptr + i, mask=inside, other=0.0) * tl.load(deltas_ptr + i, mask=inside, other=0.0)
        # The optical depth before each sample (within the block) scans the previous sample's x, read again, rather
        # than subtracting x from the inclusive scan: an infinite density (an overflowing activation) would make
        # that inf - inf, where it must make the sample opaque, as in Taichi's kernel.
        prev = (lanes > 0) & inside
        x_prev = (tl.load(sigma_ptr + i - 1, mask=prev, other=0.0)
                  * tl.load(deltas_ptr + i - 1, mask=prev, other=0.0))
        after = trans * tl.exp(-tl.cumsum(x, axis=0))
        w = tl.where(inside, trans * tl.exp(-tl.cumsum(x_prev, axis=0)) * _one_minus_exp_neg(x), 0.0)
        acc_r += tl.sum(w * tl.load(rgb_ptr + i * 3, mask=inside, other=0.0), axis=0)
        acc_g += tl.sum(w * tl.load(rgb_ptr + i * 3 + 1, mask=inside, other=0.0), axis=0)
        acc_b += tl.sum(w * tl.load(rgb_ptr + i * 3 + 2, mask=inside, other=0.0), axis=0)
        acc_w += tl.sum(w, axis=0)
        if HAS_T:
            acc_d += tl.sum(w * tl.load(t_ptr + i, mask=inside, other=0.0), axis=0)
        tl.store(trans_after_ptr + i, after, mask=inside)
        # Lanes past the ray's end add no depth, so the block's last lane holds the ray's transmittance so far.
        trans = tl.sum(tl.where(lanes == BLOCK - 1, after, 0.0), axis=0)
    row = tl.where(n_bg_rows > 1, r, 0).to(tl.int64) * 3
    out = r.to(tl.int64) * 3
    tl.store(out_rgb_ptr + out, acc_r + trans * tl.load(bg_ptr + row))
    tl.store(out_rgb_ptr + out + 1, acc_g + trans * tl.load(bg_ptr + row + 1))
    tl.store(out_rgb_ptr + out + 2, acc_b + trans * tl.load(bg_ptr + row + 2))
    tl.store(out_opacity_ptr + r, acc_w)
    tl.store(out_depth_ptr + r, acc_d)
    tl.store(out_t_end_ptr + r, trans)


@triton.jit
def _weights(sigma_ptr, deltas_ptr, trans_after_ptr, i, start, end):
    """(w_i, sigma_i, delta_i, T_{i+1}) of samples i (at or after `start`) of a ray [start, end); zeros past it."""
    inside = i < end
    s = tl.load(sigma_ptr + i, mask=inside, other=0.0)
    d = tl.load(deltas_ptr + i, mask=inside, other=0.0)
    before = tl.load(trans_after_ptr + i - 1, mask=inside & (i > start), other=1.0)
    w = tl.where(inside, before * _one_minus_exp_neg(s * d), 0.0)
    return w, s, d, tl.load(trans_after_ptr + i, mask=inside, other=0.0)


@triton.jit
def _backward(sigma_ptr, rgb_ptr, deltas_ptr, t_ptr, offsets_ptr, bg_ptr, t_end_ptr, trans_after_ptr, g_rgb_ray_ptr,
              g_opacity_ptr, g_depth_ptr, g_sigma_ptr, g_rgb_ptr, g_deltas_ptr, g_t_ptr, n_bg_rows,
              HAS_T: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    start = tl.load(offsets_ptr + r).to(tl.int64)  # (64 bits, as in the forward)
    end = tl.load(offsets_ptr + r + 1).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    row = tl.where(n_bg_rows > 1, r, 0).to(tl.int64) * 3
    r64 = r.to(tl.int64)
    te = tl.load(t_end_ptr + r)
    gr = tl.load(g_rgb_ray_ptr + r64 * 3)
    gg = tl.load(g_rgb_ray_ptr + r64 * 3 + 1)
    gb = tl.load(g_rgb_ray_ptr + r64 * 3 + 2)
    gd = te * 0.0
    if HAS_T:
        gd = tl.load(g_depth_ptr + r)
    g_op_term = tl.load(g_opacity_ptr + r) * te
    # A_i: what lies behind sample i (the later samples' w c, then the background through T_end), carried from
    # block to block back to front.
    after_r = te * tl.load(bg_ptr + row)
    after_g = te * tl.load(bg_ptr + row + 1)
    after_b = te * tl.load(bg_ptr + row + 2)
    after_d = te * 0.0
    n_blocks = tl.cdiv(end - start, BLOCK)
    for k in range(0, n_blocks):
        i = start + (n_blocks - 1 - k) * BLOCK + lanes
        inside = i < end
        w, s, d, trans_next = _weights(sigma_ptr, deltas_ptr, trans_after_ptr, i, start, end)
        # The next sample's weight within this block (the last lane's next sample is in the carried sums already):
        # the transmittance before it is this sample's T_{i+1}.
        next_in = ((i + 1) < end) & (lanes < BLOCK - 1)
        x_next = (tl.load(sigma_ptr + i + 1, mask=next_in, other=0.0)
                  * tl.load(deltas_ptr + i + 1, mask=next_in, other=0.0))
        w_next = tl.where(next_in, trans_next * _one_minus_exp_neg(x_next), 0.0)
        cr = tl.load(rgb_ptr + i * 3, mask=inside, other=0.0)
        cg = tl.load(rgb_ptr + i * 3 + 1, mask=inside, other=0.0)
        cb = tl.load(rgb_ptr + i * 3 + 2, mask=inside, other=0.0)
        # Suffix sums of the next samples' contributions: the block's own part by a reverse scan, the rest carried.
        a_r = after_r + tl.cumsum(w_next * tl.load(rgb_ptr + i * 3 + 3, mask=next_in, other=0.0), axis=0,
                                  reverse=True)
        a_g = after_g + tl.cumsum(w_next * tl.load(rgb_ptr + i * 3 + 4, mask=next_in, other=0.0), axis=0,
                                  reverse=True)
        a_b = after_b + tl.cumsum(w_next * tl.load(rgb_ptr + i * 3 + 5, mask=next_in, other=0.0), axis=0,
                                  reverse=True)
        dx = gr * (trans_next * cr - a_r) + gg * (trans_next * cg - a_g) + gb * (trans_next * cb - a_b) + g_op_term
        if HAS_T:
            ti = tl.load(t_ptr + i, mask=inside, other=0.0)
            a_d = after_d + tl.cumsum(w_next * tl.load(t_ptr + i + 1, mask=next_in, other=0.0), axis=0,
                                      reverse=True)
            dx += gd * (trans_next * ti - a_d)
            tl.store(g_t_ptr + i, w * gd, mask=inside)
            after_d += tl.sum(w * ti, axis=0)
        tl.store(g_sigma_ptr + i, d * dx, mask=inside)
        tl.store(g_deltas_ptr + i, s * dx, mask=inside)
        tl.store(g_rgb_ptr + i * 3, w * gr, mask=inside)
        tl.store(g_rgb_ptr + i * 3 + 1, w * gg, mask=inside)
        tl.store(g_rgb_ptr + i * 3 + 2, w * gb, mask=inside)
        after_r += tl.sum(w * cr, axis=0)
        after_g += tl.sum(w * cg, axis=0)
        after_b += tl.sum(w * cb, axis=0)


def composite_forward(sigma, rgb, deltas, t, has_t: int, offsets, bg, out_rgb, out_opacity, out_depth, out_t_end,
                      trans_after) -> None:
    """As `compositing.composite_forward` (the same arguments)."""
    n_rays = out_rgb.shape[0]
    _forward[(n_rays,)](sigma, rgb, deltas, t, offsets, bg, out_rgb, out_opacity, out_depth, out_t_end, trans_after,
                        bg.shape[0], HAS_T=bool(has_t), BLOCK=BLOCK)


def composite_backward(sigma, rgb, deltas, t, has_t: int, offsets, bg, t_end, trans_after, g_rgb_ray, g_opacity,
                       g_depth, g_sigma, g_rgb, g_deltas, g_t) -> None:
    """As `compositing.composite_backward` (the same arguments)."""
    _backward[(g_rgb_ray.shape[0],)](sigma, rgb, deltas, t, offsets, bg, t_end, trans_after, g_rgb_ray, g_opacity,
                                     g_depth, g_sigma, g_rgb, g_deltas, g_t, bg.shape[0], HAS_T=bool(has_t),
                                     BLOCK=BLOCK)
