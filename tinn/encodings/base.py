"""The encoding contract every encoding (single or array) follows.

An encoding maps (batch, n_input_dims) float32 inputs to (batch, n_output_dims)
float32 features. Encodings with trainable state keep it in one `params`
nn.Parameter whose first dimension is the network count (one table per network
for arrays), so optimizers can scale learning rates per network. Gradients flow
through torch autograd to `params` and to the inputs.
"""
from __future__ import annotations

import torch

from .. import checks, runtime
from ..config import count


class Encoding(torch.nn.Module):
    otype = "Encoding"
    # Every key of this encoding's config besides "otype"; `create_encoding` rejects any other.
    OPTIONS: tuple[str, ...] | None = None

    def __init__(self, n_input_dims: int, n_output_dims: int, n_networks: int = 1):
        super().__init__()
        runtime.ensure_init()
        self.n_input_dims = count("n_input_dims", n_input_dims)
        self.n_output_dims = count("n_output_dims", n_output_dims)
        self.n_networks = count("n_networks", n_networks)
        self.params = None  # an nn.Parameter for encodings with trainable state

    def forward(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        x_checked = checks.float_input("encoding input", x, self.n_input_dims)
        ids = checks.net_ids(net_ids, x_checked.shape[0], self.n_networks) if self.params is not None else net_ids
        return self.encode(x_checked, ids)

    def encode(self, x: torch.Tensor, net_ids: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def n_params_per_network(self) -> int:
        return 0 if self.params is None else self.params[0].numel()

    def memory_bytes(self) -> int:
        return 0 if self.params is None else self.params.numel() * self.params.element_size()

    def extra_repr(self) -> str:
        return f"otype={self.otype}, in={self.n_input_dims}, out={self.n_output_dims}, n_networks={self.n_networks}"
