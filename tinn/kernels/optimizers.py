"""Optimizer kernels. Every parameter tensor is viewed as (rows, cols): one row per network of an
array (rows = 1 for a plain tensor), so `lr_scale[row]` gives per-network learning rates.

All updates are elementwise and in place; state tensors have the parameter's (rows, cols) shape.
Kernels of optimizers that skip on the device (`Optimizer.skips_on_device`) take `skip`, a (1,) int32 flag
(a gradient scaler's verdict, tinn/gradient_scaling.py): where it is 1 they change nothing. Where a step count
enters the update, they take it as `step_now`, the steps asked of the host, less `pending[0]`, those of them
skipped on the device that the host has not settled yet (tinn/optimizers/base.py): the steps taken. Their
learning rate is `lr * lr_factor[0]`: the host's rate times one, or one times a rate a schedule computed on the
device (ExponentialDecay's, `decayed_rate`).
Loops are plain ndrange loops (no static unrolling) to keep compile time small.
"""
from ..backend import ti

from .arch import walks_rows
from .launch import fast_kernel

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f64_1d = ti.types.ndarray(dtype=ti.f64, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)


@ti.func
def _weight_decay(rel: ti.f32, absolute: ti.f32, w: ti.f32) -> ti.f32:
    # Relative decay ~ L2 regularisation, absolute decay ~ L1 (shrinks |w| by a constant), as in tcnn.
    return (1.0 - rel) * w - ti.select(w >= 0.0, absolute, -absolute)


@fast_kernel
@ti.kernel
def sgd_step(w: f32_2d, g: f32_2d, lr_scale: f32_1d, skip: i32_1d, lr_factor: f32_1d, lr: ti.f32, l2_reg: ti.f32):
    for r, c in ti.ndrange(w.shape[0], w.shape[1]):
        if skip[0] == 0:
            wv = w[r, c]
            w[r, c] = wv - lr * lr_factor[0] * lr_scale[r] * (g[r, c] + l2_reg * wv)


@ti.func
def adam_update_corrected(wv, grad, m_old, v_old, lr_t, l2_reg, beta1, beta2, epsilon, rel_decay, abs_decay, clip,
                          grad_clip, lower, upper):
    """tcnn's Adam on one element: (new weight, new m, new v) from the weight, its gradient and its moments, with
    the bias-corrected rate lr_t given (the learning rate, the row's scale and the correction of the element's step
    count, read from the optimizer's table: `_correction_at`)."""
    grad += l2_reg * wv
    if grad_clip != 0.0:
        # tcnn clips after the L2 term, before the moments: copysign(min(|g|, clip), g)
        grad = ti.select(grad >= 0.0, ti.min(grad, grad_clip), ti.max(grad, -grad_clip))
    mv = beta1 * m_old + (1.0 - beta1) * grad
    vv = beta2 * v_old + (1.0 - beta2) * grad * grad
    eff = ti.min(ti.max(lr_t / (ti.sqrt(vv) + epsilon), lower), upper)  # AdaBound clamp (no-op by default)
    nw = _weight_decay(rel_decay * lr_t, abs_decay * lr_t, wv) - eff * mv
    if clip != 0.0:
        nw = ti.min(ti.max(nw, -clip), clip)
    return nw, mv, vv


def _flat() -> bool:
    """Whether the Adam kernels walk a table as one flat range and look up a shared step count's bias correction
    once, before the loop (the CPU, `arch.walks_rows`), rather than as (row, column) threads each looking it up
    (CUDA: the update is bound by memory, a flat index's row costs a division, and the prelude would be one more
    task per launch; measured slower there)."""
    return walks_rows()


@ti.func
def _correction_at(corrections: ti.template(), t):
    """Adam's bias correction at step count t, from the table the optimizer keeps (`Adam._correction_table`: every
    count up to the steps asked so far, computed in float64 once); a count past its end takes the last entry."""
    return corrections[ti.min(t, corrections.shape[0] - 1)]


@ti.func
def _shared_correction(step_now, pending: ti.template(), corrections: ti.template()):
    """The bias correction of a tensor with one step count (step_now > 0): step_now, the steps asked of it (kept
    on the host), less `pending`, those of them skipped on the device and not yet settled by the host
    (LeafOptimizer.settle). 0 for a tensor whose elements count their own steps (step_now == 0)."""
    correction = 0.0
    if step_now != 0:
        correction = _correction_at(corrections, step_now - pending[0])
    return correction


@ti.func
def _nonzero(v) -> ti.i32:
    """Whether v is not +-0 (NaN included), on its bits: under fast math `v != 0.0` may be folded as if NaN could
    not occur, and skip a NaN gradient as if it were zero (tcnn's Adam updates with it)."""
    return ti.cast((ti.bit_cast(v, ti.i32) & 0x7FFFFFFF) != 0, ti.i32)


@ti.func
def _adam_element(w: ti.template(), g: ti.template(), m: ti.template(), v: ti.template(), steps: ti.template(),
                  lr_scale: ti.template(), i, row, lr, l2_reg, skip_zero, step_now, pending: ti.template(),
                  correction, skip: ti.template(), lr_factor: ti.template(), corrections: ti.template(), beta1, beta2,
                  epsilon, rel_decay, abs_decay, clip, grad_clip, lower, upper):
    """Element i (flat) of a table, in row `row`."""
    grad = g[i]
    if skip[0] == 0 and (skip_zero == 0 or _nonzero(grad)):
        # A tensor whose elements are never skipped shares one step count (whose correction a flat launch
        # computed once, `_shared_correction`); skipping zero gradients gives every element its own count.
        rate = correction
        if step_now == 0:
            t = steps[i] + 1
            steps[i] = t
            rate = _correction_at(corrections, t)
        elif ti.static(not _flat()):
            rate = _shared_correction(step_now, pending, corrections)
        nw, mv, vv = adam_update_corrected(w[i], grad, m[i], v[i], lr * lr_factor[0] * lr_scale[row] * rate,
                                           l2_reg, beta1, beta2, epsilon, rel_decay, abs_decay, clip, grad_clip,
                                           lower, upper)
        m[i] = mv
        v[i] = vv
        w[i] = nw


@ti.func
def _row_of(i, cols, n):
    """The row of flat element i of a table of n elements in rows of `cols` (no division for one row)."""
    row = 0
    if cols != n:
        row = i // cols
    return row


# The Adam kernels take a (rows, cols) table's contiguous storage flat and `cols`; `_flat` decides how they walk it
# (docs/performance.md, "Arrays on the CPU").
@fast_kernel
@ti.kernel
def adam_step(w: f32_1d, g: f32_1d, m: f32_1d, v: f32_1d, steps: i32_1d, lr_scale: f32_1d, cols: ti.i32,
              lr: ti.f32, l2_reg: ti.f32, skip_zero: ti.i32, step_now: ti.i32, pending: i32_1d, skip: i32_1d,
              lr_factor: f32_1d, corrections: f32_1d, beta1: ti.f32, beta2: ti.f32, epsilon: ti.f32,
              rel_decay: ti.f32, abs_decay: ti.f32, clip: ti.f32, grad_clip: ti.f32, lower: ti.f32, upper: ti.f32):
    """tcnn Adam on a (rows, cols) table given flat. `lr`, `l2_reg` and `skip_zero` are per tensor: matrix params
    (network weights) take l2_reg, non-matrix params (encoding tables) non_matrix_l2_reg and, with skip_zero,
    leave elements whose gradient is exactly 0 alone: hash-grid entries untouched by a batch must neither move
    nor age their moments, hence the per-element step counter used for bias correction."""
    if ti.static(_flat()):
        correction = _shared_correction(step_now, pending, corrections)
        for i in range(w.shape[0]):
            _adam_element(w, g, m, v, steps, lr_scale, i, _row_of(i, cols, w.shape[0]), lr, l2_reg, skip_zero,
                          step_now, pending, correction, skip, lr_factor, corrections, beta1, beta2, epsilon,
                          rel_decay, abs_decay, clip, grad_clip, lower, upper)
    else:
        for r, c in ti.ndrange(w.shape[0] // cols, cols):
            _adam_element(w, g, m, v, steps, lr_scale, r * cols + c, r, lr, l2_reg, skip_zero, step_now, pending,
                          0.0, skip, lr_factor, corrections, beta1, beta2, epsilon, rel_decay, abs_decay, clip,
                          grad_clip, lower, upper)


@fast_kernel
@ti.kernel
def adam_step_pair(w: f32_1d, g: f32_1d, m: f32_1d, v: f32_1d, steps: i32_1d, lr_scale: f32_1d, cols: ti.i32,
                   lr: ti.f32, l2_reg: ti.f32, skip_zero: ti.i32, step_now: ti.i32, pending: i32_1d, skip: i32_1d,
                   lr_factor: f32_1d, w2: f32_1d, g2: f32_1d, m2: f32_1d, v2: f32_1d, steps2: i32_1d,
                   lr_scale2: f32_1d, cols2: ti.i32, lr2: ti.f32, l2_reg2: ti.f32, skip_zero2: ti.i32,
                   step_now2: ti.i32, pending2: i32_1d, skip2: i32_1d, lr_factor2: f32_1d, corrections: f32_1d,
                   beta1: ti.f32, beta2: ti.f32, epsilon: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32, clip: ti.f32,
                   grad_clip: ti.f32, lower: ti.f32, upper: ti.f32):
    """`adam_step` of two parameter tensors (an encoding and its network) in one launch: Taichi's
    launch path costs tens of microseconds of host time, a sizeable part of a small training step."""
    if ti.static(_flat()):
        correction = _shared_correction(step_now, pending, corrections)
        correction2 = _shared_correction(step_now2, pending2, corrections)
        for i in range(w.shape[0]):
            _adam_element(w, g, m, v, steps, lr_scale, i, _row_of(i, cols, w.shape[0]), lr, l2_reg, skip_zero,
                          step_now, pending, correction, skip, lr_factor, corrections, beta1, beta2, epsilon,
                          rel_decay, abs_decay, clip, grad_clip, lower, upper)
        for i in range(w2.shape[0]):
            _adam_element(w2, g2, m2, v2, steps2, lr_scale2, i, _row_of(i, cols2, w2.shape[0]), lr2, l2_reg2,
                          skip_zero2, step_now2, pending2, correction2, skip2, lr_factor2, corrections, beta1, beta2,
                          epsilon, rel_decay, abs_decay, clip, grad_clip, lower, upper)
    else:
        for r, c in ti.ndrange(w.shape[0] // cols, cols):
            _adam_element(w, g, m, v, steps, lr_scale, r * cols + c, r, lr, l2_reg, skip_zero, step_now, pending,
                          0.0, skip, lr_factor, corrections, beta1, beta2, epsilon, rel_decay, abs_decay, clip,
                          grad_clip, lower, upper)
        for r, c in ti.ndrange(w2.shape[0] // cols2, cols2):
            _adam_element(w2, g2, m2, v2, steps2, lr_scale2, r * cols2 + c, r, lr2, l2_reg2, skip_zero2, step_now2,
                          pending2, 0.0, skip2, lr_factor2, corrections, beta1, beta2, epsilon, rel_decay, abs_decay,
                          clip, grad_clip, lower, upper)


@fast_kernel
@ti.kernel
def novograd_step(w: f32_2d, g: f32_2d, m: f32_2d, v: f32_2d, seg_start: i32_1d, lr_scale: f32_1d,
                  skip: i32_1d, pending: i32_1d, step_now: ti.i32, lr_factor: f32_1d,
                  lr: ti.f32, beta1: ti.f32, beta2: ti.f32, epsilon: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32):
    """Novograd: one second moment per (network row, layer segment) from the layer's squared gradient
    norm. One thread per (row, segment) sums serially, so results are bit-reproducible (no atomics). The first
    step taken starts the moments at their exact values (beta1 = beta2 = 0, as tcnn)."""
    for r, s in ti.ndrange(v.shape[0], v.shape[1]):
        if skip[0] == 0:
            first = step_now - pending[0] == 1
            b1 = ti.select(first, 0.0, beta1)
            b2 = ti.select(first, 0.0, beta2)
            sq = 0.0
            for c in range(seg_start[s], seg_start[s + 1]):
                sq += g[r, c] * g[r, c]
            vv = b2 * v[r, s] + (1.0 - b2) * sq
            v[r, s] = vv
            lr_r = lr * lr_factor[0] * lr_scale[r]
            inv = 1.0 / (ti.sqrt(vv) + epsilon)
            for c in range(seg_start[s], seg_start[s + 1]):
                mv = b1 * m[r, c] + (1.0 - b1) * g[r, c] * inv
                m[r, c] = mv
                w[r, c] = _weight_decay(rel_decay * lr_r, abs_decay * lr_r, w[r, c]) - lr_r * mv


@fast_kernel
@ti.kernel
def shampoo_moments(w: f32_2d, g: f32_2d, m1: f32_2d, m2: f32_2d, u: f32_2d, l2_reg: ti.f32,
                    a1: ti.f32, b1: ti.f32, a2: ti.f32, b2: ti.f32, epsilon: ti.f32):
    """Debiased first/second moments (m = b*m + a*g with tcnn's debiased a, b) and the Adam
    direction u = m1 / (sqrt(m2) + eps) that Shampoo preconditions."""
    for r, c in ti.ndrange(w.shape[0], w.shape[1]):
        gv = g[r, c] + l2_reg * w[r, c]
        mv = b1 * m1[r, c] + a1 * gv
        sv = b2 * m2[r, c] + a2 * gv * gv
        m1[r, c] = mv
        m2[r, c] = sv
        u[r, c] = mv / (ti.sqrt(sv) + epsilon)


@fast_kernel
@ti.kernel
def shampoo_gram(src: f32_2d, off: ti.i32, rows_m: ti.i32, cols_n: ti.i32, L: f32_3d, R: f32_3d,
                 alpha: ti.f32, beta: ti.f32):
    """L = beta L + alpha G G^T and R = beta R + alpha G^T G for the (M, N) matrix G stored row-major
    at columns [off, off + M N) of every network row of `src`."""
    for n, i, j in ti.ndrange(src.shape[0], rows_m, rows_m):
        acc = 0.0
        for k in range(cols_n):
            acc += src[n, off + i * cols_n + k] * src[n, off + j * cols_n + k]
        L[n, i, j] = beta * L[n, i, j] + alpha * acc
    for n, i, j in ti.ndrange(src.shape[0], cols_n, cols_n):
        acc = 0.0
        for k in range(rows_m):
            acc += src[n, off + k * cols_n + i] * src[n, off + k * cols_n + j]
        R[n, i, j] = beta * R[n, i, j] + alpha * acc


@fast_kernel
@ti.kernel
def shampoo_layer_step(w: f32_2d, u: f32_2d, sm: f32_2d, off: ti.i32, rows_m: ti.i32, cols_n: ti.i32,
                       L_root: f32_3d, R_root: f32_3d, tmp: f32_3d, lr_scale: f32_1d, lr: ti.f32,
                       a_s: ti.f32, b_s: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32, frobenius: ti.i32):
    """sm = EMA(L_root u R_root); w -= lr' sm with lr' = lr * |u|_F / |sm|_F (grafting onto the Adam
    step size) when `frobenius`. The top-level loops run one after the other."""
    for n, i, j in ti.ndrange(w.shape[0], rows_m, cols_n):
        acc = 0.0
        for k in range(rows_m):
            acc += L_root[n, i, k] * u[n, off + k * cols_n + j]
        tmp[n, i, j] = acc
    for n, i, j in ti.ndrange(w.shape[0], rows_m, cols_n):
        acc = 0.0
        for k in range(cols_n):
            acc += tmp[n, i, k] * R_root[n, k, j]
        e = off + i * cols_n + j
        sm[n, e] = b_s * sm[n, e] + a_s * acc
    for n in range(w.shape[0]):
        lr_n = lr * lr_scale[n]
        if frobenius != 0:
            nu = 0.0
            ns = 0.0
            for e in range(off, off + rows_m * cols_n):
                nu += u[n, e] * u[n, e]
                ns += sm[n, e] * sm[n, e]
            lr_n = ti.select(ns > 0.0, lr_n * ti.sqrt(nu) / ti.sqrt(ns), 0.0)
        for e in range(off, off + rows_m * cols_n):
            w[n, e] = _weight_decay(rel_decay * lr_n, abs_decay * lr_n, w[n, e]) - lr_n * sm[n, e]


@fast_kernel
@ti.kernel
def direction_step(w: f32_2d, u: f32_2d, lr_scale: f32_1d, lr: ti.f32, rel_decay: ti.f32, abs_decay: ti.f32):
    """w = decay(w) - lr * u (Shampoo's update of parameters not covered by matrices)."""
    for r, c in ti.ndrange(w.shape[0], w.shape[1]):
        lr_r = lr * lr_scale[r]
        w[r, c] = _weight_decay(rel_decay * lr_r, abs_decay * lr_r, w[r, c]) - lr_r * u[r, c]


@fast_kernel
@ti.kernel
def ema_step(w: f32_2d, ema: f32_2d, skip: i32_1d, pending: i32_1d, step_now: ti.i32, decay: ti.f64):
    """Bias-corrected exponential moving average of the weights (equals w after the first step), after the
    nested optimizer's step number t (taken): debiased by 1 - decay^(t-1) and 1 / (1 - decay^t), in float64."""
    for r, c in ti.ndrange(w.shape[0], w.shape[1]):
        if skip[0] == 0:
            t = ti.cast(step_now - pending[0], ti.f64)
            debias_old = ti.cast(1.0 - ti.pow(decay, t - 1.0), ti.f32)
            debias_new = ti.cast(1.0 / (1.0 - ti.pow(decay, t)), ti.f32)
            ema[r, c] = (ema[r, c] * ti.cast(decay, ti.f32) * debias_old
                         + w[r, c] * ti.cast(1.0 - decay, ti.f32)) * debias_new


@fast_kernel
@ti.kernel
def average_step(w: f32_2d, samples: f32_3d, avg: f32_2d, skip: i32_1d, pending: i32_1d, step_now: ti.i32,
                 inv_n: ti.f32):
    """Sliding-window mean over the last n samples (`samples`: (n, rows, cols)): avg += (w - oldest) / n, where
    the oldest is slot t mod n after the nested optimizer's step number t (taken); the slot takes w."""
    for r, c in ti.ndrange(w.shape[0], w.shape[1]):
        if skip[0] == 0:
            slot = (step_now - pending[0]) % samples.shape[0]
            wv = w[r, c]
            avg[r, c] = avg[r, c] + (wv - samples[slot, r, c]) * inv_n
            samples[slot, r, c] = wv


@fast_kernel
@ti.kernel
def lookahead_step(w: f32_2d, slow: f32_2d, skip: i32_1d, pending: i32_1d, step_now: ti.i32, n_steps: ti.i32,
                   alpha: ti.f32):
    """slow <- slow + alpha (fast - slow); the fast weights restart from it. Only after the nested optimizer's
    step number t (taken) with t mod n_steps = 0."""
    for r, c in ti.ndrange(w.shape[0], w.shape[1]):
        if skip[0] == 0 and (step_now - pending[0]) % n_steps == 0:
            nw = slow[r, c] * (1.0 - alpha) + w[r, c] * alpha
            w[r, c] = nw
            slow[r, c] = nw


@fast_kernel
@ti.kernel
def accumulate_grad(pool: f32_2d, g: f32_2d, first: ti.i32, inv_n: ti.f32):
    for r, c in ti.ndrange(pool.shape[0], pool.shape[1]):
        prev = 0.0
        if first == 0:
            prev = pool[r, c]
        pool[r, c] = prev + g[r, c] * inv_n


@fast_kernel
@ti.kernel
def decayed_rate(factor: f64_1d, rate: f32_1d, skip: i32_1d, pending: i32_1d, step_now: ti.i32, start: ti.i32,
                 interval: ti.i32, end: ti.i32, base: ti.f64, base_rate: ti.f64):
    """ExponentialDecay's learning rate for the nested step about to run, its count t taken so far being
    step_now - pending[0]: the factor restarts at 1 for t = 0 and takes `base` at every t in the schedule
    (float64, as the host computes it); `rate` = base_rate x factor, rounded to float32 once. A skipped step
    leaves the factor."""
    if skip[0] == 0:
        t = step_now - pending[0]
        f = factor[0]
        if t == 0:
            f = 1.0
        if start <= t and t <= end and (t - start) % interval == 0:
            f *= base
        factor[0] = f
    rate[0] = ti.cast(base_rate * factor[0], ti.f32)
