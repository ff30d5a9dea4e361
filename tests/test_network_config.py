"""Network configs: tcnn's defaults, otype aliases and limits (src/network.cu)."""
import pytest

from tinn.activations import ACTIVATIONS
from tinn.errors import ConfigError
from tinn.networks import MAX_CUTLASS_WIDTH, NetworkArray, parse_network_config


def test_tcnn_defaults_when_keys_are_absent():
    cfg = parse_network_config({})
    assert cfg == {"otype": "CutlassMLP", "n_neurons": 128, "n_hidden_layers": 5,
                   "activation": ACTIVATIONS["ReLU"], "output_activation": ACTIVATIONS["None"]}
    assert parse_network_config({"otype": "FullyFusedMLP"})["n_neurons"] == 128


@pytest.mark.parametrize("otype, canonical", [("MLP", "CutlassMLP"), ("mlp", "CutlassMLP"),
                                              ("MegakernelMLP", "FullyFusedMLP"), ("CutlassMLP", "CutlassMLP")])
def test_otype_aliases(otype, canonical):
    assert parse_network_config({"otype": otype, "n_neurons": 64})["otype"] == canonical


def test_megakernel_alias_keeps_fully_fused_widths():
    with pytest.raises(ConfigError, match=r"network\.n_neurons=48 is not supported; allowed: \[16, 32, 64, 128\]"):
        parse_network_config({"otype": "MegakernelMLP", "n_neurons": 48})


def test_no_cap_on_depth_and_the_width_limit_names_its_reason(tuned):
    """A CutlassMLP of any width parses (as in tcnn); tinn's kernels take up to 256 features, a single network
    on the dense path any width."""
    assert parse_network_config({"n_hidden_layers": 12, "n_neurons": 16})["n_hidden_layers"] == 12
    assert parse_network_config({"otype": "MLP", "n_neurons": 512})["n_neurons"] == 512
    wide = {"otype": "MLP", "n_neurons": MAX_CUTLASS_WIDTH + 1, "n_hidden_layers": 1}
    limit = r"network\.n_neurons=257 exceeds the limit of tinn's kernels, 256: .*registers.*allowed here: 1\.\.256"
    with pytest.raises(ConfigError, match=limit):
        NetworkArray(3, 2, wide, n_networks=2, kernels="unfused")
    with pytest.raises(ConfigError, match=limit):
        NetworkArray(3, 2, wide, kernels="unfused")
    # An array's batched GEMMs (the CPU's default path) have no such limit.
    assert NetworkArray(3, 2, wide, n_networks=2, kernels="batched_gemm").path == "batched_gemm"
    assert NetworkArray(3, 2, wide).dense
    tuned(dense_single_network=False)
    with pytest.raises(ConfigError, match=limit):
        NetworkArray(3, 2, wide)


def test_silu_is_an_activation():
    assert parse_network_config({"activation": "SiLU"})["activation"] == ACTIVATIONS["SiLU"]
