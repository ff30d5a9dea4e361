"""Initial MLP weights per activation, as tcnn draws them (FullyFusedMLP / CutlassMLP
`initialize_params`, GPUMatrix's `initialize_*` in gpu_matrix.h).

Every matrix is uniform in [-s, s], drawn in layer order:
- hidden activation Sine (SIREN): first matrix s = 30 / fan_in, later ones s = sqrt(6 / fan_in);
- any other activation (Xavier/Glorot uniform): s = sqrt(6 / (fan_in + fan_out)).
tcnn ignores the output activation here. Its fan_in / fan_out are the dimensions of the matrices it
stores, i.e. the input padded to a multiple of 16 (by NetworkWithInputEncoding) and the output rows
padded to a multiple of 16: pass those shapes to get tcnn's bounds exactly.
"""
from __future__ import annotations

import math

import torch

from .activations import ACTIVATIONS

SINE = ACTIVATIONS["Sine"]
SIREN_FIRST_LAYER_FREQUENCY = 30.0  # the omega_0 of Sitzmann et al. 2020, as tcnn uses it


def _code(activation) -> int:
    return ACTIVATIONS[activation] if isinstance(activation, str) else int(activation)


def weight_bounds(layer_shapes, activation) -> list[float]:
    """The half-width s of each matrix's uniform distribution; shapes are (fan_out, fan_in)."""
    sine = _code(activation) == SINE
    bounds = []
    for l, (fan_out, fan_in) in enumerate(layer_shapes):
        if sine:
            bounds.append(SIREN_FIRST_LAYER_FREQUENCY / fan_in if l == 0 else math.sqrt(6.0 / fan_in))
        else:
            bounds.append(math.sqrt(6.0 / (fan_in + fan_out)))
    return bounds


def initial_weights(layer_shapes, activation, output_activation, generator: torch.Generator,
                    n_networks: int = 1) -> torch.Tensor:
    """(n_networks, sum of fan_out * fan_in) float32 on the CPU: each row holds one network's matrices
    back to back, row-major (fan_out, fan_in), like tinn's `params`. `activation` / `output_activation`
    are names or codes; the output activation does not change the draw (as in tcnn)."""
    _code(output_activation)  # validated like the hidden one, though tcnn's init does not use it
    shapes = [(int(o), int(i)) for o, i in layer_shapes]
    host = torch.empty(int(n_networks), sum(o * i for o, i in shapes))
    off = 0
    for (o, i), bound in zip(shapes, weight_bounds(shapes, activation)):
        host[:, off:off + o * i].uniform_(-bound, bound, generator=generator)
        off += o * i
    return host


__all__ = ["initial_weights", "weight_bounds"]
