"""TriangleWave encoding kernels (tcnn / Neural Radiance Caching).

Feature j = d * n_frequencies + k encodes input dim d at frequency 2^k:
v = x * 2^(k-1) + k/4 (the k/4 phase shift disambiguates locations), y = 4|frac(v) - 1/2| - 1.
The slope is +-2^(k+1); the second derivative is zero almost everywhere.
"""
from ..backend import ti
from .launch import fast_kernel

from .basic_encodings import pow2

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)


@ti.func
def _phase(x, k):
    return x * pow2(k - 1) + ti.cast(k, ti.f32) * 0.25


@ti.func
def _slope(v, k):
    frac = v - ti.floor(v)
    s = pow2(k + 1)
    return s if frac >= 0.5 else -s


@fast_kernel
@ti.kernel
def triangle_wave_forward(x: f32_2d, out: f32_2d, n_frequencies: ti.i32):
    for b, j in ti.ndrange(out.shape[0], out.shape[1]):
        d = j // n_frequencies
        k = j - d * n_frequencies
        v = _phase(x[b, d], k)
        out[b, j] = ti.abs(v - ti.floor(v) - 0.5) * 4.0 - 1.0


@fast_kernel
@ti.kernel
def triangle_wave_backward(x: f32_2d, dy: f32_2d, dx: f32_2d, n_frequencies: ti.i32):
    for b, d in ti.ndrange(x.shape[0], x.shape[1]):
        acc = 0.0
        for k in range(n_frequencies):
            acc += dy[b, d * n_frequencies + k] * _slope(_phase(x[b, d], k), k)
        dx[b, d] = acc


@fast_kernel
@ti.kernel
def triangle_wave_derivatives(x: f32_2d, fp: f32_2d, fpp: f32_2d, n_frequencies: ti.i32):
    for b, j in ti.ndrange(fp.shape[0], fp.shape[1]):
        d = j // n_frequencies
        k = j - d * n_frequencies
        fp[b, j] = _slope(_phase(x[b, d], k), k)
        fpp[b, j] = 0.0
