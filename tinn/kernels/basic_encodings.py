"""Identity and Frequency encodings (parameter-free, elementwise)."""
import math

from ..backend import ti
from .launch import fast_kernel

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)

PI = math.pi


@ti.func
def pow2(k):
    """2^k as an exact f32 (tcnn's scalbnf(1, k)) for any integer k; `1 << k` would overflow int32 at
    k = 31. Built from the exponent bits: exact for -126 <= k <= 127, inf above, 0 below."""
    e = ti.min(ti.max(k + 127, 0), 255)
    return ti.bit_cast(ti.cast(e, ti.i32) << 23, ti.f32)


@fast_kernel
@ti.kernel
def identity_forward(x: f32_2d, out: f32_2d, scale: ti.f32, offset: ti.f32):
    for b, d in ti.ndrange(x.shape[0], x.shape[1]):
        out[b, d] = x[b, d] * scale + offset


@ti.func
def frequency_feature(x: ti.template(), b, j, n_frequencies):
    """Feature j of sample b's Frequency encoding. tcnn layout: feature j encodes input dim j // (2F), frequency
    2^((j//2) % F), sin for even j, cos for odd. Also what the fused network computes when it encodes its inputs."""
    d = j // (2 * n_frequencies)
    k = (j // 2) % n_frequencies
    phase = ti.cast(j % 2, ti.f32) * (PI / 2)
    return ti.sin(x[b, d] * pow2(k) * PI + phase)


@fast_kernel
@ti.kernel
def frequency_forward(x: f32_2d, out: f32_2d, n_frequencies: ti.i32):
    for b, j in ti.ndrange(out.shape[0], out.shape[1]):
        out[b, j] = frequency_feature(x, b, j, n_frequencies)


@fast_kernel
@ti.kernel
def frequency_backward(x: f32_2d, dy: f32_2d, dx: f32_2d, n_frequencies: ti.i32):
    for b, d in ti.ndrange(x.shape[0], x.shape[1]):
        acc = 0.0
        for jj in range(2 * n_frequencies):
            j = d * 2 * n_frequencies + jj
            k = jj // 2
            freq = pow2(k) * PI
            phase = ti.cast(jj % 2, ti.f32) * (PI / 2)
            acc += dy[b, j] * freq * ti.cos(x[b, d] * freq + phase)
        dx[b, d] = acc


@fast_kernel
@ti.kernel
def frequency_derivatives(x: f32_2d, fp: f32_2d, fpp: f32_2d, n_frequencies: ti.i32):
    # First and second derivative of every feature with respect to its input dim (double backward).
    for b, j in ti.ndrange(fp.shape[0], fp.shape[1]):
        d = j // (2 * n_frequencies)
        k = (j // 2) % n_frequencies
        phase = ti.cast(j % 2, ti.f32) * (PI / 2)
        freq = pow2(k) * PI
        arg = x[b, d] * freq + phase
        fp[b, j] = freq * ti.cos(arg)
        fpp[b, j] = -freq * freq * ti.sin(arg)
