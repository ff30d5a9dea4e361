"""MLP arrays: N networks of one shape, each sample routed to its own by id (tcnn's network configs).

`NetworkArray` is the part (tinn/part.py's contract); how its matrix products run is one of several paths,
chosen once per array by `selection.choose_path`. Modules: `config` (tcnn's network keys), `array` (the
part), `selection` (the rule), `gemm` (long-K weight-gradient GEMMs), `tensor_cores` (Triton kernels on CUDA).
"""
from .array import Network, NetworkArray
from .config import (FULLY_FUSED_WIDTHS, MAX_CUTLASS_WIDTH, MAX_NETWORKS, NETWORK_ALIASES, NETWORK_OPTIONS,
                     NETWORK_OTYPES, parse_network_config)
from .gemm import MIN_K_SLICE, GemmOperand, mm_long_k

__all__ = ["FULLY_FUSED_WIDTHS", "MAX_CUTLASS_WIDTH", "MAX_NETWORKS", "MIN_K_SLICE", "NETWORK_ALIASES",
           "NETWORK_OPTIONS", "NETWORK_OTYPES", "Network", "NetworkArray", "GemmOperand", "mm_long_k",
           "parse_network_config"]
