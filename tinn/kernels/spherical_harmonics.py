"""Spherical harmonics encoding kernel (tcnn convention), evaluated by recurrence.

Inputs in [0, 1]^3 map to v = 2x - 1 (unnormalised, like tcnn). Basis index j = l^2 + l + m,
m = -l..l: real SH with the Condon-Shortley phase, written as polynomials
    Y_lm = N_lm * Q_l^|m|(z) * Re((x + iy)^m)   (m >= 0)
    Y_lm = N_lm * Q_l^|m|(z) * Im((x + iy)^|m|) (m < 0)
where Q_l^m(z) = (-1)^m d^m P_l(z) / dz^m follows the associated-Legendre recurrence in l.
Off the unit sphere this is the same polynomial tcnn evaluates.

A recurrence (dynamic loops over m and l) instead of tcnn's unrolled degree-8 polynomial
table keeps compile time small and gives first and second derivatives cheaply, so one
kernel serves forward, input gradients and the second-order (double backward) products.
"""
from ..backend import ti
from .launch import fast_kernel

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)

FORWARD, VJP, JVP, HVP = 0, 1, 2, 3


@ti.func
def _emit(mode: ti.template(), out: ti.template(), dy: ti.template(), b, j, n, q, dq, ddq,
          a, ax, ay, axx, axy, ayy, gv, acc):
    """Accumulate one basis function Y = n * q(z) * a(x, y) into the output of `mode`
    (derivatives are with respect to v = 2x - 1; the caller applies the chain factor)."""
    if ti.static(mode == FORWARD):
        out[b, j] = n * q * a
    if ti.static(mode == VJP):
        acc += dy[b, j] * n * ti.Vector([q * ax, q * ay, dq * a])
    if ti.static(mode == JVP):
        out[b, j] = 2.0 * n * (q * ax * gv[0] + q * ay * gv[1] + dq * a * gv[2])
    if ti.static(mode == HVP):
        hess = ti.Matrix([[q * axx, q * axy, dq * ax], [q * axy, q * ayy, dq * ay], [dq * ax, dq * ay, ddq * a]])
        acc += dy[b, j] * n * (hess @ gv)
    return acc


@ti.func
def _sh(mode: ti.template(), x: ti.template(), dy: ti.template(), g: ti.template(), norm: ti.template(),
        out: ti.template(), degree, b):
    """One sample `b`; the kernels own the parallel loop over samples."""
    vx, vy, vz = 2.0 * x[b, 0] - 1.0, 2.0 * x[b, 1] - 1.0, 2.0 * x[b, 2] - 1.0
    gv = ti.Vector([0.0, 0.0, 0.0])
    if ti.static(mode >= JVP):
        gv = ti.Vector([g[b, 0], g[b, 1], g[b, 2]])
    acc = ti.Vector([0.0, 0.0, 0.0])
    # (x + iy)^m and the two previous powers (for first and second derivatives).
    pr, pi, p1r, p1i, p2r, p2i = 1.0, 0.0, 0.0, 0.0, 0.0, 0.0
    qmm = 1.0  # Q_m^m = (-1)^m (2m-1)!!
    for m in range(degree):
        if m > 0:
            p2r, p2i = p1r, p1i
            p1r, p1i = pr, pi
            pr, pi = p1r * vx - p1i * vy, p1r * vy + p1i * vx
            qmm *= -(2.0 * m - 1.0)
        mf = ti.cast(m, ti.f32)
        mm = mf * (mf - 1.0)
        q1, dq1, ddq1 = 0.0, 0.0, 0.0  # Q_{l-1}^m and derivatives
        q2, dq2, ddq2 = 0.0, 0.0, 0.0  # Q_{l-2}^m and derivatives
        for l in range(m, degree):
            q, dq, ddq = qmm, 0.0, 0.0
            if l == m + 1:
                q, dq = (2.0 * mf + 1.0) * vz * qmm, (2.0 * mf + 1.0) * qmm
            elif l > m + 1:
                a_, b_ = 2.0 * l - 1.0, ti.cast(l + m - 1, ti.f32)
                inv = 1.0 / ti.cast(l - m, ti.f32)
                q = (a_ * vz * q1 - b_ * q2) * inv
                dq = (a_ * (q1 + vz * dq1) - b_ * dq2) * inv
                ddq = (a_ * (2.0 * dq1 + vz * ddq1) - b_ * ddq2) * inv
            q2, dq2, ddq2 = q1, dq1, ddq1
            q1, dq1, ddq1 = q, dq, ddq
            n = norm[l * l + l + m]
            # Re part (m >= 0): d/dx (x+iy)^m = m (x+iy)^(m-1), d/dy = i m (x+iy)^(m-1)
            acc = _emit(mode, out, dy, b, l * l + l + m, n, q, dq, ddq,
                        pr, mf * p1r, -mf * p1i, mm * p2r, -mm * p2i, -mm * p2r, gv, acc)
            if m > 0:
                acc = _emit(mode, out, dy, b, l * l + l - m, n, q, dq, ddq,
                            pi, mf * p1i, mf * p1r, mm * p2i, mm * p2r, -mm * p2i, gv, acc)
    if ti.static(mode == VJP):
        for d in ti.static(range(3)):
            out[b, d] = 2.0 * acc[d]
    if ti.static(mode == HVP):
        for d in ti.static(range(3)):
            out[b, d] = 4.0 * acc[d]


@fast_kernel
@ti.kernel
def sh_forward(x: f32_2d, norm: f32_1d, out: f32_2d, degree: ti.i32):
    for b in range(x.shape[0]):
        _sh(FORWARD, x, out, out, norm, out, degree, b)


@fast_kernel
@ti.kernel
def sh_backward(x: f32_2d, dy: f32_2d, norm: f32_1d, dx: f32_2d, degree: ti.i32):
    """dx = J^T dy."""
    for b in range(x.shape[0]):
        _sh(VJP, x, dy, dy, norm, dx, degree, b)


@fast_kernel
@ti.kernel
def sh_jvp(x: f32_2d, g: f32_2d, norm: f32_1d, out: f32_2d, degree: ti.i32):
    """out = J g (gradient of dx = J^T dy with respect to dy)."""
    for b in range(x.shape[0]):
        _sh(JVP, x, out, g, norm, out, degree, b)


@fast_kernel
@ti.kernel
def sh_hvp(x: f32_2d, dy: f32_2d, g: f32_2d, norm: f32_1d, out: f32_2d, degree: ti.i32):
    """out = sum_j dy_j H_j g (gradient of dx = J^T dy with respect to x)."""
    for b in range(x.shape[0]):
        _sh(HVP, x, dy, g, norm, out, degree, b)
