"""A single network's forward and backward deltas as dense GEMMs (torch: the CPU's BLAS, cuBLAS on CUDA).

With one network every sample uses the same weights, so each layer is one GEMM over the whole batch. On
the CPU Taichi runs the unfused kernels' dot products in scalar code, while the BLAS behind `torch.mm`
uses the vector units: the image step's MLP takes a quarter of the time. On CUDA cuBLAS beats Taichi's
kernels above 64 features and wherever the fused kernels do not apply (docs/design-notes.md). The
functions here fill the very buffers of the unfused kernels (`tinn/kernels/mlp_array.py`), in their
layouts: activations, pre-activations and deltas feature-major by sorted position, which for one network
is the sample index; so the weight gradients (`NetworkArray._gemm_weight_gradients`) and everything
else read them unchanged. Activations compute `tinn/kernels/activations.py`'s functions, with torch's own
op where torch has one (one pass each). In `settings.precision` float16 or bfloat16 the GEMMs, the
activations and those buffers are in that type (tensor cores; float32 accumulation), the output and the
input's gradient float32.
"""
from __future__ import annotations

import torch

from .activations import ACTIVATIONS
from .kernels.activations import K_ACT
from .kernels.mlp_array import MLPShape, layer_shapes

NONE, RELU, LEAKY_RELU, EXPONENTIAL, SINE, SIGMOID, SQUAREPLUS, SOFTPLUS, TANH, SILU = (
    ACTIVATIONS[name] for name in ("None", "ReLU", "LeakyReLU", "Exponential", "Sine", "Sigmoid", "Squareplus",
                                   "Softplus", "Tanh", "SiLU"))


def faster_than_kernels(arch: str, fusable: bool, width: int) -> bool:
    """Whether a single network runs faster here than in Taichi's kernels (measurements in docs/design-notes.md):
    on the CPU always; on CUDA where the fused kernels do not take the network (the unfused kernels are slower
    there), and above 64 features, where cuBLAS's GEMMs beat the fused kernels (at 64 and below the GPU times
    tie and the fused kernels issue fewer launches)."""
    return arch == "cpu" or not fusable or width > 64


def apply_(z: torch.Tensor, code: int) -> torch.Tensor:
    """z := act(z), in place where the formula allows; returns the result."""
    if code == NONE:
        return z
    if code == RELU:
        return z.clamp_(min=0.0)  # a NaN stays NaN, as in the kernels
    if code == LEAKY_RELU:
        return z.copy_(torch.where(z > 0.0, z, 0.01 * z))
    if code == EXPONENTIAL:
        return z.exp_()
    if code == SINE:
        return z.sin_()
    if code == SIGMOID:
        return z.sigmoid_()
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
        return torch.nn.functional.silu(z, inplace=True)
    raise ValueError(f"activation code {code}")


def activate(z: torch.Tensor, code: int, out: torch.Tensor) -> torch.Tensor:
    """out := act(z), z kept (the pre-activation Sine's and SiLU's derivatives read); one pass where torch has
    the function with an `out`."""
    if code == SINE:
        return torch.sin(z, out=out)
    if code == SILU:
        return torch.ops.aten.silu.out(z, out=out)
    if code == RELU:
        return torch.clamp(z, min=0.0, out=out)
    return apply_(out.copy_(z), code)


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


def backprop_(g: torch.Tensor, z: torch.Tensor | None, y: torch.Tensor, code: int) -> torch.Tensor:
    """g := g * act'(z), in place, from the output y (and the pre-activation z for Sine and SiLU): one pass with
    torch's backward functions where they exist, the derivative's formula otherwise."""
    if code == NONE:
        return g
    if code == RELU:  # a NaN output passes the gradient, as in the kernels
        return torch.ops.aten.threshold_backward.grad_input(g, y, 0.0, grad_input=g)
    if code == SIGMOID:
        return torch.ops.aten.sigmoid_backward.grad_input(g, y, grad_input=g)
    if code == TANH:
        return torch.ops.aten.tanh_backward.grad_input(g, y, grad_input=g)
    if code == SILU:
        return torch.ops.aten.silu_backward.grad_input(g, z, grad_input=g)
    return g.mul_(derivative(z, y, code))


# torch dtypes of `settings.precision`, and the factor the output gradients are scaled by before they
# are rounded to that dtype: tcnn's default loss scale for half precision (float16 has 5 exponent bits, so
# gradients that are small, as a mean over a large batch makes them, would round to zero); bfloat16 has
# float32's exponent range and needs none.
COMPUTE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
GRADIENT_SCALES = {"float32": 1.0, "float16": 128.0, "bfloat16": 1.0}


def _weights(params: torch.Tensor, shape: MLPShape) -> list[torch.Tensor]:
    """Row 0's (fan_out, fan_in) blocks, the last one's computed rows only (tcnn's padded rows come after
    them in its block, so the offsets do not change)."""
    mats, offset = [], 0
    for fan_out, fan_in in layer_shapes(shape.n_in, shape.width, shape.n_out, shape.n_layers):
        mats.append(params[0, offset:offset + fan_out * fan_in].view(fan_out, fan_in))
        offset += fan_out * fan_in
    return mats


def _is_one(scale) -> bool:
    """Whether a gradient scale (a float, or a device tensor that a dynamic scaler updates) is the fixed 1:
    a tensor never counts as one, so reading it costs no host sync."""
    return not isinstance(scale, torch.Tensor) and scale == 1.0


def _mm_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, unscale: float | torch.Tensor = 1.0) -> None:
    """out := (a @ b) / unscale; a float32 `out` of lower-precision operands gets the product converted first,
    so that small values are not lost in the narrow type."""
    if a.dtype == out.dtype and _is_one(unscale):
        torch.mm(a, b, out=out)
        return
    out.copy_(torch.mm(a, b))
    if not _is_one(unscale):
        out.div_(unscale)


def forward(x: torch.Tensor, params: torch.Tensor, shape: MLPShape, *, acts: torch.Tensor, pre: torch.Tensor,
            out: torch.Tensor, keep_all: bool, keep_pre: bool, x_feature_major: bool = False) -> None:
    """What `mlp_array.forward` writes for one network: out (batch, n_out); with keep_all every hidden
    layer's output in acts[l] (features, batch), else the hidden layers take turns in acts' two slots;
    with keep_pre every layer's pre-activation in pre[l]. x is (batch, n_in), or (n_in, batch) with x_feature_major.
    The GEMMs and activations compute in the dtype of x and params (`compute_operands`), which acts and pre
    share; out is float32 (the losses and other parts read it)."""
    mats = _weights(params, shape)
    last = shape.n_layers - 1
    h = x if x_feature_major else x.t()  # (n_in, batch); the transpose is a view
    for l, w in enumerate(mats[:-1]):
        y = acts[l if keep_all else l % acts.shape[0]]  # inference: the kernels' two ping-pong slots
        if keep_pre:
            z = torch.mm(w, h, out=pre[l, :w.shape[0]])
            h = activate(z, shape.hidden_act, out=y)
        else:
            h = apply_(torch.mm(w, h, out=y), shape.hidden_act)
    _mm_into(h.t(), mats[last].t(), out)
    if keep_pre:
        pre[last, :shape.n_out].copy_(out.t())
    apply_(out, shape.output_act)


def compute_operands(x: torch.Tensor, params: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x and params as the GEMMs read them: converted to `dtype` (one pass each; the parameters stay float32
    for the optimizer, like tcnn's full-precision master copy)."""
    if dtype == x.dtype == params.dtype:
        return x, params
    return x.to(dtype), params.to(dtype)


def backward_deltas(dy: torch.Tensor, params: torch.Tensor, shape: MLPShape, *, acts: torch.Tensor,
                    pre: torch.Tensor, out: torch.Tensor, deltas: torch.Tensor, dout: torch.Tensor,
                    dx: torch.Tensor, keep_pre: bool, want_dx: bool, x_feature_major: bool = False,
                    gradient_scale: float | torch.Tensor = 1.0) -> None:
    """What `mlp_array.backward_deltas` writes for one network: dout[0] (n_out, batch) and deltas[l]
    (width, batch), dL/dz of the output and of each hidden layer, times `gradient_scale` (a float, or the
    0-d device tensor of a dynamic scaler, read where the GEMMs run), in the dtype of
    params, acts, deltas and dout; dx (batch, n_in) when want_dx, (n_in, batch) with x_feature_major, unscaled,
    float32."""
    mats = _weights(params, shape)
    last = shape.n_layers - 1
    slope = derivative(pre[last, :shape.n_out].t() if keep_pre else None, out, shape.output_act)
    g = dout[0]
    grad = dy if slope is None else dy * slope
    if _is_one(gradient_scale):
        g.copy_(grad.t())
    else:
        torch.mul(grad.t(), gradient_scale, out=g)
    for l in range(last - 1, -1, -1):  # hidden layer l's output feeds layer l + 1
        torch.mm(mats[l + 1].t(), g, out=deltas[l])
        g = backprop_(deltas[l], pre[l, :shape.width] if keep_pre else None, acts[l], shape.hidden_act)
    if want_dx and x_feature_major:
        _mm_into(mats[0].t(), g, dx, gradient_scale)
    elif want_dx:
        _mm_into(g.t(), mats[0], dx, gradient_scale)
