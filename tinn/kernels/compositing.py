"""Volume compositing of packed ray samples: forward and hand-written backward, one thread per ray.

Ray r owns samples offsets[r]:offsets[r+1], front to back. With x_i = sigma_i * delta_i,
alpha_i = 1 - exp(-x_i), T_i = prod_{j<i} exp(-x_j), w_i = T_i alpha_i:

    C = sum_i w_i c_i + T_end * bg      (T_end = 1 - sum_i w_i, the light that passes through)
    D = sum_i w_i t_i                   (expected depth, only with t)
    opacity = sum_i w_i = 1 - T_end

The backward pass walks each ray back to front with the suffix sum A_i = sum_{j>i} w_j c_j + T_end bg:

    dC/dc_i = w_i,   dC/dx_i = T_{i+1} c_i - A_i,   d opacity/dx_i = T_end,   dD/dx_i = T_{i+1} t_i - sum_{j>i} w_j t_j

and x_i = sigma_i delta_i gives d/dsigma_i = delta_i d/dx_i and d/ddelta_i = sigma_i d/dx_i. The forward pass
stores T_{i+1} per sample so the backward pass needs no division by exp(-x) (which underflows in dense media)
and no subtraction from the total (which loses the small late contributions).
"""
from ..backend import ti
from .launch import fast_kernel

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
i32_offsets = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.func
def one_minus_exp_neg(x: ti.f32) -> ti.f32:
    # 1 - exp(-x) loses most of its digits in float32 for small x (thin media, fine steps); a short series keeps them.
    r = 0.0
    if ti.abs(x) < 1e-2:
        r = x * (1.0 - x * (0.5 - x * (1.0 / 6.0)))
    else:
        r = 1.0 - ti.exp(-x)
    return r


@ti.func
def _bg_row(r: ti.i32, n_bg_rows: ti.i32) -> ti.i32:
    row = 0
    if n_bg_rows > 1:
        row = r
    return row


@fast_kernel
@ti.kernel
def composite_forward(sigma: f32_1d, rgb: f32_2d, deltas: f32_1d, t: f32_1d, has_t: ti.i32, offsets: i32_offsets,
                      bg: f32_2d, out_rgb: f32_2d, out_opacity: f32_1d, out_depth: f32_1d, out_t_end: f32_1d,
                      trans_after: f32_1d):
    """Writes per ray the colour, opacity, depth (if has_t) and T_end; per sample T_{i+1} (for the backward pass)."""
    for r in range(out_rgb.shape[0]):
        start = offsets[r]
        end = offsets[r + 1]
        trans = 1.0
        acc_r = 0.0
        acc_g = 0.0
        acc_b = 0.0
        acc_d = 0.0
        acc_w = 0.0  # opacity as sum_i w_i: 1 - T_end would lose the digits of a faint ray
        for i in range(start, end):
            x = sigma[i] * deltas[i]
            w = trans * one_minus_exp_neg(x)
            acc_r += w * rgb[i, 0]
            acc_g += w * rgb[i, 1]
            acc_b += w * rgb[i, 2]
            acc_w += w
            if has_t != 0:
                acc_d += w * t[i]
            trans = trans * ti.exp(-x)
            trans_after[i] = trans
        row = _bg_row(r, bg.shape[0])
        out_rgb[r, 0] = acc_r + trans * bg[row, 0]
        out_rgb[r, 1] = acc_g + trans * bg[row, 1]
        out_rgb[r, 2] = acc_b + trans * bg[row, 2]
        out_opacity[r] = acc_w
        out_depth[r] = acc_d
        out_t_end[r] = trans


@fast_kernel
@ti.kernel
def composite_backward(sigma: f32_1d, rgb: f32_2d, deltas: f32_1d, t: f32_1d, has_t: ti.i32, offsets: i32_offsets,
                       bg: f32_2d, t_end: f32_1d, trans_after: f32_1d,
                       g_rgb_ray: f32_2d, g_opacity: f32_1d, g_depth: f32_1d,
                       g_sigma: f32_1d, g_rgb: f32_2d, g_deltas: f32_1d, g_t: f32_1d):
    """Per-sample gradients of sum_r (g_rgb_ray[r] . C_r + g_opacity[r] opacity_r + g_depth[r] D_r)."""
    for r in range(g_rgb_ray.shape[0]):
        start = offsets[r]
        end = offsets[r + 1]
        row = _bg_row(r, bg.shape[0])
        te = t_end[r]
        gr = g_rgb_ray[r, 0]
        gg = g_rgb_ray[r, 1]
        gb = g_rgb_ray[r, 2]
        gd = 0.0
        if has_t != 0:
            gd = g_depth[r]
        g_op_term = g_opacity[r] * te
        # Suffix sums A_i (colour) and the depth analogue, starting behind the last sample.
        after_r = te * bg[row, 0]
        after_g = te * bg[row, 1]
        after_b = te * bg[row, 2]
        after_d = 0.0
        for k in range(end - start):
            i = end - 1 - k
            trans_before = 1.0
            if i > start:
                trans_before = trans_after[i - 1]
            trans_next = trans_after[i]
            s = sigma[i]
            d = deltas[i]
            w = trans_before * one_minus_exp_neg(s * d)
            cr = rgb[i, 0]
            cg = rgb[i, 1]
            cb = rgb[i, 2]
            dx = gr * (trans_next * cr - after_r) + gg * (trans_next * cg - after_g) + gb * (trans_next * cb - after_b)
            dx += g_op_term
            ti_ = 0.0
            if has_t != 0:
                ti_ = t[i]
                dx += gd * (trans_next * ti_ - after_d)
                g_t[i] = w * gd
            g_sigma[i] = d * dx
            g_deltas[i] = s * dx
            g_rgb[i, 0] = w * gr
            g_rgb[i, 1] = w * gg
            g_rgb[i, 2] = w * gb
            after_r += w * cr
            after_g += w * cg
            after_b += w * cb
            after_d += w * ti_
