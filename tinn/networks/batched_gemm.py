"""An array of networks as batched GEMMs through torch (the CPU's BLAS): the CPU's path for arrays.

Taichi's CPU code for the per-sample kernels is scalar, while the BLAS behind `torch.bmm` uses the vector
units. Samples are grouped by network into zero-padded (n, M, features) batches and every layer is one `bmm` per
batch; the outputs go back to the caller's order. The backward is torch autograd over the same ops (weight
gradients are bmm's too). Padding rows cost work (their dy is zero, so they add nothing to any gradient), so the
networks are bucketed by sample count: bucket j holds the networks whose count lies in (M / 2^(j+1), M / 2^j],
M the largest, padded to its own largest count, which keeps the padding under twice the real rows however
uneven the counts (one bucket, the whole array in its order, when the counts are equal). Networks without
samples take no rows. An empty batch returns None, and the array runs Taichi's kernels for it.
"""
from __future__ import annotations

import torch

from ..activations import TORCH_ACTIVATIONS
from ..kernels.mlp_array import layer_shapes
from ..routing import sort_by_network


class Batch:
    """Where each sample sits in the padded batches: one flat (rows, .) buffer holding every bucket's (n, M, .)
    block one after the other (`buckets`: the bucket's networks, or None for the whole array in its order, its
    network count, its rows per network and its first row)."""

    def __init__(self, ids: torch.Tensor, n_networks: int):
        order, counts = sort_by_network(ids, n_networks)
        order = order.long()
        counts = counts.long()
        self.buckets: list[tuple[torch.Tensor | None, int, int, int]] = []
        self.rows = 0
        if not ids.shape[0]:
            self.slot = order
            return
        largest = int(counts.max())
        # Bucket j: counts in (largest / 2^(j+1), largest / 2^j], found exactly in integers (for an integer c,
        # c > largest / 2^(j+1) is c > largest >> (j + 1)), not through a floating-point logarithm.
        j = 0
        remaining = counts > 0  # networks without samples take no rows
        net_base = torch.zeros_like(counts)
        while bool(remaining.any()):
            members = remaining & (counts > (largest >> (j + 1)))
            if bool(members.any()):
                nets = torch.nonzero(members).reshape(-1)
                m = int(counts[nets].max())
                whole = nets.numel() == n_networks  # every network, in order: the weights need no gathering
                net_base[nets] = self.rows + torch.arange(nets.numel(), device=ids.device) * m
                self.buckets.append((None if whole else nets, nets.numel(), m, self.rows))
                self.rows += nets.numel() * m
                remaining &= ~members
            j += 1
        starts = torch.cumsum(counts, 0) - counts
        net = ids.long()[order]
        # Each sample's row of the flat buffer, in the caller's order.
        self.slot = torch.empty_like(order)
        self.slot[order] = net_base[net] + (torch.arange(ids.shape[0], device=ids.device) - starts[net])

    def padding(self, batch: int) -> float:
        return self.rows / max(batch, 1)

    def scatter(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(batch, k) rows in the caller's order -> each bucket's (n, M, k) block, zeros in the padding rows."""
        padded = x.new_zeros(self.rows, x.shape[1])
        padded.index_copy_(0, self.slot, x)
        return [padded[first:first + n * m].view(n, m, x.shape[1]) for _, n, m, first in self.buckets]

    def gather(self, ys: list[torch.Tensor]) -> torch.Tensor:
        """Each bucket's (n, M, k) block -> (batch, k) rows in the caller's order."""
        flat = [y.reshape(-1, y.shape[2]) for y in ys]
        return (torch.cat(flat) if len(flat) > 1 else flat[0]).index_select(0, self.slot)

    def run(self, x: torch.Tensor, weights: list[torch.Tensor], shape) -> torch.Tensor:
        """The MLP of every sample, bucket by bucket: one bmm per layer and bucket."""
        outs = []
        for h, (nets, _, _, _) in zip(self.scatter(x), self.buckets):
            outs.append(mlp(h, weights if nets is None else [w.index_select(0, nets) for w in weights], shape))
        return self.gather(outs)


def layer_weights(params: torch.Tensor, shape) -> list[torch.Tensor]:
    """(N, fan_out, fan_in) views of each layer's matrix; the last one's computed rows only (tcnn's padded
    output rows trail them in its block, so no offset changes)."""
    off, out = 0, []
    for fan_out, fan_in in layer_shapes(shape.n_in, shape.width, shape.n_out, shape.n_layers):
        out.append(params[:, off:off + fan_out * fan_in].view(params.shape[0], fan_out, fan_in))
        off += fan_out * fan_in
    return out


def mlp(h: torch.Tensor, weights: list[torch.Tensor], shape) -> torch.Tensor:
    for l, w in enumerate(weights):
        z = torch.bmm(h, w.transpose(1, 2))
        h = TORCH_ACTIVATIONS[shape.output_act if l == len(weights) - 1 else shape.hidden_act](z)
    return h


class BatchedGemmPath:
    """Forward, inference and backward of an array as batched GEMMs (see the module docstring)."""

    def __init__(self, shape, n_networks: int):
        self.shape, self.n_networks = shape, n_networks

    def _batch(self, ids: torch.Tensor) -> Batch | None:
        return Batch(ids, self.n_networks) if ids.shape[0] else None

    def inference(self, x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor) -> torch.Tensor | None:
        batch = self._batch(ids)
        if batch is None:
            return None
        with torch.no_grad():
            return batch.run(x, layer_weights(params, self.shape), self.shape)

    def forward_train(self, x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor):
        """(out, saved), or None for an empty batch."""
        batch = self._batch(ids)
        if batch is None:
            return None
        with torch.enable_grad():
            x_leaf = x.detach().requires_grad_()
            p_leaf = params.detach().requires_grad_()
            y = batch.run(x_leaf, layer_weights(p_leaf, self.shape), self.shape)
        return y.detach(), (y, x_leaf, p_leaf)

    @staticmethod
    def backward(saved, dy: torch.Tensor, want_dx: bool, want_params: bool):
        """(dx or None, float32 dparams (N, P) or None); tcnn's padded output rows get zeros."""
        y, x_leaf, p_leaf = saved
        wanted = [t for t, want in ((x_leaf, want_dx), (p_leaf, want_params)) if want]
        if not wanted:
            return None, None
        # The graph is kept: the contract allows several backward passes through one forward (retain_graph,
        # second order), and it is freed with the context that holds it.
        grads = iter(torch.autograd.grad(y, wanted, grad_outputs=dy, allow_unused=True, retain_graph=True))
        dx = next(grads) if want_dx else None
        dparams = next(grads) if want_params else None
        if want_params and dparams is None:
            dparams = torch.zeros_like(p_leaf)
        return dx, dparams
