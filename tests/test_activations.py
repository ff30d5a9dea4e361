"""Activation kernels (the helpers every network kernel uses) against torch in float64, NaN included."""
import math

import numpy as np
import pytest
import taichi as ti
import torch

import tinn
from tinn.activations import ACTIVATIONS, NEEDS_PRE_ACTIVATION
from tinn.kernels import activations as act

from reference import activation as reference


@ti.kernel
def _apply(z: ti.types.ndarray(dtype=ti.f32, ndim=1), y: ti.types.ndarray(dtype=ti.f32, ndim=1),
           d: ti.types.ndarray(dtype=ti.f32, ndim=1), code: ti.template()):
    for i in range(z.shape[0]):
        yi = act.apply(z[i], code)
        y[i] = yi
        d[i] = act.derivative(z[i], yi, code)


def _run(name, z):
    """The kernel on tinn's device; values and derivatives come back to the host, next to the references."""
    z = z.to(tinn.runtime.device())
    y, d = torch.empty_like(z), torch.empty_like(z)
    _apply(z, y, d, ACTIVATIONS[name])
    return y.cpu(), d.cpu()


# Away from 0 (ReLU's kink) and within the range where exp/softplus are well conditioned in float32.
Z = torch.cat([torch.linspace(-4.0, -0.01, 40), torch.linspace(0.01, 4.0, 40), torch.tensor([-30.0, 30.0])])


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_value_and_derivative_match_torch_float64(name, device):
    z = Z if name != "Exponential" else Z.clamp(-20, 20)
    y, d = _run(name, z.clone())
    z64 = z.double().requires_grad_(True)
    y64 = reference(name, z64)
    (d64,) = torch.autograd.grad(y64.sum(), z64)
    np.testing.assert_allclose(y.double().numpy(), y64.detach().numpy(), rtol=3e-6, atol=1e-6)
    np.testing.assert_allclose(d.double().numpy(), d64.numpy(), rtol=3e-5, atol=3e-6)


def test_silu_is_x_times_sigmoid_and_needs_its_pre_activation(device):
    z = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0])
    y, d = _run("SiLU", z)
    for zi, yi, di in zip(z.tolist(), y.tolist(), d.tolist()):
        s = 1.0 / (1.0 + math.exp(-zi))
        assert yi == pytest.approx(zi * s, rel=1e-6, abs=1e-7)
        assert di == pytest.approx(s + zi * s * (1 - s), rel=1e-6)
    assert ACTIVATIONS["SiLU"] in NEEDS_PRE_ACTIVATION and ACTIVATIONS["Sine"] in NEEDS_PRE_ACTIVATION


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_nan_propagates_like_torch(name, device):
    z = torch.tensor([float("nan"), 1.0])
    y, d = _run(name, z)
    assert math.isnan(y[0].item()), f"{name}({float('nan')}) = {y[0].item()}"
    assert not math.isnan(y[1].item())
    # torch's ReLU backward passes the gradient through where the output is NaN (threshold_backward).
    if name == "ReLU":
        assert d[0].item() == 1.0
