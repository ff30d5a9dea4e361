"""Parameter-free encodings: Identity and Frequency (tcnn semantics)."""
from __future__ import annotations

import torch

from .. import runtime
from ..config import Section
from ..kernels import basic_encodings as K
from .base import Encoding


class _IdentityFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, offset):
        out = torch.empty_like(x)
        K.identity_forward(x.detach(), out, scale, offset)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dy):
        dx = torch.empty_like(dy)
        K.identity_backward(dy.contiguous(), dx, ctx.scale)
        return dx, None, None


class IdentityEncoding(Encoding):
    otype = "Identity"

    def __init__(self, n_input_dims: int, scale: float = 1.0, offset: float = 0.0, n_networks: int = 1):
        super().__init__(n_input_dims, n_input_dims, n_networks)
        self.scale, self.offset = float(scale), float(offset)

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        return cls(n_input_dims, cfg.number("scale", 1.0), cfg.number("offset", 0.0), n_networks)

    def encode(self, x, net_ids):
        return _IdentityFn.apply(x, self.scale, self.offset)


class _FrequencyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n_frequencies):
        out = torch.empty(x.shape[0], x.shape[1] * 2 * n_frequencies, dtype=torch.float32, device=x.device)
        K.frequency_forward(x.detach(), out, n_frequencies)
        ctx.save_for_backward(x.detach())
        ctx.n_frequencies = n_frequencies
        return out

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = torch.empty_like(x)
        K.frequency_backward(x, dy.contiguous(), dx, ctx.n_frequencies)
        return dx, None


class FrequencyEncoding(Encoding):
    """sin/cos of 2^k * pi * x for k < n_frequencies, per input dimension (tcnn order)."""

    otype = "Frequency"

    def __init__(self, n_input_dims: int, n_frequencies: int = 12, n_networks: int = 1):
        super().__init__(n_input_dims, n_input_dims * 2 * n_frequencies, n_networks)
        self.n_frequencies = int(n_frequencies)

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        return cls(n_input_dims, cfg.integer("n_frequencies", 12, lo=1, hi=24), n_networks)

    def encode(self, x, net_ids):
        runtime.require_init()
        return _FrequencyFn.apply(x, self.n_frequencies)
