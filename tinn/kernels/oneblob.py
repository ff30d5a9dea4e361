"""OneBlob encoding kernels (tcnn): a quartic-kernel blob integrated over n_bins bins per dim.

Feature j = d * n_bins + k is W(r_k - x) - W(l_k - x) with bin bounds l_k = k/n, r_k = (k+1)/n,
where W is the quartic kernel's CDF (radius 1/n_bins) wrapped around [0, 1] by adding the copies
shifted by -1 and +1, as tcnn does.
"""
from ..backend import ti
from .launch import fast_kernel

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)


@ti.func
def _cdf(t, n):
    u = t * n
    u2 = u * u
    return ti.min(ti.max(15.0 / 16.0 * u * (1.0 - 2.0 / 3.0 * u2 + 0.2 * u2 * u2) + 0.5, 0.0), 1.0)


@ti.func
def _cdf_d(t, n):
    u = t * n
    tmp = ti.max(1.0 - u * u, 0.0)
    return 15.0 / 16.0 * tmp * tmp * n


@ti.func
def _cdf_dd(t, n):
    u = t * n
    r = 0.0
    if ti.abs(u) < 1.0:
        r = -15.0 / 4.0 * u * (1.0 - u * u) * n * n
    return r


@ti.func
def _wrapped(t, n):
    return _cdf(t, n) + _cdf(t - 1.0, n) + _cdf(t + 1.0, n)


@ti.func
def _wrapped_d(t, n):
    return _cdf_d(t, n) + _cdf_d(t - 1.0, n) + _cdf_d(t + 1.0, n)


@ti.func
def _wrapped_dd(t, n):
    return _cdf_dd(t, n) + _cdf_dd(t - 1.0, n) + _cdf_dd(t + 1.0, n)


@fast_kernel
@ti.kernel
def oneblob_forward(x: f32_2d, out: f32_2d, n_bins: ti.i32):
    for b, d in ti.ndrange(x.shape[0], x.shape[1]):
        n = ti.cast(n_bins, ti.f32)
        xv = x[b, d]
        left = _wrapped(-xv, n)
        nan = ti.math.isnan(xv)  # the clamped CDF would turn a NaN input into finite features
        for k in range(n_bins):
            right = _wrapped(ti.cast(k + 1, ti.f32) / n - xv, n)
            out[b, d * n_bins + k] = ti.select(nan, ti.math.nan, right - left)
            left = right


@fast_kernel
@ti.kernel
def oneblob_backward(x: f32_2d, dy: f32_2d, dx: f32_2d, n_bins: ti.i32):
    for b, d in ti.ndrange(x.shape[0], x.shape[1]):
        n = ti.cast(n_bins, ti.f32)
        xv = x[b, d]
        left = _wrapped_d(-xv, n)
        acc = 0.0
        for k in range(n_bins):
            right = _wrapped_d(ti.cast(k + 1, ti.f32) / n - xv, n)
            acc += dy[b, d * n_bins + k] * (left - right)
            left = right
        dx[b, d] = acc


@fast_kernel
@ti.kernel
def oneblob_derivatives(x: f32_2d, fp: f32_2d, fpp: f32_2d, n_bins: ti.i32):
    for b, d in ti.ndrange(x.shape[0], x.shape[1]):
        n = ti.cast(n_bins, ti.f32)
        xv = x[b, d]
        left_d, left_dd = _wrapped_d(-xv, n), _wrapped_dd(-xv, n)
        for k in range(n_bins):
            t = ti.cast(k + 1, ti.f32) / n - xv
            right_d, right_dd = _wrapped_d(t, n), _wrapped_dd(t, n)
            fp[b, d * n_bins + k] = left_d - right_d
            fpp[b, d * n_bins + k] = right_dd - left_dd
            left_d, left_dd = right_d, right_dd
