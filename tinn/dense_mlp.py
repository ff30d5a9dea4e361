"""A single network's forward and backward deltas as dense GEMMs (torch, so the CPU's BLAS), for the CPU.

With one network every sample uses the same weights, so each layer is one GEMM over the whole batch. On
the CPU Taichi runs the unfused kernels' dot products in scalar code, while the BLAS behind `torch.mm`
uses the vector units: the image step's MLP takes a quarter of the time (docs/design-notes.md). The
functions here fill the very buffers of the unfused kernels (`tinn/kernels/mlp_array.py`), in their
layouts: activations, pre-activations and deltas feature-major by sorted position, which for one network
is the sample index; so the weight gradients (`NetworkArray._gemm_weight_gradients`) and everything
else read them unchanged. Activations follow `tinn/kernels/activations.py` formula by formula.
"""
from __future__ import annotations

import torch

from .activations import ACTIVATIONS
from .kernels.activations import K_ACT
from .kernels.mlp_array import MLPShape, layer_shapes

NONE, RELU, LEAKY_RELU, EXPONENTIAL, SINE, SIGMOID, SQUAREPLUS, SOFTPLUS, TANH, SILU = (
    ACTIVATIONS[name] for name in ("None", "ReLU", "LeakyReLU", "Exponential", "Sine", "Sigmoid", "Squareplus",
                                   "Softplus", "Tanh", "SiLU"))


def apply_(z: torch.Tensor, code: int) -> torch.Tensor:
    """z := act(z), in place where the formula allows; returns the result."""
    if code == NONE:
        return z
    if code == RELU:
        return z.masked_fill_(z < 0.0, 0.0)  # a NaN stays NaN, as in the kernels
    if code == LEAKY_RELU:
        return z.copy_(torch.where(z > 0.0, z, 0.01 * z))
    if code == EXPONENTIAL:
        return z.exp_()
    if code == SINE:
        return z.sin_()
    if code == SIGMOID:
        return z.neg_().exp_().add_(1.0).reciprocal_()
    if code == SQUAREPLUS:
        s = z.mul_(K_ACT)
        return s.add_(torch.sqrt(s * s + 4.0)).mul_(0.5 / K_ACT)
    if code == SOFTPLUS:
        s = z.mul_(K_ACT)
        tail = torch.log(1.0 + torch.exp(-s.abs()))  # carries a NaN through, as in the kernels
        return s.clamp_(min=0.0).add_(tail).div_(K_ACT)
    if code == TANH:
        return z.tanh_()
    if code == SILU:
        return z.mul_(torch.reciprocal(torch.exp(-z) + 1.0))
    raise ValueError(f"activation code {code}")


def derivative(z: torch.Tensor | None, y: torch.Tensor, code: int) -> torch.Tensor | None:
    """d act / d z from the output y (and the pre-activation z for Sine and SiLU); None for the identity."""
    if code == NONE:
        return None
    if code == RELU:
        return (~(y <= 0.0)).to(y.dtype)  # a NaN output passes the gradient, as torch's threshold_backward
    if code == LEAKY_RELU:
        return torch.where(y > 0.0, 1.0, 0.01).to(y.dtype)
    if code == EXPONENTIAL:
        return y
    if code == SINE:
        return torch.cos(z)
    if code == SIGMOID:
        return y * (1.0 - y)
    if code == SQUAREPLUS:
        s = y * K_ACT
        return s * s / (s * s + 1.0)
    if code == SOFTPLUS:
        return 1.0 - torch.exp(-y * K_ACT)
    if code == TANH:
        return 1.0 - y * y
    if code == SILU:
        s = torch.reciprocal(torch.exp(-z) + 1.0)
        return s + z * s * (1.0 - s)
    raise ValueError(f"activation code {code}")


def _weights(params: torch.Tensor, shape: MLPShape) -> list[torch.Tensor]:
    """Row 0's (fan_out, fan_in) blocks, the last one's computed rows only (tcnn's padded rows come after
    them in its block, so the offsets do not change)."""
    mats, offset = [], 0
    for fan_out, fan_in in layer_shapes(shape.n_in, shape.width, shape.n_out, shape.n_layers):
        mats.append(params[0, offset:offset + fan_out * fan_in].view(fan_out, fan_in))
        offset += fan_out * fan_in
    return mats


def forward(x: torch.Tensor, params: torch.Tensor, shape: MLPShape, *, acts: torch.Tensor, pre: torch.Tensor,
            out: torch.Tensor, keep_all: bool, keep_pre: bool) -> None:
    """What `mlp_array.forward` writes for one network: out (batch, n_out); with keep_all every hidden
    layer's output in acts[l] (features, batch), else the hidden layers take turns in acts' two slots;
    with keep_pre every layer's pre-activation in pre[l]."""
    mats = _weights(params, shape)
    last = shape.n_layers - 1
    h = x.t()  # (n_in, batch), a view
    for l, w in enumerate(mats[:-1]):
        z = acts[l if keep_all else l % acts.shape[0]]  # inference: the kernels' two ping-pong slots
        torch.mm(w, h, out=z)
        if keep_pre:
            pre[l, :w.shape[0]].copy_(z)
        h = apply_(z, shape.hidden_act)
    torch.mm(h.t(), mats[last].t(), out=out)
    if keep_pre:
        pre[last, :shape.n_out].copy_(out.t())
    apply_(out, shape.output_act)


def backward_deltas(dy: torch.Tensor, params: torch.Tensor, shape: MLPShape, *, acts: torch.Tensor,
                    pre: torch.Tensor, out: torch.Tensor, deltas: torch.Tensor, dout: torch.Tensor,
                    dx: torch.Tensor, keep_pre: bool, want_dx: bool) -> None:
    """What `mlp_array.backward_deltas` writes for one network: dout[0] (n_out, batch) and deltas[l]
    (width, batch), dL/dz of the output and of each hidden layer; dx (batch, n_in) when want_dx."""
    mats = _weights(params, shape)
    last = shape.n_layers - 1
    slope = derivative(pre[last, :shape.n_out].t() if keep_pre else None, out, shape.output_act)
    g = dout[0]
    g.copy_((dy if slope is None else dy * slope).t())
    for l in range(last - 1, -1, -1):  # hidden layer l's output feeds layer l + 1
        torch.mm(mats[l + 1].t(), g, out=deltas[l])
        slope = derivative(pre[l, :shape.width] if keep_pre else None, acts[l], shape.hidden_act)
        if slope is not None:
            deltas[l].mul_(slope)
        g = deltas[l]
    if want_dx:
        torch.mm(g.t(), mats[0], out=dx)
