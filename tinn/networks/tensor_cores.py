"""The tensor-core path of an MLP array: Triton kernels on CUDA (`tinn/kernels/tensor_cores/`).

Routing is the fused kernels' (one sort, tiles of one network's samples); the kernels read the array's
float32 parameters through a per-call copy in the compute precision (padded to the tensor cores' shapes) and
write float32 outputs, input gradients and weight gradients in tinn's layouts, so the rest of tinn (grids,
losses, optimizers, checkpoints) sees the same tensors as on every other path.
"""
from __future__ import annotations

import torch

from ..routing import route_fused

# The precisions this path computes in, as the kernels name them.
PRECISIONS = ("float16", "bfloat16", "tf32", "float32")


def _kernels():
    from ..kernels import tensor_cores
    return tensor_cores


def unavailable_reason(arch: str, shape) -> str | None:
    """None where the tensor-core kernels can run an array of this shape here, else why not (for messages)."""
    if arch != "cuda":
        return "the tensor-core kernels need the CUDA arch"
    try:
        kernels = _kernels()
    except ImportError as error:  # triton missing or broken: the other paths still run
        return f"Triton is not importable ({error})"
    reason = kernels.unavailable_reason() if hasattr(kernels, "unavailable_reason") else None
    if reason:
        return reason
    if not kernels.supported(shape):
        return f"the tensor-core kernels do not take this shape ({shape})"
    return None


class TensorCorePath:
    """Forward, inference and backward of one array on the tensor-core kernels."""

    def __init__(self, shape, n_networks: int, precision: str):
        self.shape, self.n_networks, self.precision = shape, n_networks, precision
        self.kernels = _kernels()
        self.tile = self.kernels.TILE

    def _tiles(self, ids: torch.Tensor):
        return route_fused(ids, self.n_networks, (self.tile,))[0]

    def inference(self, x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor, x_fm: bool) -> torch.Tensor:
        packed = self.kernels.pack_weights(params, self.shape, self.precision)
        out, _ = self.kernels.forward(x, x_fm, self._tiles(ids), packed, self.shape, precision=self.precision,
                                      save=False)
        return out

    def forward_train(self, x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor, x_fm: bool):
        """(out, saved): what the backward needs stays in `saved`."""
        packed = self.kernels.pack_weights(params, self.shape, self.precision)
        return self.kernels.forward(x, x_fm, self._tiles(ids), packed, self.shape, precision=self.precision,
                                    save=True)

    def backward(self, saved, dy: torch.Tensor, want_dx: bool, want_params: bool, gradient_scale: float):
        """(dx in x's layout or None, float32 dparams (N, P) or None)."""
        return self.kernels.backward(dy, saved, want_dx=want_dx, want_params=want_params,
                                     gradient_scale=gradient_scale)
