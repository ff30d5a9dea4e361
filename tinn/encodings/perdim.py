"""Autograd plumbing for parameter-free encodings whose features come in one block per input dim.

Output columns [d*K, (d+1)*K) depend on input dim d only (Frequency, TriangleWave, OneBlob).
An encoding supplies three kernel launchers:
    _fwd(x) -> y,   _bwd(x, dy) -> dx,   _derivs(x) -> (dy/dx, d2y/dx2), both shaped like y.
The backward pass is an autograd Function of its own, so `torch.autograd.grad(..., create_graph=True)`
works (eikonal / normal losses); the second-order products are assembled from `_derivs`.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class PerDimEncode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, enc):
        ctx.save_for_backward(x)  # the original: a create_graph backward must stay connected to it
        ctx.enc = enc
        return enc._fwd(x.detach())

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return PerDimBackward.apply(x, dy.contiguous(), ctx.enc), None


class PerDimBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dy, enc):
        ctx.save_for_backward(x, dy)
        ctx.enc = enc
        return enc._bwd(x.detach(), dy.detach())

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, dy = (t.detach() for t in ctx.saved_tensors)
        fp, fpp = ctx.enc._derivs(x)
        b, d = x.shape
        k = fp.shape[1] // d
        g_x = (dy * fpp).view(b, d, k).sum(-1) * g if ctx.needs_input_grad[0] else None
        g_dy = (fp.view(b, d, k) * g[:, :, None]).reshape(b, d * k) if ctx.needs_input_grad[1] else None
        return g_x, g_dy, None
