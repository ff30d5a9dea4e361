"""tcnn's network config: the otypes, their aliases and keys, with tcnn's defaults."""
from __future__ import annotations

from ..activations import activation_code
from ..config import Section

NETWORK_OTYPES = ["FullyFusedMLP", "CutlassMLP"]
# tcnn's aliases (src/network.cu, select_network): "MLP" (its default otype) is CutlassMLP,
# "MegakernelMLP" is FullyFusedMLP.
NETWORK_ALIASES = {"MLP": "CutlassMLP", "MegakernelMLP": "FullyFusedMLP"}
# tinn's per-sample kernels keep a layer's input vector in registers, unrolled at compile time, so
# compile time and register pressure grow with the width; tcnn's CUTLASS GEMMs have no such bound, and neither
# has a single network on the dense path (vendor GEMMs).
MAX_CUTLASS_WIDTH = 256
# Every key of a network config besides "otype" (`parse_network_config` rejects any other).
NETWORK_OPTIONS = ("n_neurons", "n_hidden_layers", "activation", "output_activation")
FULLY_FUSED_WIDTHS = (16, 32, 64, 128)
MAX_NETWORKS = 1 << 20


def parse_network_config(config, path: str = "network") -> dict:
    """tcnn's network keys with tcnn's defaults (src/network.cu): otype "MLP" (= CutlassMLP),
    n_neurons 128, n_hidden_layers 5, activation ReLU, output_activation None."""
    cfg = config if isinstance(config, Section) else Section(config, path)
    otype = cfg.otype(NETWORK_OTYPES + list(NETWORK_ALIASES), "MLP")
    cfg.expect_keys(("otype", *NETWORK_OPTIONS), repr(otype))
    otype = NETWORK_ALIASES.get(otype, otype)
    if otype == "FullyFusedMLP":
        width = cfg.integer("n_neurons", 128, allowed=FULLY_FUSED_WIDTHS)
    else:
        width = cfg.integer("n_neurons", 128, lo=1)  # above MAX_CUTLASS_WIDTH: NetworkArray says where it runs
    return {
        "otype": otype,
        "n_neurons": width,
        "n_hidden_layers": cfg.integer("n_hidden_layers", 5, lo=0),
        "activation": activation_code(cfg, "activation", "ReLU"),
        "output_activation": activation_code(cfg, "output_activation", "None"),
    }
