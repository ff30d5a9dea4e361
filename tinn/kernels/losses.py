"""Loss kernels: per-element value and gradient of every tcnn loss, plus per-network sums.

One kernel serves all losses (the loss is a runtime switch) so a process compiles it
once. It runs one thread per element; torch sums the per-element values.
"""
from ..backend import ti

from .arch import walks_rows
from .launch import fast_kernel

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

# Loss ids (the Python side maps otype names to these).
L2, L1, RELATIVE_L2, RELATIVE_L1, MAPE, SMAPE, RELATIVE_L2_LUMINANCE, CROSS_ENTROPY, VARIANCE = range(9)

EPS = 0.01  # tcnn's stabiliser in all relative losses


@ti.func
def _signed(scale: ti.f32, diff: ti.f32) -> ti.f32:
    # copysign(scale, diff) with +0 -> +scale, as CUDA's copysignf does for +0.
    return ti.select(diff >= 0.0, scale, -scale)


@ti.func
def element(kind, pred: ti.template(), b, d, t, q):
    """(loss, d loss / d pred) of element (b, d) of `pred` against target value t and pdf value q, neither
    divided by the number of elements. `kind` may be a runtime value or a constant (the fused deltas kernel
    computes its output's gradient with it, `mlp_fused.backward_deltas`)."""
    p = pred[b, d]
    v = 0.0
    dv = 0.0
    # Where the pdf enters differs per loss; this follows tcnn loss by loss.
    if kind == L2:
        diff = p - t
        v = diff * diff / q
        dv = 2.0 * diff / q
    elif kind == L1:
        diff = p - t
        v = ti.abs(diff) / q
        dv = _signed(1.0 / q, diff)
    elif kind == RELATIVE_L2:
        # tcnn since 2022: normalised by the prediction only (Noise2Noise); the denominator is a
        # constant in the gradient and the pdf divides the whole term, as in L2.
        diff = p - t
        s = 1.0 / (p * p + EPS) / q
        v = diff * diff * s
        dv = 2.0 * diff * s
    elif kind == RELATIVE_L1:
        diff = p - t
        s = 1.0 / (ti.abs(p) + EPS) / q
        v = ti.abs(diff) * s
        dv = _signed(s, diff)
    elif kind == MAPE:
        diff = p - t
        s = 1.0 / (ti.abs(t) + EPS) / q
        v = ti.abs(diff) * s
        dv = _signed(s, diff)
    elif kind == SMAPE:
        diff = p - t
        s = 1.0 / (0.5 * (ti.abs(t) + ti.abs(p)) + EPS) / q  # constant in the gradient, as in tcnn
        v = ti.abs(diff) * s
        dv = _signed(s, diff)
    elif kind == RELATIVE_L2_LUMINANCE:
        # Luminance of the predicted RGB (plus the second RGB triple of 6-channel outputs, as tcnn
        # does); treated as a constant in the gradient. Each element re-reads its row's RGB (cached).
        r, g, bl = pred[b, 0], pred[b, 1], pred[b, 2]
        if pred.shape[1] >= 6:
            r += pred[b, 3]
            g += pred[b, 4]
            bl += pred[b, 5]
        lum = 0.299 * r + 0.587 * g + 0.114 * bl
        inv_lum_sq = 1.0 / (lum * lum + EPS)
        diff = p - t
        v = diff * diff * inv_lum_sq / q
        dv = 2.0 * diff * inv_lum_sq / q
    elif kind == CROSS_ENTROPY:
        f = -t / q
        v = f * ti.log(p)
        dv = f / p
    elif kind == VARIANCE:
        f = t * t / q
        v = f / p - f / q
        dv = -f / (p * p)
    return v, dv


@fast_kernel
@ti.kernel
def loss_forward(kind: ti.i32, pred: f32_2d, target: f32_2d, pdf: f32_2d, use_pdf: ti.i32, inv_n: ti.f32,
                 grad: f32_2d, value: f32_2d):
    """grad[b, d] = d(mean loss)/d pred[b, d] (already divided by N); value[b, d] = loss[b, d] (not divided).

    On CUDA one thread per element: consecutive threads touch consecutive addresses (coalesced), where a thread
    per sample strided by the row length. On the CPU one task per sample walks its row (`arch.walks_rows`: the
    2-D struct-for's per-element index arithmetic cost more than the loss).
    """
    if ti.static(walks_rows()):
        for b in range(pred.shape[0]):
            for d in range(pred.shape[1]):
                _loss_element(kind, pred, target, pdf, use_pdf, inv_n, grad, value, b, d)
    else:
        for b, d in pred:
            _loss_element(kind, pred, target, pdf, use_pdf, inv_n, grad, value, b, d)


@ti.func
def _loss_element(kind, pred: ti.template(), target: ti.template(), pdf: ti.template(), use_pdf, inv_n,
                  grad: ti.template(), value: ti.template(), b, d):
    q = 1.0
    if use_pdf != 0:
        q = pdf[b, d]
    v, dv = element(kind, pred, b, d, target[b, d], q)
    value[b, d] = v
    grad[b, d] = dv * inv_n


@fast_kernel
@ti.kernel
def per_network_sums(row_value: f32_1d, net_ids: i32_1d, sums: f32_1d, counts: i32_1d):
    """sums[k] += row values of samples of network k; counts[k] += their number (both zeroed by the caller)."""
    for b in range(row_value.shape[0]):
        k = net_ids[b]
        sums[k] += row_value[b]
        counts[k] += 1
