"""The MLP path selection rule (tinn/networks/selection.py): which path and precision each case gets, and the
errors for combinations that cannot run, independent of the machine the suite runs on."""
import pytest

import tinn
from tinn.errors import ConfigError
from tinn.networks import NetworkArray
from tinn.networks.selection import Candidate, Choice, choose_path


def candidate(**kw):
    base = dict(arch="cuda", n_networks=64, width=64, fusable=True, tensor_cores=None, deterministic=False,
                dense_setting=None, vendor_faster=False)
    base.update(kw)
    return Candidate(**base)


@pytest.mark.parametrize("kw,kernels,precision,expected", [
    # arrays on CUDA: float16 on the tensor cores by default, the tensor cores in every reduced precision, the
    # fused kernels in float32
    ({}, "auto", "auto", Choice("tensor_cores", "float16")),
    ({}, "auto", "float16", Choice("tensor_cores", "float16")),
    ({}, "auto", "bfloat16", Choice("tensor_cores", "bfloat16")),
    ({}, "auto", "tf32", Choice("tensor_cores", "tf32")),
    ({}, "auto", "float32", Choice("fused", "float32")),
    ({"fusable": False}, "auto", "float32", Choice("unfused", "float32")),
    # no Triton, or a shape its kernels do not take: float32 on the fused kernels; so too a hidden layer
    # narrower than the tensor cores' blocks
    ({"tensor_cores": "no triton"}, "auto", "auto", Choice("fused", "float32")),
    ({"tensor_cores": "hidden widths up to 128"}, "auto", "auto", Choice("fused", "float32")),
    ({"width": 8}, "auto", "auto", Choice("fused", "float32")),
    ({"width": 16}, "auto", "auto", Choice("tensor_cores", "float16")),
    ({"width": 128, "fusable": False}, "auto", "auto", Choice("tensor_cores", "float16")),
    ({"fusable": False, "tensor_cores": "hidden widths up to 128"}, "auto", "auto", Choice("unfused", "float32")),
    # a single network keeps float32 unless asked; dense where measured faster and in half precision, where
    # replayed step graphs take the tensor cores (if their kernels take the shape)
    ({"n_networks": 1}, "auto", "auto", Choice("fused", "float32")),
    ({"n_networks": 1, "vendor_faster": True}, "auto", "auto", Choice("dense", "float32")),
    ({"n_networks": 1}, "auto", "float16", Choice("dense", "float16")),
    ({"n_networks": 1, "step_graphs": True}, "auto", "float16", Choice("tensor_cores", "float16")),
    ({"n_networks": 1, "step_graphs": True}, "auto", "bfloat16", Choice("tensor_cores", "bfloat16")),
    ({"n_networks": 1, "step_graphs": True, "tensor_cores": "hidden widths up to 128"}, "auto", "float16",
     Choice("dense", "float16")),
    ({"n_networks": 1, "step_graphs": True, "vendor_faster": True}, "auto", "float16", Choice("dense", "float16")),
    ({"n_networks": 1, "step_graphs": True, "dense_setting": True}, "auto", "float16", Choice("dense", "float16")),
    ({"n_networks": 1}, "auto", "tf32", Choice("tensor_cores", "tf32")),
    ({"n_networks": 1, "dense_setting": False}, "auto", "float16", Choice("tensor_cores", "float16")),
    # one network decoding an array's ids (share_network): float16 on the tensor cores as the array's own would
    ({"n_networks": 1, "served_ids": 37}, "auto", "auto", Choice("tensor_cores", "float16")),
    ({"n_networks": 1, "served_ids": 37}, "auto", "bfloat16", Choice("tensor_cores", "bfloat16")),
    ({"n_networks": 1, "served_ids": 37}, "auto", "float32", Choice("fused", "float32")),
    ({"n_networks": 1, "served_ids": 37, "dense_setting": True}, "auto", "auto", Choice("dense", "float16")),
    ({"n_networks": 1, "served_ids": 37, "tensor_cores": "hidden widths up to 128"}, "auto", "auto",
     Choice("fused", "float32")),
    ({"n_networks": 1, "served_ids": 37, "deterministic": True}, "auto", "auto", Choice("unfused", "float32")),
    ({"arch": "cpu", "fusable": False, "tensor_cores": "cpu", "n_networks": 1, "served_ids": 37,
      "vendor_faster": True}, "auto", "auto", Choice("dense", "float32")),
    # the CPU: dense for one network, batched GEMMs for arrays, float32
    ({"arch": "cpu", "fusable": False, "tensor_cores": "cpu", "n_networks": 1, "vendor_faster": True}, "auto",
     "auto", Choice("dense", "float32")),
    ({"arch": "cpu", "fusable": False, "tensor_cores": "cpu"}, "auto", "auto", Choice("batched_gemm", "float32")),
    ({"arch": "cpu", "fusable": False, "tensor_cores": "cpu"}, "batched_gemm", "auto", Choice("batched_gemm", "float32")),
    # forced paths
    ({}, "tensor_cores", "auto", Choice("tensor_cores", "float16")),
    ({}, "fused", "auto", Choice("fused", "float32")),
    ({}, "unfused", "auto", Choice("unfused", "float32")),
    # deterministic: the unfused kernels' fixed-order sums
    ({"deterministic": True}, "auto", "auto", Choice("unfused", "float32")),
])
def test_choices(kw, kernels, precision, expected):
    assert choose_path(candidate(**kw), kernels, precision) == expected


@pytest.mark.parametrize("kw,kernels,precision,words", [
    ({"tensor_cores": "Triton is not importable"}, "tensor_cores", "auto", ["Triton is not importable", "allowed"]),
    ({"fusable": False}, "fused", "auto", ["kernels='fused'", "allowed"]),
    ({}, "fused", "float16", ["computes in float32", "'float32' or 'auto'"]),
    ({"deterministic": True}, "tensor_cores", "auto", ["no fixed order", "'unfused' or 'auto'"]),
    ({"deterministic": True}, "auto", "float16", ["no fixed order", "'float32' or 'auto'"]),
    ({"arch": "cpu", "tensor_cores": "cpu"}, "auto", "bfloat16", ["needs the tensor-core", "'float32' or 'auto'"]),
    ({}, "fast", "auto", ["kernels='fast'", "tensor_cores"]),
    ({}, "auto", "half", ["precision='half'", "bfloat16"]),
])
def test_refusals_name_the_argument_and_the_allowed_values(kw, kernels, precision, words):
    with pytest.raises(ConfigError) as info:
        choose_path(candidate(**kw), kernels, precision)
    for word in words:
        assert word in str(info.value)


def test_a_settings_precision_applies_where_it_can():
    """The process-wide setting falls back to float32 where the path cannot take it; the argument is refused."""
    cpu_array = candidate(arch="cpu", fusable=False, tensor_cores="cpu")
    assert choose_path(cpu_array, "auto", "float16", precision_from_settings=True) == Choice("batched_gemm", "float32")
    with pytest.raises(ConfigError):
        choose_path(cpu_array, "auto", "float16")


def test_array_reports_its_path_and_refuses_an_impossible_precision():
    net = NetworkArray(3, 2, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=4)
    assert net.path in ("tensor_cores", "fused", "batched_gemm") and net.precision in ("float32", "float16")
    if tinn.runtime.arch() == "cpu":
        assert (net.path, net.precision) == ("batched_gemm", "float32")
        with pytest.raises(ConfigError, match="precision='float16'"):
            NetworkArray(3, 2, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=4,
                         precision="float16")


@pytest.mark.parametrize("kw,expected", [
    ({}, "float16"),                                                  # a CUDA array the tensor cores take
    ({"width": 16}, "float16"), ({"width": 128}, "float16"),
    ({"width": 15}, "float32"),                                       # narrower than their blocks
    ({"tensor_cores": "hidden widths up to 128"}, "float32"),         # a shape their kernels do not take
    ({"tensor_cores": "triton is not importable"}, "float32"),
    ({"n_networks": 1}, "float32"),                                   # one network: the dense or fused path
    ({"n_networks": 1, "served_ids": 9}, "float16"),                  # ... unless it decodes an array's ids
    ({"deterministic": True}, "float32"),
    ({"arch": "cpu", "tensor_cores": None, "fusable": False}, "float32"),   # the CPU, even where Triton interprets
])
def test_the_default_precision_is_a_function_of_the_candidate(kw, expected):
    """`precision="auto"`: float16 exactly for CUDA arrays on the tensor cores, decided without a GPU."""
    from tinn.networks.selection import default_precision

    assert default_precision(candidate(**kw)) == expected
    path = "tensor_cores" if expected == "float16" else None
    choice = choose_path(candidate(**kw), "auto", "auto")
    assert choice.precision == expected and (path is None or choice.path == path)


def test_a_shared_decoder_chooses_as_the_array_it_serves():
    """NetworkWithInputEncoding(share_network=True) builds one network that serves every id: the rule sees the
    model's count (at least two, as a rank's shard of one id), so on CUDA it computes as the model's arrays would;
    a count below the networks' is refused."""
    from tinn.models import NetworkWithInputEncoding

    enc = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6,
           "base_resolution": 2, "per_level_scale": 2.0}
    net = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}
    shared = NetworkWithInputEncoding(3, 2, enc, net, n_networks=5, share_network=True)
    own = NetworkWithInputEncoding(3, 2, enc, net, n_networks=5)
    assert (shared.network.n_networks, shared.network.served_ids) == (1, 5)
    assert (own.network.n_networks, own.network.served_ids) == (5, 5)
    assert NetworkArray(3, 2, net, n_networks=4).served_ids == 4
    assert shared.network.precision == own.network.precision
    # A sharded model's rank may hold one id: its replica of the decoder still computes as the others' do.
    alone = NetworkWithInputEncoding(3, 2, enc, net, n_networks=1, share_network=True)
    assert alone.network.served_ids > 1 and alone.network.precision == shared.network.precision
    with pytest.raises(ConfigError, match="served_ids"):
        NetworkArray(3, 2, net, n_networks=4, served_ids=2)


def test_the_default_precision_follows_the_settings_and_the_array_argument(tuned):
    """On a simulated CUDA array: an explicit float32 (argument or settings) keeps the fused kernels, the default
    takes float16; the CPU suite's own arrays stay float32 by default."""
    cuda_array = candidate()
    assert choose_path(cuda_array, "auto", "float32") == Choice("fused", "float32")
    assert choose_path(cuda_array, "auto", "float32", precision_from_settings=True) == Choice("fused", "float32")
    assert choose_path(cuda_array, "auto", "auto", precision_from_settings=True) == Choice("tensor_cores", "float16")
    assert choose_path(cuda_array, "fused", "auto") == Choice("fused", "float32")
    if tinn.runtime.arch() == "cpu":
        net = NetworkArray(3, 2, {"n_neurons": 32, "n_hidden_layers": 1}, n_networks=4)
        assert (net.path, net.precision, net.gradient_scaler) == ("batched_gemm", "float32", None)
