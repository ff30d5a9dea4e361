"""Gradients of MLP arrays through torch autograd against float64, on every kernel path the selection rule
can pick on the arch the suite runs on (CPU or CUDA): accumulation over several backward passes, frozen
parameters, input-only and parameter-only gradients, widths that are not multiples of 16, no hidden layer,
tcnn's padded layouts, second order and tcnn's CPU-input convenience."""
import warnings

import pytest
import torch

import tinn
import tinn.encodings
import tinn.torch as tcnn
from reference import mlp_array, rel_err
from tinn.networks import NetworkArray, tensor_cores

ON_CUDA = tinn.runtime.arch() == "cuda"
# The paths a caller can ask for on this arch ("fused" exists on CUDA only; the tensor-core kernels on CUDA, and
# on the CPU in Triton's interpreter). Every path computes in exact float32 here (`precision="float32"`), so each
# is held to float64 at float32's accuracy; tests/test_network_precision.py covers the reduced precisions.
TENSOR_CORES = tensor_cores.unavailable_reason(tinn.runtime.arch(), None) is None
KERNELS = (["auto", "unfused", "batched_gemm"] + (["fused"] if ON_CUDA else [])
           + (["tensor_cores"] if TENSOR_CORES else []))


def dev():
    return tinn.runtime.device()


def ragged_ids(batch: int, n_networks: int, seed: int = 0) -> torch.Tensor:
    """Unsorted ids with uneven counts per network (one network gets most samples, the last one few)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.linspace(4.0, 0.5, n_networks) ** 2
    return torch.multinomial(weights, batch, replacement=True, generator=g).to(torch.int32).to(dev())


def reference(net, x, ids, hidden, output):
    """float64 y(x, params) and the autograd leaves it was computed from."""
    p64 = net.params.detach().cpu().double().requires_grad_()
    x64 = x.detach().cpu().double().requires_grad_()
    return mlp_array(net, p64, x64, ids.cpu(), hidden, output), x64, p64


def make(kernels, n_in, n_out, config, n_networks, seed=7, tcnn_layout=False):
    if tcnn_layout:
        if kernels != "auto":
            pytest.skip("tcnn's facade picks its kernels itself")
        return tcnn.NetworkArray(n_in, n_out, config, n_networks=n_networks, seed=seed)
    if kernels == "fused" and (config.get("activation") in ("Sine", "SiLU") or max(n_in, n_out) > 128):
        pytest.skip("not a fused-kernel network")
    precision = "float32" if kernels in ("auto", "tensor_cores") else None
    return NetworkArray(n_in, n_out, config, n_networks=n_networks, seed=seed, kernels=kernels, precision=precision)


@pytest.fixture(autouse=True)
def exact_float32(tuned):
    """tcnn's facade takes the process's precision: exact float32 for these comparisons."""
    tuned(precision="float32")


CASES = {
    # name: (n_in, n_out, network config, n_networks, batch)
    "fused16_relu": (7, 1, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU"},
                     3, 200),
    "width1_tanh": (4, 2, {"otype": "CutlassMLP", "n_neurons": 1, "n_hidden_layers": 2, "activation": "Tanh"}, 3, 150),
    "width7_sigmoid": (5, 3, {"otype": "CutlassMLP", "n_neurons": 7, "n_hidden_layers": 4, "activation": "Sigmoid"},
                       4, 170),
    "width48_nohidden": (6, 2, {"otype": "CutlassMLP", "n_neurons": 48, "n_hidden_layers": 0, "activation": "ReLU",
                                "output_activation": "Tanh"}, 37, 300),
    "width24_softplus": (3, 5, {"otype": "CutlassMLP", "n_neurons": 24, "n_hidden_layers": 2,
                                "activation": "Softplus"}, 5, 190),
    "width32_sine": (3, 2, {"otype": "CutlassMLP", "n_neurons": 32, "n_hidden_layers": 1, "activation": "Sine"},
                     2, 120),
    "one_input_sigmoid": (1, 1, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 3,
                                 "activation": "Sigmoid"}, 37, 400),
    "single_width64": (3, 4, {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2, "activation": "ReLU"},
                       1, 333),
}


def _inputs(case, seed=1):
    n_in, n_out, config, n_networks, batch = CASES[case]
    torch.manual_seed(seed)
    x = (torch.rand(batch, n_in, device=dev()) * 2 - 1)
    ids = ragged_ids(batch, n_networks, seed)
    dy = torch.randn(batch, n_out, device=dev())
    return x, ids, dy


def _act(config):
    return config.get("activation", "ReLU"), config.get("output_activation", "None")


@pytest.mark.parametrize("tcnn_layout", [False, True])
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", list(CASES))
def test_first_order_gradients_match_float64(case, kernels, tcnn_layout):
    n_in, n_out, config, n_networks, _ = CASES[case]
    net = make(kernels, n_in, n_out, config, n_networks, tcnn_layout=tcnn_layout)
    x, ids, dy = _inputs(case)
    xr = x.clone().requires_grad_()
    y = net(xr, ids)
    y.backward(dy)
    y64, x64, p64 = reference(net, x, ids, *_act(config))
    y64.backward(dy.cpu().double())
    assert rel_err(y.detach().cpu(), y64) < 1e-5
    assert rel_err(net.inference(x, ids).cpu(), y64) < 1e-5
    assert rel_err(xr.grad.cpu(), x64.grad) < 1e-4
    assert rel_err(net.params.grad.cpu(), p64.grad) < 1e-4


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", ["fused16_relu", "width7_sigmoid", "single_width64"])
def test_gradients_accumulate_over_backward_passes(case, kernels):
    """Two losses through one network (or gradient accumulation): .grad is the sum of every backward's gradient,
    whether autograd took the first gradient over as its buffer or not."""
    n_in, n_out, config, n_networks, _ = CASES[case]
    net = make(kernels, n_in, n_out, config, n_networks)
    x, ids, dy = _inputs(case)
    x2, _, dy2 = _inputs(case, seed=2)
    xr = x.clone().requires_grad_()
    net(xr, ids).backward(dy)
    net(xr, ids).backward(dy2)
    net(x2, ids).backward(dy)
    y64, x64, p64 = reference(net, x, ids, *_act(config))
    (y64 * (dy + dy2).cpu().double()).sum().backward()
    y64b, _, p64b = reference(net, x2, ids, *_act(config))
    (y64b * dy.cpu().double()).sum().backward()
    assert rel_err(xr.grad.cpu(), x64.grad) < 1e-4
    assert rel_err(net.params.grad.cpu(), p64.grad + p64b.grad) < 1e-4


def test_gradient_accumulates_through_tcnn_facade_sum():
    """The reported case: `net(x, ids).sum().backward()` twice doubles params.grad."""
    net = tcnn.NetworkArray(7, 1, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1,
                                   "activation": "ReLU"}, n_networks=3, seed=7)
    x = torch.rand(200, 7, device=dev())
    ids = ragged_ids(200, 3)
    net(x, ids).sum().backward()
    first = net.params.grad.clone()
    net(x, ids).sum().backward()
    assert rel_err(net.params.grad, 2 * first) < 1e-6
    y64, _, p64 = reference(net, x, ids, "ReLU", "None")
    y64.sum().backward()
    assert rel_err(first.cpu(), p64.grad) < 1e-5


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", ["fused16_relu", "width1_tanh", "one_input_sigmoid", "width24_softplus"])
@pytest.mark.parametrize("want", ["input_only", "params_only"])
def test_partial_gradients_match_float64(case, kernels, want):
    """Frozen parameters (input gradient only) and inputs without requires_grad (parameter gradient only)."""
    n_in, n_out, config, n_networks, _ = CASES[case]
    net = make(kernels, n_in, n_out, config, n_networks)
    x, ids, dy = _inputs(case)
    xr = x.clone().requires_grad_(want == "input_only")
    net.params.requires_grad_(want == "params_only")
    net(xr, ids).backward(dy)
    y64, x64, p64 = reference(net, x, ids, *_act(config))
    y64.backward(dy.cpu().double())
    if want == "input_only":
        assert net.params.grad is None
        assert rel_err(xr.grad.cpu(), x64.grad) < 1e-4
    else:
        assert xr.grad is None
        assert rel_err(net.params.grad.cpu(), p64.grad) < 1e-4


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("hidden", ["Softplus", "Tanh"])
def test_second_order_through_array_matches_float64(kernels, hidden):
    """create_graph=True through an array: an eikonal-style loss on dy/dx, differentiated to x and params."""
    net = make(kernels, 3, 1, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2,
                               "activation": hidden}, 3, seed=5)
    torch.manual_seed(3)
    x = torch.rand(90, 3, device=dev(), requires_grad=True)
    ids = ragged_ids(90, 3, seed=3)
    (g,) = torch.autograd.grad(net(x, ids).sum(), x, create_graph=True)
    loss = (g.norm(dim=1) - 1).square().mean()
    gx, gp = torch.autograd.grad(loss, [x, net.params])
    y64, x64, p64 = reference(net, x, ids, hidden, "None")
    (g64,) = torch.autograd.grad(y64.sum(), x64, create_graph=True)
    gx64, gp64 = torch.autograd.grad((g64.norm(dim=1) - 1).square().mean(), [x64, p64])
    assert rel_err(g.detach().cpu(), g64) < 1e-5
    assert rel_err(gx.cpu(), gx64) < 1e-4
    assert rel_err(gp.cpu(), gp64) < 1e-4


@pytest.mark.skipif(not ON_CUDA, reason="a CPU input to a CUDA module needs the CUDA arch")
@pytest.mark.parametrize("kind", ["network", "composite", "model", "array", "compact"])
def test_cpu_input_to_cuda_facade_backpropagates_to_the_cpu_tensor(kind):
    """tcnn moves a CPU input to the GPU (with a warning); its gradient comes back to the CPU tensor."""
    if kind == "network":
        net = tcnn.Network(3, 2, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1})
    elif kind == "composite":
        net = tcnn.Encoding(3, {"otype": "Composite", "nested": [
            {"otype": "Frequency", "n_dims_to_encode": 2, "n_frequencies": 2},
            {"otype": "Identity"}]})
    elif kind == "compact":
        net = tinn.encodings.GridEncoding(3, n_levels=2, log2_hashmap_size=8, table_dtype="bfloat16")
        net.casts_inputs = True
    elif kind == "array":
        net = tcnn.NetworkArray(3, 2, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=4)
    else:
        net = tcnn.NetworkWithInputEncoding(3, 2, {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 8},
                                            {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1})
    # float64 on the CPU: tcnn casts and moves it; the gradient comes back in the input's dtype and device.
    x = torch.rand(64, 3, dtype=torch.float64, requires_grad=True)
    ids = torch.arange(64, dtype=torch.int32) % 4 if kind == "array" else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = net(x, ids) if ids is not None else net(x)
    assert any("moved from the CPU" in str(w.message) for w in caught)
    y.float().square().sum().backward()
    assert x.grad is not None and x.grad.device.type == "cpu" and x.grad.dtype == torch.float64
    xg = x.detach().float().cuda().requires_grad_()
    (net(xg, ids.cuda()) if ids is not None else net(xg)).float().square().sum().backward()
    assert rel_err(x.grad, xg.grad.cpu()) < 1e-5


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("n_networks,grouped,shared", [(1, False, False), (3, False, False), (3, True, False),
                                                       (3, False, True), (3, True, True)])
def test_grid_model_gradients_match_float64(kernels, n_networks, grouped, shared, tuned):
    """A hash grid feeding the network (feature-major where the path reads it): output, input and both tables'
    gradients against the float64 grid lookup and MLP, with the batch in the caller's order and grouped by
    network (`tuning.group_by_network`), and with one network shared by every id's grid (`share_network`: its
    gradient sums every id's samples)."""
    from test_encodings_grid import ref_grid
    from tinn.models import NetworkWithInputEncoding
    if kernels == "batched_gemm" and n_networks == 1:
        pytest.skip("batched GEMMs are the path of arrays")
    tuned(precision="float32", group_by_network=grouped)  # (`tuned` starts from the process's settings each call)
    grid = {"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 8,
            "base_resolution": 4, "per_level_scale": 2.0}
    model = NetworkWithInputEncoding(3, 2, grid, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1,
                                                  "activation": "Tanh"}, n_networks=n_networks, kernels=kernels,
                                     share_network=shared)
    assert model.network.n_networks == (1 if shared else n_networks)
    with torch.no_grad():
        model.encoding.params.normal_(0, 0.5)  # O(1) features, so the network's gradients are not all tiny
    torch.manual_seed(4)
    x = torch.rand(150, 3, device=dev(), requires_grad=True)
    ids = ragged_ids(150, n_networks, seed=4)
    dy = torch.randn(150, 2, device=dev())
    assert model.groups_by_network() == grouped
    model(x, ids).backward(dy)
    xd = x.detach().cpu().double().requires_grad_()
    pe = model.encoding.params.detach().cpu().double().requires_grad_()
    pn = model.network.params.detach().cpu().double().requires_grad_()
    enc_ids = ids.cpu() if model.encoding.n_networks > 1 else torch.zeros_like(ids.cpu())
    h = ref_grid(model.encoding, xd, pe, enc_ids)
    net_ids = ids.cpu() if model.network.n_networks > 1 else torch.zeros_like(ids.cpu())
    y64 = mlp_array(model.network, pn, h, net_ids, "Tanh", "None")
    y64.backward(dy.cpu().double())
    assert rel_err(x.grad.cpu(), xd.grad) < 1e-4
    assert rel_err(model.encoding.params.grad.cpu(), pe.grad) < 1e-4
    assert rel_err(model.network.params.grad.cpu(), pn.grad) < 1e-4
