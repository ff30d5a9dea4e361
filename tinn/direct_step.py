"""A training step without torch autograd, for tinn's own models.

On a tinn model the Trainer's step is a fixed chain of kernels: encoding forward, network
forward, loss (which yields dLoss/dprediction itself), network backward, encoding backward,
optimizer. Running the chain through torch autograd costs host time every step (Function
objects, saved tensors, the engine's graph walk): about 1 ms on the H100 machine, where the
GPU needs ~2 ms for a 2^18-sample image step. `DirectStep` launches the same kernels with
the same arguments and leaves the same gradients in `.grad`, so the result is bit-identical
to the autograd path (tested); only the bookkeeping is gone, as in tcnn's native trainer.

It applies to plain tinn models: a `NetworkArray` / `Network`, or a `NetworkWithInputEncoding`
(tinn's or the tcnn-style one) whose encoding is parameter-free or a grid. It steps aside,
and the autograd path runs, whenever something could observe the difference: module or
parameter hooks, a non-default CUDA stream, an empty batch, nothing trainable.
TINN_DIRECT_STEP=0 turns it off.
"""
from __future__ import annotations

import os

import torch

from . import checks
from .encodings.grid import GridEncoding, _placeholder
from .networks import NetworkArray

ENABLED = os.environ.get("TINN_DIRECT_STEP", "1") != "0"

_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _accumulate(p: torch.Tensor, grad: torch.Tensor) -> None:
    """What autograd's gradient accumulation does for a leaf: take the buffer, or add into `.grad`."""
    if p.grad is None:
        p.grad = grad
    else:
        p.grad += grad


class DirectStep:
    def __init__(self, model: torch.nn.Module):
        self.model = model

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> "DirectStep | None":
        """The direct step for `model`, or None when its kind needs torch autograd."""
        if not ENABLED or type(model).forward not in _standard_forwards():
            return None  # another model, or a subclass with its own forward
        step = cls(model)
        return step if step._parts() is not None else None

    # ---- when it applies ----------------------------------------------------------------------
    def _parts(self):
        """(network, encoding submodule or None, the tinn encoding or None), read from the model on every
        call (a submodule may have been replaced since), or None when they are not ones it knows."""
        model = self.model
        if isinstance(model, NetworkArray):
            return model, None, None
        network, part = getattr(model, "network", None), getattr(model, "encoding", None)
        if not isinstance(network, NetworkArray) or part is None:
            return None
        impl = getattr(part, "impl", part)  # tcnn-style wrapper or tinn's own encoding
        if impl.params is not None and not isinstance(impl, GridEncoding):
            return None  # e.g. Composite with tables: its own autograd functions
        return network, part, impl

    def applies(self, batch: int) -> bool:
        parts = self._parts()
        if parts is None or batch == 0 or not parts[0].params.requires_grad:
            return False
        from .torch import _foreign_stream
        if _foreign_stream() is not None:
            return False
        module_mod = torch.nn.modules.module
        if any(getattr(module_mod, name, None) for name in _GLOBAL_HOOKS):
            return False
        network, part, impl = parts
        # The model's own modules, listed (walking model.modules() costs more than the rest of this check).
        for m in (self.model, network, part, impl):
            if m is not None and any(getattr(m, name, None) for name in _MODULE_HOOKS):
                return False
        for p in (network.params, None if impl is None else impl.params):
            if p is not None and (p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None)):
                return False
        return True

    # ---- the step -----------------------------------------------------------------------------
    def run(self, x: torch.Tensor, ids: torch.Tensor, loss_of):
        """Forward, `loss_of(prediction)` (a loss result with `.grad`), backward into `.grad`; returns the result."""
        from . import torch as tcnn_api
        net, part, _ = self._parts()
        if isinstance(net, tcnn_api.NetworkArray):  # what its forward checks before a launch
            tcnn_api._check_params("params", net.params, (net.n_networks, net.n_params_per_network()))
        sync = getattr(part, "_sync_impl", None)  # tcnn-style wrapper: re-binds and checks its table
        encoding = sync() if sync is not None else part
        grid = encoding if isinstance(encoding, GridEncoding) else None
        train_grid = grid is not None and grid.params.requires_grad
        # A grid writes its features feature-major; the fused network reads them (and writes their
        # gradient) that way, which saves a transpose each way.
        feature_major = grid is not None and net.fused
        if encoding is None:
            h = x
        elif grid is not None:
            grid_ids = checks.net_ids(ids if grid.n_networks > 1 else None, x.shape[0], grid.n_networks)
            lookup = grid._launch_forward_feature_major if feature_major else grid._launch_forward
            h = lookup(x, grid_ids, grid.params.detach(), 0)
        else:
            with torch.no_grad():
                h = encoding(x, ids if encoding.n_networks > 1 else None)
        params = net.params.detach()
        out, acts, pre, routing = net._forward_train(h, ids, params, feature_major)
        result = loss_of(out)
        dh, dparams = net._backward(result.grad.contiguous(), h, ids, params, acts, pre, out, routing, train_grid,
                                    feature_major)
        _accumulate(net.params, dparams)
        if train_grid:
            dgrid = torch.zeros_like(grid.params)
            grid._launch_backward(x, grid_ids, grid.params.detach(), 0, dh, dgrid, _placeholder(x.device), True,
                                  False, dy_feature_major=feature_major)
            _accumulate(grid.params, dgrid)
        return result


def _standard_forwards() -> tuple:
    """The forwards of tinn's own model classes: a model whose class overrides them is left to autograd."""
    from . import models
    from . import torch as tcnn_api
    return (NetworkArray.forward, tcnn_api.NetworkArray.forward, models.NetworkWithInputEncoding.forward,
            tcnn_api.NetworkWithInputEncoding.forward)
