"""SphericalHarmonics encoding (tcnn): real SH up to `degree` of 3D directions given in [0, 1]^3."""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .. import runtime
from ..config import Section, count
from ..errors import ConfigError
from ..kernels import spherical_harmonics as K
from .base import Encoding

MAX_DEGREE = 8


def sh_normalisation(degree: int) -> torch.Tensor:
    """N_lm = sqrt((2l+1)/(4 pi) (l-m)!/(l+m)!), times sqrt(2) for m > 0; indexed l^2 + l + m (m >= 0)."""
    norm = torch.zeros(max(degree, 1) ** 2, dtype=torch.float64)
    for l in range(degree):
        for m in range(l + 1):
            n = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - m) / math.factorial(l + m))
            norm[l * l + l + m] = n * (math.sqrt(2.0) if m > 0 else 1.0)
    return norm.float()


class _SHFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, enc):
        out = torch.empty(x.shape[0], enc.n_output_dims, dtype=torch.float32, device=x.device)
        K.sh_forward(x.detach(), enc._norm, out, enc.degree)
        ctx.save_for_backward(x)  # the original: a create_graph backward must stay connected to it
        ctx.enc = enc
        return out

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return _SHBackward.apply(x, dy.contiguous(), ctx.enc), None


class _SHBackward(torch.autograd.Function):
    """dx = J(x)^T dy, differentiable once more (J g for dy, Hessian products for x)."""

    @staticmethod
    def forward(ctx, x, dy, enc):
        dx = torch.empty_like(x)
        K.sh_backward(x.detach(), dy.detach(), enc._norm, dx, enc.degree)
        ctx.save_for_backward(x, dy)
        ctx.enc = enc
        return dx

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, dy = (t.detach() for t in ctx.saved_tensors)
        enc, g = ctx.enc, g.contiguous()
        g_x = g_dy = None
        if ctx.needs_input_grad[0]:
            g_x = torch.empty_like(x)
            K.sh_hvp(x, dy, g, enc._norm, g_x, enc.degree)
        if ctx.needs_input_grad[1]:
            g_dy = torch.empty_like(dy)
            K.sh_jvp(x, g, enc._norm, g_dy, enc.degree)
        return g_x, g_dy, None


class SphericalHarmonicsEncoding(Encoding):
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

    def encode(self, x, net_ids):
        return _SHFn.apply(x, self)
