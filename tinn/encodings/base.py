"""The encoding side of the part contract (see tinn/part.py).

An encoding maps (batch, n_input_dims) float32 inputs to (batch, n_output_dims) float32 features.
Encodings with trainable state keep it in one `params` nn.Parameter whose first dimension is the
network count (one table per network for arrays), so optimizers can scale learning rates per network.
"""
from __future__ import annotations

import torch

from ..part import Context, Part


class Encoding(Part):
    otype = "Encoding"
    # Every key of this encoding's config besides "otype"; `create_encoding` rejects any other.
    OPTIONS: tuple[str, ...] | None = None

    def __init__(self, n_input_dims: int, n_output_dims: int, n_networks: int = 1):
        super().__init__(n_input_dims, n_output_dims, n_networks)
        self.params = None  # an nn.Parameter for encodings with trainable state

    def extra_repr(self) -> str:
        return f"otype={self.otype}, in={self.n_input_dims}, out={self.n_output_dims}, n_networks={self.n_networks}"


class ParameterFreeEncoding(Encoding):
    """An encoding without tables: `_fwd(x) -> y` and `_bwd(x, dy) -> dx` are its kernel launchers;
    `_second_order(x, dy, ddx, need_ddy, need_dx) -> (d_dy, d_x)` its second derivative. The same
    function for every network: ids are ignored."""

    uses_ids = False

    def forward_with_context(self, x, ids, *, train, x_layout="sample_major", y_layout="sample_major"):
        return self._fwd(x), (Context(x=x) if train else None)

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        return (self._bwd(ctx.x, dy) if need_dx else None), ()

    def backward_backward(self, ctx, dy, ddx, *, need_ddy, need_dx, need_dtables):
        d_dy, d_x = self._second_order(ctx.x, dy, ddx, need_ddy, need_dx)
        return d_dy, d_x, ()

    def _fwd(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _bwd(self, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _second_order(self, x, dy, ddx, need_ddy, need_dx):
        raise NotImplementedError


class PerDimEncoding(ParameterFreeEncoding):
    """Output columns [d*K, (d+1)*K) depend on input dim d only (Frequency, TriangleWave, OneBlob).
    `_derivs(x) -> (dy/dx, d2y/dx2)`, both shaped like y, give the second derivative."""

    def _derivs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _second_order(self, x, dy, ddx, need_ddy, need_dx):
        fp, fpp = self._derivs(x)
        b, d = x.shape
        k = fp.shape[1] // d
        d_x = (dy * fpp).view(b, d, k).sum(-1) * ddx if need_dx else None
        d_dy = (fp.view(b, d, k) * ddx[:, :, None]).reshape(b, d * k) if need_ddy else None
        return d_dy, d_x
