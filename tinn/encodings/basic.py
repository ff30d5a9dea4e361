"""Parameter-free encodings: Identity and Frequency (tcnn semantics)."""
from __future__ import annotations

import torch

from ..config import Section, count
from ..kernels import basic_encodings
from .base import ParameterFreeEncoding, PerDimEncoding


class IdentityEncoding(ParameterFreeEncoding):
    otype = "Identity"
    OPTIONS = ("scale", "offset")

    def __init__(self, n_input_dims: int, scale: float = 1.0, offset: float = 0.0, n_networks: int = 1):
        super().__init__(n_input_dims, n_input_dims, n_networks)
        self.scale, self.offset = float(scale), float(offset)

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        return cls(n_input_dims, cfg.number("scale", 1.0), cfg.number("offset", 0.0), n_networks)

    def _fwd(self, x):
        out = torch.empty_like(x)
        basic_encodings.identity_forward(x, out, self.scale, self.offset)
        return out

    def _bwd(self, x, dy):
        return dy * self.scale

    def _second_order(self, x, dy, ddx, need_ddy, need_dx):  # linear: no curvature
        return (ddx * self.scale if need_ddy else None), (torch.zeros_like(x) if need_dx else None)


class FrequencyEncoding(PerDimEncoding):
    """sin/cos of 2^k * pi * x for k < n_frequencies, per input dimension (tcnn order)."""

    otype = "Frequency"
    OPTIONS = ("n_frequencies",)

    def __init__(self, n_input_dims: int, n_frequencies: int = 12, n_networks: int = 1):
        n_frequencies = count("n_frequencies", n_frequencies)
        super().__init__(n_input_dims, count("n_input_dims", n_input_dims) * 2 * n_frequencies, n_networks)
        self.n_frequencies = n_frequencies

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        return cls(n_input_dims, cfg.integer("n_frequencies", 12, lo=1), n_networks)

    # Kernel launchers (x, dy contiguous and detached).
    def _fwd(self, x):
        out = torch.empty(x.shape[0], self.n_output_dims, dtype=torch.float32, device=x.device)
        basic_encodings.frequency_forward(x, out, self.n_frequencies)
        return out

    def _bwd(self, x, dy):
        dx = torch.empty_like(x)
        basic_encodings.frequency_backward(x, dy, dx, self.n_frequencies)
        return dx

    def _derivs(self, x):
        fp = torch.empty(x.shape[0], self.n_output_dims, dtype=torch.float32, device=x.device)
        fpp = torch.empty_like(fp)
        basic_encodings.frequency_derivatives(x, fp, fpp, self.n_frequencies)
        return fp, fpp
