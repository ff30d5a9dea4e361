"""tcnn's `Empty` encoding: consumes its input dims and produces no features.

Inside a Composite it drops input dims from the network input. tcnn's output is only its
padding (a network input must be a multiple of 16 wide there); tinn's output is (batch, 0)
and its input gradient is zero, as tcnn's backward writes.
"""
from __future__ import annotations

import torch

from ..config import Section
from .base import ParameterFreeEncoding


class EmptyEncoding(ParameterFreeEncoding):
    otype = "Empty"
    OPTIONS = ()

    def __init__(self, n_input_dims: int, n_networks: int = 1):
        super().__init__(n_input_dims, 0, n_networks)

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        return cls(n_input_dims, n_networks)

    def _fwd(self, x):
        return x.new_empty(x.shape[0], 0)

    def _bwd(self, x, dy):
        return torch.zeros_like(x)

    def _second_order(self, x, dy, ddx, need_ddy, need_dx):
        return (dy.new_zeros(dy.shape) if need_ddy else None), (torch.zeros_like(x) if need_dx else None)
