"""Activation names (tcnn spelling) and their kernel codes."""
from __future__ import annotations

from .config import Section

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
