"""`settings.precision`: a single network's dense GEMMs and activations in float16 (tcnn's precision,
gradients scaled by 128) or bfloat16, against float64 torch; where the setting applies; training."""
import pytest
import torch

import tinn
from tinn import dense_mlp
from tinn.errors import ConfigError
from tinn.networks import NetworkArray
from tinn.part import FEATURE_MAJOR
from tinn.trainer import Trainer

from reference import forward_backward, mlp_array_float64, rel_err

DEV = tinn.runtime.device()
# Relative error bounds against float64 for a smooth activation: a few units in the last place of each type
# (float16 has 11 significant bits, bfloat16 8). ReLU's derivative is a step: pre-activations within rounding
# of zero flip their unit's mask, so its gradients carry a few percent more.
SMOOTH_BOUND = {"float16": 5e-3, "bfloat16": 3e-2}
STEP_BOUND = {"float16": 4e-2, "bfloat16": 1.2e-1}


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("hidden,output,depth", [("Tanh", "None", 2), ("Sine", "SiLU", 3), ("SiLU", "Sigmoid", 1),
                                                  ("ReLU", "None", 2)])
def test_lower_precision_matches_float64(precision, hidden, output, depth, tuned):
    """Padded inputs and outputs (tcnn's layout) included. The output gradient is 1e-6 per element, a mean over a
    large batch's size: in float16 without the gradient scale it would lose most of its bits (error ~7e-2)."""
    tuned(precision=precision, step_graphs=False)  # replayed steps would take the tensor cores
    gen = torch.Generator().manual_seed(depth)
    x = (torch.rand(3000, 7, generator=gen) * 2 - 1).to(DEV)
    dy = (torch.randn(3000, 5, generator=gen) * 1e-6).to(DEV)
    cfg = {"n_neurons": 32, "n_hidden_layers": depth, "activation": hidden, "output_activation": output}
    net = NetworkArray(7, 5, cfg, seed=3, input_padding=(2, 1.0), output_padding=3)
    assert net.dense and net.precision == precision and net.compute_dtype == dense_mlp.COMPUTE_DTYPES[precision]
    y, dx, dp = forward_backward(net, x, dy)
    assert y.dtype == dx.dtype == dp.dtype == torch.float32 and net.params.dtype == torch.float32
    y64, dx64, dp64 = mlp_array_float64(net, x, torch.zeros(3000, dtype=torch.int32, device=DEV), dy, hidden, output)
    bound = STEP_BOUND[precision] if hidden == "ReLU" else SMOOTH_BOUND[precision]
    errors = rel_err(y, y64), rel_err(dx, dx64), rel_err(dp, dp64)
    assert max(errors) < bound, errors
    assert min(errors) > 1e-6, errors  # the lower precision did compute (float32 gives ~1e-7)
    assert torch.all(dp[:, -3 * 32:] == 0)  # tcnn's padded output rows: no gradient
    with torch.no_grad():
        assert rel_err(net(x, None), y) < 1e-6  # inference: the same GEMMs in two ping-pong buffers


def test_float16_scales_the_gradients_as_tcnn_does():
    assert dense_mlp.GRADIENT_SCALES == {"float32": 1.0, "float16": 128.0, "bfloat16": 1.0}


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_feature_major_inputs_in_lower_precision(precision, tuned):
    """A grid's feature-major features, read as they are, give the sample-major call's values (up to rounding: the
    GEMMs see other layouts), and the input's gradient comes back feature-major in float32."""
    tuned(precision=precision)
    gen = torch.Generator().manual_seed(4)
    x = (torch.rand(400, 6, generator=gen) * 2 - 1).to(DEV)
    dy = torch.randn(400, 3, generator=gen).to(DEV)
    net = NetworkArray(6, 3, {"n_neurons": 16, "n_hidden_layers": 2, "activation": "Tanh"}, seed=2)
    ids = torch.zeros(400, dtype=torch.int32, device=DEV)
    y, ctx = net.forward_with_context(x, ids, train=True)
    y_fm, ctx_fm = net.forward_with_context(x.t().contiguous(), ids, train=True, x_layout=FEATURE_MAJOR)
    dx, (dp,) = net.backward(ctx, dy, need_dx=True)
    dx_fm, (dp_fm,) = net.backward(ctx_fm, dy, need_dx=True)
    assert dx_fm.shape == (6, 400) and dx_fm.dtype == torch.float32
    bound = SMOOTH_BOUND[precision] / 4
    assert rel_err(y_fm, y) < bound and rel_err(dx_fm.t(), dx) < bound and rel_err(dp_fm, dp) < bound


# expected: (path, precision) on the CPU and on CUDA (where the tensor-core kernels run).
@pytest.mark.parametrize("precision,n_networks,kernels,dense_setting,deterministic,graphs,cpu,cuda", [
    # a single network in half precision: cuBLAS's GEMMs where steps run op by op, the tensor cores where a
    # Trainer replays them from CUDA graphs (the default)
    ("float16", 1, "auto", None, False, False, ("dense", "float16"), ("dense", "float16")),
    ("float16", 1, "auto", None, False, True, ("dense", "float16"), ("tensor_cores", "float16")),
    ("bfloat16", 1, "auto", None, False, True, ("dense", "bfloat16"), ("tensor_cores", "bfloat16")),
    ("bfloat16", 1, "auto", None, False, False, ("dense", "bfloat16"), ("dense", "bfloat16")),
    ("float16", 1, "auto", True, False, False, ("dense", "float16"), ("dense", "float16")),
    # arrays: the tensor cores on CUDA; the CPU's batched GEMMs compute in float32
    ("float16", 4, "auto", None, False, False, ("batched_gemm", "float32"), ("tensor_cores", "float16")),
    # Taichi's, asked for
    ("float16", 1, "unfused", None, False, False, ("unfused", "float32"), ("unfused", "float32")),
    # the dense path ruled out: the tensor cores where they run
    ("float16", 1, "auto", False, False, False, ("unfused", "float32"), ("tensor_cores", "float16")),
    ("float16", 1, "auto", None, True, False, ("unfused", "float32"), ("unfused", "float32")),  # deterministic
    ("float32", 1, "auto", True, False, False, ("dense", "float32"), ("dense", "float32")),
    ("float32", 4, "auto", None, False, False, ("batched_gemm", "float32"), ("fused", "float32")),
    # the default: float16 tensor cores for a CUDA array, float32 for a single network
    ("auto", 4, "auto", None, False, False, ("batched_gemm", "float32"), ("tensor_cores", "float16")),
    ("auto", 1, "auto", False, False, False, ("unfused", "float32"), ("fused", "float32")),
])
def test_where_the_precision_applies(precision, n_networks, kernels, dense_setting, deterministic, graphs, cpu, cuda,
                                     tuned):
    tuned(precision=precision, dense_single_network=dense_setting, deterministic=deterministic, step_graphs=graphs)
    net = NetworkArray(4, 2, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=n_networks, kernels=kernels)
    expected = cuda if tinn.runtime.arch() == "cuda" else cpu
    assert (net.path, net.precision) == expected
    assert net.dense == (net.path == "dense")
    assert (f"precision={net.precision}" in repr(net)) == (net.precision != "float32")


def test_a_bad_precision_names_the_field_and_the_allowed_values(tuned):
    with pytest.raises(ConfigError,
                       match=r"precision='half'.*allowed: \['auto', 'float32', 'tf32', 'float16', 'bfloat16'\]"):
        tuned(precision="half")


def _fit(precision, steps, tuned):
    """A hash grid and a 64-wide network fitting a smooth 2-D function through the Trainer."""
    tuned(precision=precision)
    config = {"encoding": {"otype": "HashGrid", "n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 12,
                           "base_resolution": 4, "per_level_scale": 1.5},
              "network": {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2},
              "loss": {"otype": "RelativeL2"},
              "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta2": 0.99, "epsilon": 1e-15}}
    trainer = Trainer.from_config(config, 2, 3, seed=3)
    assert trainer.model.network.precision == precision
    gen = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(steps):
        x = torch.rand(4096, 2, generator=gen)
        y = torch.stack([torch.sin(6 * x[:, 0]) * torch.cos(5 * x[:, 1]), x[:, 0] * x[:, 1],
                         torch.cos(4 * x[:, 0] + 3 * x[:, 1])], 1) * 0.5 + 0.5
        losses.append(float(trainer.training_step(x.to(DEV), y.to(DEV))))
    return losses


def test_lower_precision_trains_like_float32(tuned):
    """RelativeL2 divides by the batch: its gradients are ~1e-5 per element, the range float16 needs scaled."""
    ref = _fit("float32", 120, tuned)
    for precision in ("float16", "bfloat16"):
        losses = _fit(precision, 120, tuned)
        start, end, ref_end = sum(losses[:5]) / 5, sum(losses[-10:]) / 10, sum(ref[-10:]) / 10
        assert end < start / 20, (precision, start, end)
        assert end < 1.5 * ref_end, (precision, end, ref_end)


def test_large_gradients_keep_float16_range_in_the_weight_gradient_sums(tuned):
    """Output gradients of 10 (a summed loss), scaled by 128, and inputs of magnitude 20: the weight-gradient
    GEMMs' partial sums (1024 samples each) pass float16's largest value, 65504; they are kept in float32
    (CUDA) or the GEMMs run in float32 (CPU), so the result is finite and accurate."""
    tuned(precision="float16")
    gen = torch.Generator().manual_seed(8)
    batch = 1 << 15
    x = ((torch.rand(batch, 8, generator=gen) * 2 - 1) * 20).to(DEV)
    dy = torch.full((batch, 4), 10.0, device=DEV)
    net = NetworkArray(8, 4, {"n_neurons": 32, "n_hidden_layers": 2, "activation": "None"}, seed=1)
    y, dx, dp = forward_backward(net, x, dy)
    y64, dx64, dp64 = mlp_array_float64(net, x, torch.zeros(batch, dtype=torch.int32, device=DEV), dy, "None",
                                        "None")
    assert float(dp64.abs().max()) * 128 / (batch // 1024) > 65504  # a slice's scaled sum passes the range
    assert bool(torch.isfinite(dp).all()) and rel_err(dp, dp64) < SMOOTH_BOUND["float16"]
    assert rel_err(y, y64) < SMOOTH_BOUND["float16"] and rel_err(dx, dx64) < SMOOTH_BOUND["float16"]


def test_tcnn_facade_module_in_half_precision_follows_float32(tuned):
    """tcnn's PyTorch module (tinn.torch) over a hash grid: the same weights in float16 give float32 outputs and
    gradients (grid and network) close to the float32 module's."""
    import tinn.torch as tcnn

    enc = {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 10, "base_resolution": 4}
    net = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2, "activation": "Tanh"}
    x = torch.rand(2048, 2, generator=torch.Generator().manual_seed(10)).to(DEV)
    results = []
    for precision in ("float32", "float16"):
        tuned(precision=precision)
        model = tcnn.NetworkWithInputEncoding(2, 3, enc, net, seed=5)
        assert [m.precision for m in model.modules() if isinstance(m, NetworkArray)] == [precision]
        y = model(x)
        ((y.float() - 0.5) ** 2).mean().backward()
        results.append((y.detach().float(), *(p.grad.clone() for p in model.parameters())))
    for a, b in zip(*results):
        assert rel_err(b, a) < SMOOTH_BOUND["float16"]
