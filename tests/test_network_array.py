"""NetworkArray forward and hand-written backward against a float64 torch reference."""
import pytest
import torch

import tinn
from tinn.activations import ACTIVATIONS
from tinn.errors import ConfigError, InputError
from tinn import networks
from tinn.networks import NetworkArray

from reference import mlp_array, rel_err

TOL = 1e-4


def ragged_ids(batch, n_networks, gen):
    """Uneven routing: a few heavy networks, many light ones, some empty, shuffled order."""
    weights = torch.rand(n_networks, generator=gen) ** 4
    weights[::7] = 0.0  # networks with no samples at all
    ids = torch.multinomial(weights, batch, replacement=True, generator=gen)
    return ids.to(torch.int32)


def check_against_reference(n_in, n_out, width, depth, hidden, output, n_networks, batch, seed=0, otype="FullyFusedMLP"):
    gen = torch.Generator().manual_seed(seed)
    cfg = {"otype": otype, "n_neurons": width, "n_hidden_layers": depth, "activation": hidden,
           "output_activation": output}
    dev = tinn.runtime.device()
    net = NetworkArray(n_in, n_out, cfg, n_networks=n_networks, seed=seed)
    x = (torch.rand(batch, n_in, generator=gen) * 2 - 1).to(dev).requires_grad_()
    ids = (ragged_ids(batch, n_networks, gen) if n_networks > 1 else torch.zeros(batch, dtype=torch.int32)).to(dev)
    y = net(x, ids)
    dy = torch.randn(batch, n_out, generator=gen).to(dev)
    y.backward(dy)

    p64 = net.params.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y64 = mlp_array(net, p64, x64, ids, hidden, output)
    y64.backward(dy.double())

    assert rel_err(y.detach(), y64.detach()) < TOL
    assert rel_err(x.grad, x64.grad) < TOL
    assert rel_err(net.params.grad, p64.grad) < TOL
    # Networks that received no samples get exactly zero gradient.
    empty = torch.bincount(ids.long(), minlength=n_networks) == 0
    assert torch.all(net.params.grad[empty] == 0)
    # Inference path (no stored activations) gives the same output.
    with torch.no_grad():
        assert torch.equal(net(x.detach(), ids), y.detach())


# On CUDA the fused kernels of each (width, depth, activations) compile once per process; the wide ones take tens
# of seconds, so the GEMM test below reuses these shapes.
WIDE = pytest.mark.slow


@pytest.mark.parametrize("width,depth", [(16, 0), (16, 1), (32, 2), pytest.param(64, 3, marks=WIDE),
                                         pytest.param(128, 1, marks=WIDE)])
def test_widths_and_depths(width, depth):
    check_against_reference(3, 4, width, depth, "ReLU", "None", n_networks=64, batch=700)


@pytest.mark.parametrize("hidden,output", [
    ("LeakyReLU", "Sigmoid"), ("Exponential", "Tanh"), ("Sine", "None"), ("Sigmoid", "Squareplus"),
    ("Squareplus", "Softplus"), ("Softplus", "Exponential"), ("Tanh", "Sine"), ("None", "ReLU"),
    ("SiLU", "None"), ("ReLU", "SiLU"),
])
def test_activations(hidden, output):
    check_against_reference(4, 3, 16, 2, hidden, output, n_networks=64, batch=500, seed=3)


def test_many_networks_cutlass_width():
    check_against_reference(2, 3, 24, 1, "ReLU", "None", n_networks=1024, batch=3000, seed=5, otype="CutlassMLP")


@pytest.mark.parametrize("width,depth,hidden", [(16, 1, "Tanh"), pytest.param(64, 3, "ReLU", marks=WIDE),
                                               (32, 1, "Sine"), pytest.param(128, 1, "ReLU", marks=WIDE)])
def test_single_network_gemm_weight_gradients(width, depth, hidden, tuned):
    """A single network's weight gradients come from one vendor GEMM per layer: against float64, and
    against tinn's own tile kernels (same sums, another order)."""
    check_against_reference(3, 4, width, depth, hidden, "None", n_networks=1, batch=900, seed=7)
    net = NetworkArray(3, 4, {"n_neurons": width, "n_hidden_layers": depth, "activation": hidden}, seed=2)
    x = torch.rand(900, 3, device=tinn.runtime.device())
    grads = []
    for vendor in (True, False):
        tuned(vendor_weight_gradients=vendor)
        net.params.grad = None
        net(x).square().sum().backward()
        grads.append(net.params.grad.clone())
    assert rel_err(grads[0], grads[1]) < 1e-5
    assert not torch.equal(grads[0], torch.zeros_like(grads[0]))


@pytest.mark.parametrize("k,max_slices", [(5000, 3), (4096, 4), (1500, 8), (900, 8)])
def test_long_k_gemm_slices_and_remainder(k, max_slices, device):
    """Products a_i @ b_i^T cut into K slices (plus a remainder GEMM), written to consecutive blocks of
    one output: the float64 products, for strided operands with storage offsets."""
    gen = torch.Generator().manual_seed(k)
    a = torch.randn(64, k + 3, generator=gen, device="cpu").to(device)[2:7, 1:k + 1]  # row stride != k, offset
    b = torch.randn(k + 1, 7, generator=gen).to(device)[1:].t()            # (7, k) with column stride 7, offset
    a2 = torch.randn(3, k, generator=gen).to(device)
    out = torch.full((1, 5 * 7 + 3 * 5 + 2), 7.0, device=device)  # two blocks, then two untouched values
    networks.mm_long_k([(a, b), (a2, a)], out[:, :-2], max_slices=max_slices)
    assert rel_err(out[0, :35].view(5, 7), a.double() @ b.double().t()) < 1e-5
    assert rel_err(out[0, 35:50].view(3, 5), a2.double() @ a.double().t()) < 1e-5
    assert torch.equal(out[0, 50:], torch.full((2,), 7.0, device=device))


@pytest.mark.parametrize("max_slices", [1, 4])
def test_long_k_gemm_rows_of_stacked_buffers(max_slices, device):
    """Operands given as rows of stacked (n, R, K) buffers and of a sample-major input read through its
    strides (what the single network's weight gradients pass): the float64 products."""
    gen = torch.Generator().manual_seed(11)
    k = 4100
    deltas = torch.randn(2, 6, k, generator=gen).to(device)
    acts = torch.randn(3, 6, k, generator=gen).to(device)
    x = torch.randn(k, 5, generator=gen).to(device)  # sample-major: its transpose is the (5, K) operand
    rows = networks.GemmOperand
    products = [(rows.stacked(deltas, 1), rows.transposed(x)),
                (rows.stacked(deltas, 0, 4), rows.stacked(acts, 2, 3))]
    out = torch.full((1, 6 * 5 + 4 * 3 + 1), 7.0, device=device)
    networks.mm_long_k(products, out[:, :-1], max_slices=max_slices)
    assert rel_err(out[0, :30].view(6, 5), deltas[1].double() @ x.double()) < 1e-5
    assert rel_err(out[0, 30:42].view(4, 3), deltas[0, :4].double() @ acts[2, :3].double().t()) < 1e-5
    assert float(out[0, 42]) == 7.0


def test_single_network_without_ids(device):
    net = NetworkArray(3, 2, {"n_neurons": 16, "n_hidden_layers": 1})
    x = torch.rand(50, 3, device=device)
    assert torch.equal(net(x), net(x, torch.zeros(50, dtype=torch.int32, device=device)))


def test_routing_is_per_sample_and_order_preserving(device):
    """Each output row equals running that row alone through its own network."""
    net = NetworkArray(2, 2, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=5)
    x = torch.rand(40, 2, device=device)
    ids = torch.randint(0, 5, (40,), dtype=torch.int32, device=device)
    y = net.inference(x, ids)
    # Equal to float32 rounding: a BLAS path (batched GEMMs on the CPU) may block a product differently for
    # another batch; a wrong routing or order would differ in every digit.
    for b in [0, 7, 39]:
        alone = net.inference(x[b:b + 1], ids[b:b + 1])
        torch.testing.assert_close(alone[0], y[b], rtol=1e-6, atol=1e-7)
    perm = torch.randperm(40, device=device)
    torch.testing.assert_close(net.inference(x[perm], ids[perm]), y[perm], rtol=1e-6, atol=1e-7)


def test_init_matches_tcnn_bounds_and_seed():
    net = NetworkArray(8, 4, {"n_neurons": 32, "n_hidden_layers": 2}, n_networks=3, seed=7)
    for layer, (o, i) in enumerate(net.layer_shapes()):
        w = net.weights(layer).detach()
        bound = (6.0 / (o + i)) ** 0.5
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    same = NetworkArray(8, 4, {"n_neurons": 32, "n_hidden_layers": 2}, n_networks=3, seed=7)
    other = NetworkArray(8, 4, {"n_neurons": 32, "n_hidden_layers": 2}, n_networks=3, seed=8)
    assert torch.equal(net.params, same.params)
    assert not torch.equal(net.params, other.params)
    assert not torch.equal(net.weights(0)[0], net.weights(0)[1])  # networks differ from each other


def test_parameter_count_and_layout():
    net = NetworkArray(5, 3, {"n_neurons": 16, "n_hidden_layers": 2}, n_networks=2)
    assert net.layer_shapes() == [(16, 5), (16, 16), (3, 16)]
    assert net.params.shape == (2, 16 * 5 + 16 * 16 + 3 * 16)
    assert net.flops_per_sample() == 2 * net.params.shape[1]


@pytest.mark.parametrize("cfg,key", [
    ({"otype": "Transformer"}, "network.otype"),
    ({"otype": "FullyFusedMLP", "n_neurons": 48}, "network.n_neurons"),
    ({"n_neurons": 0}, "network.n_neurons"),
    ({"n_hidden_layers": -1}, "network.n_hidden_layers"),
    ({"activation": "GELU"}, "network.activation"),
    ({"output_activation": 3}, "network.output_activation"),
])
def test_bad_network_config_names_key(cfg, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        NetworkArray(3, 3, cfg)


def test_otype_is_case_insensitive_like_tcnn():
    net = NetworkArray(3, 3, {"otype": "fullyfusedmlp", "activation": "relu"})
    assert net.config["otype"] == "FullyFusedMLP" and net.hidden_act == ACTIVATIONS["ReLU"]


def test_bad_inputs_give_clear_errors(device):
    net = NetworkArray(3, 2, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=4)
    x = torch.rand(10, 3, device=device)
    ids = torch.zeros(10, dtype=torch.int32, device=device)
    with pytest.raises(InputError, match="float32"):
        net(x.double(), ids)
    with pytest.raises(InputError, match="last dimension 4; expected 3"):
        net(torch.rand(10, 4, device=device), ids)
    with pytest.raises(InputError, match="net_ids contains 4; allowed: 0 <= id < n_networks=4"):
        net(x, torch.full((10,), 4, dtype=torch.int32, device=device))
    with pytest.raises(InputError, match="net_ids contains -1"):
        net(x, torch.full((10,), -1, dtype=torch.int32, device=device))
    with pytest.raises(InputError, match="net_ids is required"):
        net(x)
    with pytest.raises(InputError, match="shape \\(10,\\)"):
        net(x, torch.zeros(9, dtype=torch.int32, device=device))
    with pytest.raises(InputError, match="dtype torch.float32"):
        net(x, torch.zeros(10, device=device))
    assert torch.equal(net(x, ids.long()), net(x, ids))  # int64 ids are accepted


def test_empty_batch(device):
    net = NetworkArray(3, 2, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=4)
    assert net(torch.rand(0, 3, device=device), torch.zeros(0, dtype=torch.int32, device=device)).shape == (0, 2)


def test_sixteen_thousand_networks():
    check_against_reference(2, 2, 16, 1, "ReLU", "None", n_networks=16384, batch=4000, seed=11)


def test_tensor_on_wrong_device_is_named():
    other = "cpu" if tinn.runtime.device().type == "cuda" else "meta"
    net = NetworkArray(3, 2, {"n_neurons": 16, "n_hidden_layers": 1})
    with pytest.raises(InputError, match="input is on .* but tinn runs on"):
        net(torch.empty(4, 3, device=other))


def test_batched_gemm_buckets_uneven_counts_and_matches_float64():
    """The CPU's batched GEMMs pad each bucket of networks to its own largest count (counts within a factor of
    two), so very uneven counts cost under twice the real rows instead of falling back to per-sample kernels;
    outputs and weight gradients still match float64, and networks without samples get zero gradients."""
    from tinn.networks.batched_gemm import Batch

    n_networks = 9
    counts = [400, 3, 1, 0, 57, 200, 30, 9, 120]
    ids = torch.cat([torch.full((c,), k, dtype=torch.int32) for k, c in enumerate(counts)])
    ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(1))].to(tinn.runtime.device())
    batch = Batch(ids, n_networks)
    assert batch.padding(ids.numel()) < 2.0
    assert sum(n for _, n, _, _ in batch.buckets) == n_networks - 1  # the empty network takes no rows
    for nets, _, m, _ in batch.buckets:
        bucket_counts = [counts[k] for k in nets.tolist()]
        assert max(bucket_counts) == m and 2 * min(bucket_counts) > m
    even = Batch(torch.arange(36, dtype=torch.int32, device=ids.device) % 4, 4)
    assert [(nets, n, m) for nets, n, m, _ in even.buckets] == [(None, 4, 9)] and even.padding(36) == 1.0

    cfg = {"otype": "FullyFusedMLP", "activation": "Tanh", "output_activation": "None", "n_neurons": 16,
           "n_hidden_layers": 2}
    net = NetworkArray(5, 3, cfg, n_networks=n_networks, seed=4, kernels="batched_gemm")
    x = torch.rand(ids.numel(), 5, device=ids.device).requires_grad_()
    y = net(x, ids)
    dy = torch.rand_like(y)
    y.backward(dy)
    p64 = net.params.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y64 = mlp_array(net, p64, x64, ids, "Tanh", "None")
    y64.backward(dy.double())
    assert rel_err(y.detach(), y64.detach()) < TOL
    assert rel_err(x.grad, x64.grad) < TOL and rel_err(net.params.grad, p64.grad) < TOL
    assert torch.all(net.params.grad[3] == 0)
