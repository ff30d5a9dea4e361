"""The fused CUDA MLP-array kernels (shared-memory tiles) against float64 torch and the unfused kernels."""
import pytest
import torch

import tinn
from tinn.losses import LOSSES, Loss
from tinn.networks import NetworkArray

from reference import check_loss_inside_backward, mlp_array_float64, rel_err


@pytest.fixture(autouse=True)
def float32_networks(tuned):
    """These tests hold float32 kernels to float64 at float32's accuracy: arrays compute in float32 here, whatever
    precision the process's settings name (TINN_SETTINGS)."""
    tuned(precision="float32")


pytestmark = pytest.mark.skipif(tinn.runtime.arch() != "cuda", reason="fused kernels run on CUDA only")
TOL = 1e-4
slow = pytest.mark.slow  # widths 32 and up: each shape's kernels take tens of seconds to compile


def run(net, x, ids, dy, input_grad=True):
    x = x.clone().requires_grad_(input_grad)
    net.params.grad = None
    y = net(x, ids)
    y.backward(dy)
    return y.detach(), x.grad, net.params.grad.clone()


@pytest.mark.parametrize("n_in,width,n_out,depth,n_networks,batch,routing,input_grad", [
    pytest.param(32, 64, 16, 2, 64, 20000, "ragged", True, marks=slow),
    pytest.param(32, 128, 16, 2, 16, 9000, "ragged", True, marks=slow),
    pytest.param(48, 32, 3, 3, 300, 5000, "ragged", False, marks=slow),  # parameters only: no input deltas
    (3, 16, 1, 1, 1, 3000, "single", True),      # one network, many chunks: atomics across chunks
    (16, 64, 4, 0, 1024, 4000, "even", True),    # no hidden layer
])
def test_fused_matches_float64_and_unfused(n_in, width, n_out, depth, n_networks, batch, routing, input_grad, tuned):
    """Both GEMM kernels with their weights staged in shared memory (the default stages the deltas kernel's)."""
    tuned(fused_staged_weights="both")
    check_fused(n_in, width, n_out, depth, n_networks, batch, routing, input_grad)


@pytest.mark.parametrize("n_in,width,n_out,depth,n_networks,batch,routing,input_grad", [
    pytest.param(32, 64, 16, 2, 64, 20000, "ragged", True, marks=slow),
    (3, 16, 1, 1, 1, 3000, "single", True),
    (16, 64, 4, 0, 1024, 4000, "even", True),
])
def test_fused_weights_read_through_l1_match_float64(n_in, width, n_out, depth, n_networks, batch, routing,
                                                      input_grad, tuned):
    """The GEMMs' other weight path (tuning.fused_staged_weights="none"): weights read from global memory."""
    tuned(fused_staged_weights="none")
    check_fused(n_in, width, n_out, depth, n_networks, batch, routing, input_grad, staged=False)


@pytest.mark.parametrize("activation", ["LeakyReLU", pytest.param("Tanh", marks=slow)])
@pytest.mark.parametrize("width", [32, pytest.param(128, marks=slow)])
def test_fused_activation_derivatives_match_float64(activation, width, tuned):
    """Hidden activations other than ReLU through the deltas kernel's derivative, at 4 and 16 columns per thread."""
    tuned(fused_staged_weights="both")
    check_fused(24, width, 5, 2, 9, 6000, "ragged", True, activation=activation)


def check_fused(n_in, width, n_out, depth, n_networks, batch, routing, input_grad, staged=True, activation="ReLU"):
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(batch)
    cfg = {"n_neurons": width, "n_hidden_layers": depth, "activation": activation, "output_activation": "Sigmoid"}
    net = NetworkArray(n_in, n_out, cfg, n_networks=n_networks, seed=1, kernels="fused")
    assert net.fused
    g = net.fused_geometry
    def fits(tile):  # width 128 does not: L1 either way
        return g.features * (tile + 1) + g.features * (g.features + 1) <= 12288
    assert g.weight_rows == (g.features if staged and fits(g.tile) else 0)
    assert g.backward_weight_rows == (g.features if staged and fits(g.backward_tile) else 0)
    x = (torch.rand(batch, n_in, generator=gen) * 2 - 1).to(dev)
    if routing == "ragged":
        ids = torch.multinomial(torch.rand(n_networks, generator=gen) ** 4, batch, replacement=True, generator=gen)
    elif routing == "sorted":
        ids = torch.arange(batch) * n_networks // batch
    else:
        ids = torch.randint(0, n_networks, (batch,), generator=gen)
    ids = ids.to(torch.int32).to(dev)
    dy = torch.randn(batch, n_out, generator=gen).to(dev)

    y, dx, dp = run(net, x, ids, dy, input_grad)
    y64, dx64, dp64 = mlp_array_float64(net, x, ids, dy, activation, "Sigmoid")
    assert rel_err(y, y64) < TOL
    assert (dx is None) if not input_grad else rel_err(dx, dx64) < TOL
    assert rel_err(dp, dp64) < TOL

    net.fused = False
    y2, dx2, dp2 = run(net, x, ids, dy, input_grad)
    assert rel_err(y, y2) < 1e-5 and rel_err(dp, dp2) < 1e-5
    assert (dx2 is None) if not input_grad else rel_err(dx, dx2) < 1e-5


def test_sine_keeps_the_unfused_path():
    net = NetworkArray(3, 2, {"n_neurons": 16, "activation": "Sine"})
    assert not net.fused


@slow
@pytest.mark.parametrize("n_networks,batch", [(1, 5000), (37, 9000)])
def test_feature_major_inputs_match_row_major(n_networks, batch):
    """A grid's feature-major output read in place: same outputs and input gradients (transposed) as
    row-major inputs, same weight gradients up to summation order."""
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(3)
    net = NetworkArray(32, 3, {"n_neurons": 64, "n_hidden_layers": 2}, n_networks=n_networks, seed=5)
    x = torch.rand(batch, 32, generator=gen).to(dev)
    ids = torch.randint(0, n_networks, (batch,), generator=gen, dtype=torch.int32).to(dev)
    dy = torch.randn(batch, 3, generator=gen).to(dev)
    results = []
    for fm in (False, True):
        xin = x.t().contiguous() if fm else x
        out, ctx = net.forward_with_context(xin, ids, train=True,
                                            x_layout=tinn.FEATURE_MAJOR if fm else tinn.SAMPLE_MAJOR)
        dx, (dparams,) = net.backward(ctx, dy, need_dx=True)
        results.append((out, dx.t() if fm else dx, dparams))
    (out0, dx0, dp0), (out1, dx1, dp1) = results
    assert torch.equal(out0, out1) and torch.equal(dx0, dx1)
    assert rel_err(dp0, dp1) < 1e-5


@pytest.mark.parametrize("n_dims,n_frequencies,width,n_networks", [(3, 6, 32, 64), (2, 4, 64, 5), (3, 2, 16, 1)])
def test_inference_encodes_frequencies_inside_the_fused_kernel(n_dims, n_frequencies, width, n_networks, tuned):
    """Inference of Frequency -> FullyFusedMLP encodes in the network's kernel (no encoded features in memory);
    it equals the encoding's own kernel followed by the network, with tcnn's input padding and across row chunks."""
    from tinn.models import NetworkWithInputEncoding

    DEV = tinn.runtime.device()
    model = NetworkWithInputEncoding(n_dims, 4, {"otype": "Frequency", "n_frequencies": n_frequencies},
                                     {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": 2},
                                     n_networks=n_networks, seed=3)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(7000, n_dims, generator=gen).to(DEV) * 2 - 0.5
    ids = torch.randint(0, n_networks, (7000,), generator=gen, dtype=torch.int32).to(DEV)
    assert model._frequencies_fuse(x)
    with torch.no_grad():
        fused = model(x, ids)
        h = model.encoding(x, torch.zeros_like(ids))
        separate = model.network(h, ids)
    assert rel_err(fused, separate) < 1e-5
    tuned(table_chunk_elements=max(model.network.params[0].numel() * 2, 1))  # several row chunks
    with torch.no_grad():
        chunked = model(x, ids)
    assert rel_err(chunked, separate) < 1e-5


@pytest.mark.parametrize("otype", list(LOSSES))
def test_loss_inside_the_deltas_kernel_matches_float64(otype, tuned):
    """`backward_from_loss` on the fused kernels: the deltas kernel computes the loss's gradient from the output
    and target (and per-warp sums of its values); against the loss kernel followed by `backward`, and float64."""
    from test_losses import _value64
    dims = 6 if otype == "RelativeL2Luminance" else 4
    # PDF-valued predictions: Exponential, whose derivative (the output itself) is exact in float32; Softplus's
    # from its output, 1 - exp(-10 y), loses digits for the tiny outputs that dominate Variance's gradient
    positive = otype in ("CrossEntropy", "Variance")
    out_act = "Exponential" if positive else "Sigmoid"
    cfg = {"n_neurons": 16, "n_hidden_layers": 1, "output_activation": out_act}
    net = NetworkArray(5, dims, cfg, n_networks=7, seed=3)
    assert net.fuses_loss() and not net.fuses_loss(need_dx=True)  # the default: only without the input gradient
    tuned(fused_loss=True)  # (with it, to check dx too)
    assert net.fuses_loss(need_dx=True)
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(len(otype))
    batch = 3001
    x = torch.rand(batch, 5, generator=gen).to(dev)
    ids = torch.multinomial(torch.rand(7, generator=gen) + 0.1, batch, replacement=True, generator=gen)
    ids = ids.to(torch.int32).to(dev)
    t = (torch.rand(batch, dims, generator=gen) + (0.1 if positive else -0.5)).to(dev)
    loss = Loss(otype)

    check_loss_inside_backward(net, x, ids, t, loss, lambda p, q, w: _value64(otype, p, q, w), "ReLU", out_act, TOL)


def test_a_loss_averaged_over_a_larger_batch_scales_the_fused_gradients(tuned):
    """The deltas kernel takes the loss's `mean_over`: gradients and value scale by batch x dims / mean_over."""
    tuned(fused_loss=True)
    net = NetworkArray(5, 4, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=7, seed=3)
    assert net.fused and net.fuses_loss(need_dx=True)
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(1001, 5, generator=gen).to(dev)
    ids = torch.randint(0, 7, (1001,), generator=gen, dtype=torch.int32).to(dev)
    t = torch.rand(1001, 4, generator=gen).to(dev)
    results = []
    for loss in (Loss("L2"), Loss("L2").averaged_over(3 * t.numel())):
        y, ctx = net.forward_with_context(x, ids, train=True)
        results.append(net.backward_from_loss(ctx, y, loss, t, need_dx=True))
    (dx, (dp,), value), (dx3, (dp3,), value3) = results
    assert rel_err(dp3 * 3, dp) < 1e-6 and rel_err(dx3 * 3, dx) < 1e-6
    assert abs(float(value3) * 3 - float(value)) <= 1e-6 * abs(float(value))
