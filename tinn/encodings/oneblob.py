"""OneBlob encoding (tcnn, Mueller et al. 2019) with tcnn's quartic kernel and wraparound."""
from __future__ import annotations

import torch

from ..config import Section, count
from ..errors import ConfigError
from ..kernels import oneblob
from .base import PerDimEncoding


class OneBlobEncoding(PerDimEncoding):
    """n_bins features per input dim (inputs expected in [0, 1]); n_bins must be a power of two, as in tcnn."""

    otype = "OneBlob"
    OPTIONS = ("n_bins",)

    def __init__(self, n_input_dims: int, n_bins: int = 16, n_networks: int = 1):
        n_bins = count("n_bins", n_bins)
        if n_bins & (n_bins - 1):
            raise ConfigError(f"n_bins={n_bins} must be a power of two (1, 2, 4, ...)")
        super().__init__(n_input_dims, count("n_input_dims", n_input_dims) * n_bins, n_networks)
        self.n_bins = n_bins

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        n_bins = cfg.integer("n_bins", 16, lo=1)
        if n_bins & (n_bins - 1):
            raise ConfigError(f"{cfg.key('n_bins')}={n_bins} must be a power of two (as in tcnn); "
                              f"allowed: 1, 2, 4, 8, ...")
        return cls(n_input_dims, n_bins, n_networks)

    def _fwd(self, x):
        out = torch.empty(x.shape[0], self.n_output_dims, dtype=torch.float32, device=x.device)
        oneblob.oneblob_forward(x, out, self.n_bins)
        return out

    def _bwd(self, x, dy):
        dx = torch.empty_like(x)
        oneblob.oneblob_backward(x, dy, dx, self.n_bins)
        return dx

    def _derivs(self, x):
        fp = torch.empty(x.shape[0], self.n_output_dims, dtype=torch.float32, device=x.device)
        fpp = torch.empty_like(fp)
        oneblob.oneblob_derivatives(x, fp, fpp, self.n_bins)
        return fp, fpp
