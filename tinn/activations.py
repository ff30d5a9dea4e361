"""Activation names (tcnn spelling) and their kernel codes."""
from __future__ import annotations

import torch

from .config import Section
from .kernels.activations import K_ACT

# Codes are compile-time constants inside the kernels (see kernels/activations.py).
ACTIVATIONS = {
    "None": 0,
    "ReLU": 1,
    "LeakyReLU": 2,
    "Exponential": 3,
    "Sine": 4,
    "Sigmoid": 5,
    "Squareplus": 6,
    "Softplus": 7,
    "Tanh": 8,
    "SiLU": 9,
}
SINE = ACTIVATIONS["Sine"]
SILU = ACTIVATIONS["SiLU"]
# Activations whose derivative needs the pre-activation, which networks then keep (unfused path).
NEEDS_PRE_ACTIVATION = frozenset({SINE, SILU})


def activation_code(cfg: Section, key: str, default: str) -> int:
    return ACTIVATIONS[cfg.choice(key, list(ACTIVATIONS), default)]


def activation_name(code: int) -> str:
    return next(k for k, v in ACTIVATIONS.items() if v == code)


def _softplus(z):
    return torch.nn.functional.softplus(z * K_ACT) / K_ACT


def _squareplus(z):
    s = z * K_ACT
    return 0.5 * (s + torch.sqrt(s * s + 4.0)) / K_ACT


# Each activation as out-of-place torch ops, differentiable by autograd: the paths that compute through torch
# (second order, the CPU's batched GEMMs) share these; the kernels compute the same formulas.
TORCH_ACTIVATIONS = {
    ACTIVATIONS["None"]: lambda z: z,
    ACTIVATIONS["ReLU"]: torch.relu,
    ACTIVATIONS["LeakyReLU"]: lambda z: torch.where(z > 0, z, 0.01 * z),
    ACTIVATIONS["Exponential"]: torch.exp,
    ACTIVATIONS["Sine"]: torch.sin,
    ACTIVATIONS["Sigmoid"]: torch.sigmoid,
    ACTIVATIONS["Squareplus"]: _squareplus,
    ACTIVATIONS["Softplus"]: _softplus,
    ACTIVATIONS["Tanh"]: torch.tanh,
    ACTIVATIONS["SiLU"]: torch.nn.functional.silu,
}
