"""Activation functions and their derivatives, tcnn formulas.

`code` is a compile-time constant (ti.template), so each kernel instance carries
only the branch it uses. Derivatives are computed from the activation output `y`
like tcnn does, except Sine and SiLU, whose derivatives need the pre-activation `z`
(tinn keeps it for them, as tcnn's CutlassMLP does).

NaN propagates as in torch: every function maps NaN to NaN (a plain max(z, 0) may
return 0 for NaN: min/max lower to IEEE minNum/maxNum, which drop a NaN operand).
"""
from ..backend import ti

K_ACT = 10.0  # tcnn sharpens Squareplus and Softplus by this factor


@ti.func
def _logistic(z):
    return 1.0 / (1.0 + ti.exp(-z))


@ti.func
def apply(z, code: ti.template()):
    y = z
    if ti.static(code == 1):
        y = ti.select(z < 0.0, 0.0, z)  # not ti.max: keeps NaN
    elif ti.static(code == 2):
        y = z if z > 0.0 else 0.01 * z
    elif ti.static(code == 3):
        y = ti.exp(z)
    elif ti.static(code == 4):
        y = ti.sin(z)
    elif ti.static(code == 5):
        y = _logistic(z)
    elif ti.static(code == 6):
        s = z * K_ACT
        y = 0.5 * (s + ti.sqrt(s * s + 4.0)) / K_ACT
    elif ti.static(code == 7):
        s = z * K_ACT
        # log(1 + e^s) computed without overflow for large s; the log term carries a NaN through
        y = (ti.max(s, 0.0) + ti.log(1.0 + ti.exp(-ti.abs(s)))) / K_ACT
    elif ti.static(code == 8):
        y = ti.tanh(z)
    elif ti.static(code == 9):
        y = z * _logistic(z)
    return y


@ti.func
def derivative(z, y, code: ti.template()):
    """d act / d z, from output y (and pre-activation z for Sine and SiLU)."""
    d = 1.0
    if ti.static(code == 1):
        d = ti.select(y <= 0.0, 0.0, 1.0)  # torch's threshold_backward: a NaN output passes the gradient
    elif ti.static(code == 2):
        d = 1.0 if y > 0.0 else 0.01
    elif ti.static(code == 3):
        d = y
    elif ti.static(code == 4):
        d = ti.cos(z)
    elif ti.static(code == 5):
        d = y * (1.0 - y)
    elif ti.static(code == 6):
        s = y * K_ACT
        d = s * s / (s * s + 1.0)
    elif ti.static(code == 7):
        d = 1.0 - ti.exp(-y * K_ACT)
    elif ti.static(code == 8):
        d = 1.0 - y * y
    elif ti.static(code == 9):
        s = _logistic(z)
        d = s + z * s * (1.0 - s)
    return d
