"""Second derivatives of an MLP array: the backward of its backward.

An eikonal or normal loss differentiates `dx = J(x)^T dy` once more, with respect to the inputs, the
weights and `dy`. The MLP's forward is restated here with torch ops (each sample's weight matrices
gathered by its network id) and torch autograd differentiates `<ddx, dx>`. Samples are processed in
chunks so the gathered weights stay within a fixed memory budget. The Taichi kernels stay the first-order
path; this is the second-order one, correct for every activation and routing, at torch's speed.
"""
from __future__ import annotations

import torch

from .activations import TORCH_ACTIVATIONS

GATHER_BUDGET_BYTES = 1 << 28  # gathered weights per chunk


def mlp_forward(x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor, shape) -> torch.Tensor:
    """The MLP array's function in torch ops: sample b through network ids[b] (`shape`: kernels.mlp_array.MLPShape)."""
    h = x
    idx = ids.long()
    off = 0
    dims = [shape.n_in] + [shape.width] * (shape.n_layers - 1) + [shape.n_out]
    for l in range(shape.n_layers):
        fan_in, fan_out = dims[l], dims[l + 1]
        w = params[:, off:off + fan_out * fan_in].reshape(params.shape[0], fan_out, fan_in)[idx]
        z = torch.bmm(w, h.unsqueeze(2)).squeeze(2)
        act = shape.output_act if l == shape.n_layers - 1 else shape.hidden_act
        h = TORCH_ACTIVATIONS[act](z)
        off += fan_out * fan_in
    return h


def mlp_backward_backward(x, ids, params, shape, dy, ddx, *, need_ddy: bool, need_dx: bool, need_dparams: bool):
    """Derivatives of `<ddx, dx>` with `dx = J(x; params)^T dy`, w.r.t. dy, x and params (sample-major
    tensors; None where not needed)."""
    batch = x.shape[0]
    chunk = max(1, GATHER_BUDGET_BYTES // max(1, params.shape[1] * params.element_size()))
    d_dy = torch.zeros_like(dy) if need_ddy else None
    d_x = torch.zeros_like(x) if need_dx else None
    d_p = torch.zeros_like(params) if need_dparams else None
    p = params.detach().requires_grad_(need_dparams)
    for lo in range(0, batch, chunk):
        hi = min(batch, lo + chunk)
        with torch.enable_grad():
            xc = x[lo:hi].detach().requires_grad_(True)
            dyc = dy[lo:hi].detach().requires_grad_(need_ddy)
            y = mlp_forward(xc, ids[lo:hi], p, shape)
            (dxc,) = torch.autograd.grad(y, xc, grad_outputs=dyc, create_graph=True)
            wanted = [t for t, want in ((dyc, need_ddy), (xc, need_dx), (p, need_dparams)) if want]
            grads = iter(torch.autograd.grad(dxc, wanted, grad_outputs=ddx[lo:hi], allow_unused=True))
        for out, want, part in ((d_dy, need_ddy, slice(lo, hi)), (d_x, need_dx, slice(lo, hi)),
                                (d_p, need_dparams, slice(None))):
            if want:
                g = next(grads)
                if g is not None:
                    out[part] += g
    return d_dy, d_x, d_p
