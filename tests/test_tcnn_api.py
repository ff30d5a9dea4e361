"""tcnn's module surface: dtypes, devices, tracing, the Module attributes."""
import pytest
import torch

import tinn
import tinn.torch as tcnn

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
       "output_activation": "None"}


def dev():
    return tinn.runtime.device()


def test_tcnn_input_handling():
    model = tcnn.NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 2}, NET)
    x = torch.rand(20, 2, device=dev())
    y = model(x)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):  # any float dtype, cast as tcnn does
        assert torch.allclose(model(x.to(dtype)), y, atol=1e-2)
    assert model(x.double()).dtype == torch.float32  # tcnn's output is its module dtype
    # tinn's own classes stay strict
    with pytest.raises(tinn.InputError, match="dtype torch.float64"):
        tinn.NetworkArray(2, 3, NET)(x.double())
    with pytest.raises(tinn.TinnError, match="cannot be traced"):
        torch.jit.trace(model, x)
    with pytest.raises(tinn.InputError, match="float32 parameters"):
        model.double()(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="moving CPU inputs needs a CUDA runtime")
def test_cpu_inputs_move_to_the_gpu_with_a_warning():
    if tinn.runtime.arch() != "cuda":
        pytest.skip("tinn runs on the CPU here")
    from reference import mlp_array

    model = tcnn.Network(2, 3, NET)
    x = torch.rand(10, 2)
    with pytest.warns(UserWarning, match="moved from the CPU"):
        y = model(x)
    assert y.device == dev()
    # The numbers of the input moved by hand, and of a float64 reference.
    assert torch.equal(y, model(x.to(dev())))
    ids = torch.zeros(10, dtype=torch.int32, device=dev())
    x64 = x.to(dev()).double().requires_grad_(True)
    ref = mlp_array(model, model.params.detach().double(), x64, ids, "ReLU", "None")
    torch.testing.assert_close(y.double(), ref, rtol=1e-3, atol=1e-5)
    # The input gradient comes back to the CPU tensor.
    xg = x.clone().requires_grad_(True)
    with pytest.warns(UserWarning, match="moved from the CPU"):
        model(xg).sum().backward()
    ref.sum().backward()
    assert xg.grad.device.type == "cpu"
    torch.testing.assert_close(xg.grad.double(), x64.grad.cpu(), rtol=1e-3, atol=1e-5)


def test_module_surface():
    enc = tcnn.Encoding(2, {"otype": "Frequency", "n_frequencies": 2}, dtype=torch.float16)
    assert isinstance(enc, tcnn.Module) and isinstance(enc, tcnn.Encoding) and enc.dtype == torch.float16
    assert enc(torch.rand(5, 2, device=dev())).dtype == torch.float16  # tcnn's output dtype; float32 inside
    model = tcnn.NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 2}, NET)
    assert model.jit_fusion is False and tcnn.supports_jit_fusion() is False
    model.jit_fusion = tcnn.supports_jit_fusion()  # what tcnn's sample does
    assert tcnn.free_temporary_memory() is None
    assert model.loss_scale == 1.0 and model.n_params() == model.params.numel()


def test_flat_params_gets_the_gradient_as_tcnns_does():
    """tcnn's `params` is one flat (P,) parameter whose `.grad` backward sets: network first, then the encoding,
    against a float64 reference (grid lookup and MLP re-implemented in torch)."""
    from reference import mlp_array
    from test_encodings_grid import ref_grid

    grid = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6,
            "base_resolution": 4, "per_level_scale": 2.0}
    model = tcnn.NetworkWithInputEncoding(2, 3, grid, dict(NET, activation="Tanh"), seed=5)
    flat = model.params
    assert isinstance(flat, torch.nn.Parameter) and flat.dim() == 1 and flat.requires_grad
    assert flat.numel() == model.n_params()
    assert all(p is not flat for p in model.parameters())  # not stepped twice by an optimizer over parameters()
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(64, 2, generator=gen).to(dev())
    w = torch.randn(64, 3, generator=gen).to(dev())
    (model(x) * w).sum().backward()

    net, enc = model.network, model.encoding
    n_net = net.params.numel()
    p64 = flat.detach().double().requires_grad_(True)
    ids = torch.zeros(64, dtype=torch.int32, device=dev())
    h = ref_grid(enc, x.double(), p64[n_net:].view(1, -1), ids)
    y = mlp_array(net, p64[:n_net].view(1, -1), h, ids, "Tanh", "None")
    (y * w.double()).sum().backward()
    assert flat.grad is not None and flat.grad.shape == flat.shape
    torch.testing.assert_close(flat.grad.double(), p64.grad, rtol=1e-4, atol=1e-6)
    # The tables keep their own gradients (what optimizers over parameters() read).
    torch.testing.assert_close(torch.cat([net.params.grad.reshape(-1), enc.params.grad.reshape(-1)]), flat.grad)
    # A second backward accumulates into each, independently.
    before = flat.grad.clone()
    (model(x) * w).sum().backward()
    torch.testing.assert_close(flat.grad, 2 * before)
    torch.testing.assert_close(net.params.grad.reshape(-1), 2 * before[:n_net])


def test_single_network_params_gets_its_gradient():
    """tcnn.Network's `params` is its (1, P) table: a parameter whose `.grad` backward sets (float64 reference)."""
    from reference import mlp_array

    model = tcnn.Network(3, 2, dict(NET, activation="Tanh"), seed=2)
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(32, 3, generator=gen).to(dev())
    model(x).sum().backward()
    p64 = model.params.detach().double().requires_grad_(True)
    ids = torch.zeros(32, dtype=torch.int32, device=dev())
    mlp_array(model, p64, x.double(), ids, "Tanh", "None").sum().backward()
    assert isinstance(model.params, torch.nn.Parameter) and model.params.shape == (1, model.n_params())
    torch.testing.assert_close(model.params.grad.double(), p64.grad, rtol=1e-4, atol=1e-6)
