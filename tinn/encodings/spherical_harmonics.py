"""SphericalHarmonics encoding (tcnn): real SH up to `degree` of 3D directions given in [0, 1]^3."""
from __future__ import annotations

import math

import torch

from .. import runtime
from ..config import Section, count
from ..errors import ConfigError
from ..kernels import spherical_harmonics
from .base import ParameterFreeEncoding

MAX_DEGREE = 8


def sh_normalisation(degree: int) -> torch.Tensor:
    """N_lm = sqrt((2l+1)/(4 pi) (l-m)!/(l+m)!), times sqrt(2) for m > 0; indexed l^2 + l + m (m >= 0)."""
    norm = torch.zeros(max(degree, 1) ** 2, dtype=torch.float64)
    for l in range(degree):
        for m in range(l + 1):
            n = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - m) / math.factorial(l + m))
            norm[l * l + l + m] = n * (math.sqrt(2.0) if m > 0 else 1.0)
    return norm.float()


class SphericalHarmonicsEncoding(ParameterFreeEncoding):
    """degree^2 features. Inputs are directions v mapped to (v + 1) / 2; like tcnn, nothing is normalised."""

    otype = "SphericalHarmonics"
    OPTIONS = ("degree",)

    def __init__(self, n_input_dims: int = 3, degree: int = 4, n_networks: int = 1):
        if count("n_input_dims", n_input_dims) != 3:
            raise ConfigError(f"SphericalHarmonics encodes 3D directions; got n_input_dims={n_input_dims}")
        degree = count("degree", degree, hi=MAX_DEGREE)
        super().__init__(3, degree * degree, n_networks)
        self.degree = int(degree)
        self.register_buffer("_norm", sh_normalisation(degree).to(runtime.device()), persistent=False)

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        if n_input_dims != 3:
            raise ConfigError(f"{cfg.path} (SphericalHarmonics) encodes 3D directions; got {n_input_dims} input dims "
                              "(use Composite with n_dims_to_encode=3 to encode part of the input)")
        return cls(3, cfg.integer("degree", 4, lo=1, hi=MAX_DEGREE), n_networks)

    def _fwd(self, x):
        out = torch.empty(x.shape[0], self.n_output_dims, dtype=torch.float32, device=x.device)
        spherical_harmonics.sh_forward(x, self._norm, out, self.degree)
        return out

    def _bwd(self, x, dy):
        dx = torch.empty_like(x)
        spherical_harmonics.sh_backward(x, dy, self._norm, dx, self.degree)
        return dx

    def _second_order(self, x, dy, ddx, need_ddy, need_dx):
        """Hessian products for x, J ddx for dy."""
        d_x = d_dy = None
        if need_dx:
            d_x = torch.empty_like(x)
            spherical_harmonics.sh_hvp(x, dy, ddx, self._norm, d_x, self.degree)
        if need_ddy:
            d_dy = torch.empty_like(dy)
            spherical_harmonics.sh_jvp(x, ddx, self._norm, d_dy, self.degree)
        return d_dy, d_x
