"""A single network as dense GEMMs (tinn/dense_mlp.py): against float64 torch and Taichi's unfused kernels,
every activation, and when it is chosen."""
import pytest
import torch

import tinn
from tinn.activations import ACTIVATIONS
from tinn.networks import NetworkArray

from reference import forward_backward, mlp_array_float64, rel_err

CPU = tinn.runtime.arch() == "cpu"
PAIRS = [("ReLU", "None"), ("LeakyReLU", "Sigmoid"), ("Sine", "SiLU"), ("Softplus", "Squareplus"),
         ("Tanh", "Exponential"), ("SiLU", "ReLU"), ("Squareplus", "Softplus"), ("Sigmoid", "Tanh"),
         ("Exponential", "LeakyReLU"), ("None", "Sine")]


def test_every_activation_is_covered():
    assert {name for pair in PAIRS for name in pair} == set(ACTIVATIONS)


@pytest.mark.parametrize("depth", [0, 1, 3])
@pytest.mark.parametrize("hidden,output", PAIRS)
def test_dense_matches_float64_and_the_unfused_kernels(hidden, output, depth, tuned):
    """Padded inputs and outputs (tcnn's layout) included; the output's and the input's gradients too."""
    tuned(dense_single_network=True)
    gen = torch.Generator().manual_seed(depth)
    dev = tinn.runtime.device()
    x = (torch.rand(2000, 7, generator=gen) * 2 - 1).to(dev)
    dy = torch.randn(2000, 5, generator=gen).to(dev)
    cfg = {"n_neurons": 32, "n_hidden_layers": depth, "activation": hidden, "output_activation": output}
    dense = NetworkArray(7, 5, cfg, seed=3, input_padding=(2, 1.0), output_padding=3)
    unfused = NetworkArray(7, 5, cfg, seed=3, input_padding=(2, 1.0), output_padding=3, kernels="unfused")
    assert dense.dense and not unfused.dense and not unfused.fused
    y, dx, dp = forward_backward(dense, x, dy)
    y2, dx2, dp2 = forward_backward(unfused, x, dy)
    for a, b in ((y, y2), (dx, dx2), (dp, dp2)):
        assert rel_err(a, b) < 1e-5
    y64, dx64, dp64 = mlp_array_float64(dense, x, torch.zeros(2000, dtype=torch.int32, device=dev), dy, hidden,
                                        output)
    assert rel_err(y, y64) < 1e-5 and rel_err(dx, dx64) < 1e-5 and rel_err(dp, dp64) < 1e-5
    assert torch.all(dp[:, -3 * 32 if depth else -3 * 9:] == 0)  # tcnn's padded output rows: no gradient


@pytest.mark.parametrize("depth", [2, 3])
def test_inference_and_nan_rules_match_the_kernels(depth, tuned):
    """Inference (hidden layers taking turns in two buffers) equals the training forward; a NaN input gives
    NaN outputs, and ReLU passes the gradient where its output is NaN, as the kernels (and torch's
    threshold_backward) do."""
    tuned(dense_single_network=True)
    dev = tinn.runtime.device()
    cfg = {"n_neurons": 16, "n_hidden_layers": depth, "activation": "ReLU", "output_activation": "None"}
    net = NetworkArray(3, 2, cfg, seed=5)
    ref = NetworkArray(3, 2, cfg, seed=5, kernels="unfused")
    x = torch.rand(64, 3, generator=torch.Generator().manual_seed(2)).to(dev)
    x[5, 1] = float("nan")
    with tinn.checks.disabled():  # (the input checks refuse a NaN; one can still arise inside a network)
        with torch.no_grad():
            inferred = net(x, None)
        y, dx, dp = forward_backward(net, x, torch.ones(64, 2, device=dev))
        y2, dx2, dp2 = forward_backward(ref, x, torch.ones(64, 2, device=dev))
    assert torch.equal(torch.isnan(y), torch.isnan(y2)) and bool(torch.isnan(y[5]).all())
    assert torch.equal(torch.isnan(dx), torch.isnan(dx2)) and torch.equal(torch.isnan(dp), torch.isnan(dp2))
    finite = ~torch.isnan(y).any(dim=1)
    assert torch.allclose(inferred[finite], y[finite], rtol=1e-6, atol=1e-7)
    assert torch.allclose(y[finite], y2[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("setting,activation,width,n_networks,kernels,deterministic,expected", [
    (None, "ReLU", 64, 1, "auto", False, CPU),    # the default: on the CPU; on CUDA where the fused kernels
    (None, "Sine", 16, 1, "auto", False, True),   # do not take the network (Sine needs pre-activations),
    (None, "ReLU", 128, 1, "auto", False, True),  # and above 64 features
    (None, "ReLU", 256, 1, "auto", False, True),
    (True, "ReLU", 16, 1, "auto", False, True),   # also in place of the fused kernels
    (False, "Sine", 16, 1, "auto", False, False),
    (None, "ReLU", 128, 4, "auto", False, False),  # an array: Taichi's kernels route samples to networks
    (True, "Sine", 16, 4, "auto", False, False),
    (True, "Sine", 16, 1, "unfused", False, False),  # asked for Taichi's kernels
    (True, "Sine", 16, 1, "auto", True, False),   # deterministic mode: the kernels' fixed summation order
])
def test_when_the_dense_path_is_chosen(setting, activation, width, n_networks, kernels, deterministic, expected,
                                       tuned):
    tuned(dense_single_network=setting, deterministic=deterministic)
    net = NetworkArray(4, 2, {"n_neurons": width, "n_hidden_layers": 1, "activation": activation},
                       n_networks=n_networks, kernels=kernels)
    assert net.dense == expected
    assert not (net.dense and net.fused)


def test_fused_kernels_asked_for_keep_them(tuned):
    """kernels="fused" is a request for Taichi's kernels: the dense setting does not override it."""
    tuned(dense_single_network=True)
    if CPU:
        with pytest.raises(tinn.ConfigError, match="kernels='fused'"):
            NetworkArray(4, 2, {"n_neurons": 16, "n_hidden_layers": 1}, kernels="fused")
    else:
        net = NetworkArray(4, 2, {"n_neurons": 16, "n_hidden_layers": 1}, kernels="fused")
        assert net.fused and not net.dense


@pytest.mark.parametrize("hidden,output", [("ReLU", "None"), ("Sine", "SiLU"), ("Tanh", "Sigmoid")])
def test_feature_major_inputs_match_sample_major(hidden, output, tuned):
    """The dense path takes a grid's feature-major features as they are, (n_in, batch), and returns the input's
    gradient the same way; values equal the sample-major call's."""
    from tinn.part import FEATURE_MAJOR
    tuned(dense_single_network=True)
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(4)
    x = (torch.rand(300, 6, generator=gen) * 2 - 1).to(dev)
    dy = torch.randn(300, 3, generator=gen).to(dev)
    net = NetworkArray(6, 3, {"n_neurons": 16, "n_hidden_layers": 2, "activation": hidden,
                              "output_activation": output}, seed=2, input_padding=(2, 1.0))
    assert net.dense and FEATURE_MAJOR in net.input_layouts
    ids = torch.zeros(300, dtype=torch.int32, device=dev)
    y, ctx = net.forward_with_context(x, ids, train=True)
    y_fm, ctx_fm = net.forward_with_context(x.t().contiguous(), ids, train=True, x_layout=FEATURE_MAJOR)
    dx, (dp,) = net.backward(ctx, dy, need_dx=True)
    dx_fm, (dp_fm,) = net.backward(ctx_fm, dy, need_dx=True)
    assert dx_fm.shape == (6, 300)
    assert rel_err(y_fm, y) < 1e-6 and rel_err(dx_fm.t(), dx) < 1e-6 and rel_err(dp_fm, dp) < 1e-6
    with torch.no_grad():
        inferred = net.forward_with_context(x.t().contiguous(), ids, train=False, x_layout=FEATURE_MAJOR)[0]
    assert rel_err(inferred, y) < 1e-6


def test_a_single_network_wider_than_the_kernels_limit_runs_dense():
    """tcnn's CutlassMLP takes any width; tinn's kernels stop at 256 features, the dense path does not."""
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(6)
    net = NetworkArray(4, 3, {"otype": "CutlassMLP", "n_neurons": 300, "n_hidden_layers": 2, "activation": "SiLU",
                              "output_activation": "Sigmoid"}, seed=6)
    assert net.dense and net.width == 300
    x = (torch.rand(500, 4, generator=gen) * 2 - 1).to(dev)
    dy = torch.randn(500, 3, generator=gen).to(dev)
    y, dx, dp = forward_backward(net, x, dy)
    y64, dx64, dp64 = mlp_array_float64(net, x, torch.zeros(500, dtype=torch.int32, device=dev), dy, "SiLU",
                                        "Sigmoid")
    assert rel_err(y, y64) < 1e-5 and rel_err(dx, dx64) < 1e-5 and rel_err(dp, dp64) < 1e-5
