"""TriangleWave encoding (tcnn): a cheaper, cosine-free relative of Frequency."""
from __future__ import annotations

import torch

from ..config import Section, count
from ..kernels import triangle_wave
from .base import PerDimEncoding


class TriangleWaveEncoding(PerDimEncoding):
    """n_frequencies triangle waves per input dim; feature d * n_frequencies + k has period 2^(1-k)."""

    otype = "TriangleWave"
    OPTIONS = ("n_frequencies",)

    def __init__(self, n_input_dims: int, n_frequencies: int = 12, n_networks: int = 1):
        n_frequencies = count("n_frequencies", n_frequencies)
        super().__init__(n_input_dims, count("n_input_dims", n_input_dims) * n_frequencies, n_networks)
        self.n_frequencies = n_frequencies

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        return cls(n_input_dims, cfg.integer("n_frequencies", 12, lo=1), n_networks)

    def _fwd(self, x):
        out = torch.empty(x.shape[0], self.n_output_dims, dtype=torch.float32, device=x.device)
        triangle_wave.triangle_wave_forward(x, out, self.n_frequencies)
        return out

    def _bwd(self, x, dy):
        dx = torch.empty_like(x)
        triangle_wave.triangle_wave_backward(x, dy, dx, self.n_frequencies)
        return dx

    def _derivs(self, x):
        fp = torch.empty(x.shape[0], self.n_output_dims, dtype=torch.float32, device=x.device)
        fpp = torch.empty_like(fp)
        triangle_wave.triangle_wave_derivatives(x, fp, fpp, self.n_frequencies)
        return fp, fpp
