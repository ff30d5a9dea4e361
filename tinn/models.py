"""`NetworkWithInputEncoding`: an encoding followed by an MLP, single or as an array.

Mirrors tcnn's constructor `(n_input_dims, n_output_dims, encoding_config,
network_config)`; `n_networks > 1` makes both parts arrays routed by `net_ids`.
Parameter-free encodings (Frequency, ...) are shared by all networks; encodings
with tables (grids) get one table per network unless `share_encoding=True`.
"""
from __future__ import annotations

import torch

from . import checks
from .encodings import create_encoding
from .networks import NetworkArray


def encode_then_evaluate(model, x: torch.Tensor, net_ids: torch.Tensor | None) -> torch.Tensor:
    """Shared forward of encoding+network models: validate once, route ids to the parts that need them."""
    x = checks.float_input("input", x, model.n_input_dims)
    ids = checks.net_ids(net_ids, x.shape[0], model.n_networks)
    with checks.disabled():  # validated once above
        enc_ids = ids if model.encoding.n_networks > 1 else None
        return model.network(model.encoding(x, enc_ids), ids)


class NetworkWithInputEncoding(torch.nn.Module):
    def __init__(self, n_input_dims: int, n_output_dims: int, encoding_config: dict | None,
                 network_config: dict | None, n_networks: int = 1, seed: int = 1337, share_encoding: bool = False):
        super().__init__()
        self.n_input_dims, self.n_output_dims, self.n_networks = n_input_dims, n_output_dims, n_networks
        self.encoding = create_encoding(n_input_dims, encoding_config, n_networks=1 if share_encoding else n_networks,
                                        seed=seed)
        self.network = NetworkArray(self.encoding.n_output_dims, n_output_dims, network_config,
                                    n_networks=n_networks, seed=seed + 1)

    def forward(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        return encode_then_evaluate(self, x, net_ids)

    def inference(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(x, net_ids)

    def memory_bytes(self) -> int:
        return self.encoding.memory_bytes() + self.network.memory_bytes()
