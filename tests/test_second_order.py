"""Second-order gradients (backward of the backward) through MLP arrays and encoding + network models,
against float64 torch.autograd double backward: the eikonal term of an SDF loss, and a loss on dx that
reaches dy."""
import pytest
import torch

import tinn
from reference import mlp_array, rel_err
from test_encodings_grid import ref_grid
from tinn.models import NetworkWithInputEncoding
from tinn.networks import NetworkArray


@pytest.fixture(autouse=True)
def float32_networks(tuned):
    """These tests hold float32 kernels to float64 at float32's accuracy: arrays compute in float32 here, whatever
    precision the process's settings name (TINN_SETTINGS)."""
    tuned(precision="float32")


GRID = {"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 8,
        "base_resolution": 4, "per_level_scale": 2.0}


def eikonal(grad):
    return (grad.norm(dim=1) - 1).square().mean()


def dev():
    return tinn.runtime.device()


@pytest.mark.parametrize("hidden", ["ReLU", "Tanh", "SiLU", "Softplus", "Sine"])
@pytest.mark.parametrize("n_networks", [1, 4])
def test_network_array_eikonal_gradients_match_float64(hidden, n_networks):
    torch.manual_seed(1)
    net = NetworkArray(3, 1, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": hidden},
                       n_networks=n_networks, seed=3)
    x = torch.rand(70, 3, device=dev(), requires_grad=True)
    ids = torch.randint(0, n_networks, (70,), device=dev())
    (g,) = torch.autograd.grad(net(x, ids).sum(), x, create_graph=True)
    gx, gp = torch.autograd.grad(eikonal(g), [x, net.params])

    xd = x.detach().cpu().double().requires_grad_()
    pd = net.params.detach().cpu().double().requires_grad_()
    (gd,) = torch.autograd.grad(mlp_array(net, pd, xd, ids.cpu(), hidden, "None").sum(), xd, create_graph=True)
    gxd, gpd = torch.autograd.grad(eikonal(gd), [xd, pd])
    assert rel_err(g.cpu(), gd) < 1e-5
    assert rel_err(gx.cpu(), gxd) < 1e-4 and rel_err(gp.cpu(), gpd) < 1e-4


def _model_reference(model, encoding, x, ids, enc_params, net_params):
    """float64 encoding then MLP array."""
    if encoding == "grid":
        h = ref_grid(model.encoding, x, enc_params, ids if model.encoding.n_networks > 1 else torch.zeros_like(ids))
    else:
        k = torch.arange(model.encoding.n_frequencies, dtype=torch.float64)
        a = (2.0 ** k)[None, None, :] * torch.pi * x[:, :, None]
        h = torch.stack([torch.sin(a), torch.cos(a)], -1).reshape(x.shape[0], -1)
    return mlp_array(model.network, net_params, h, ids, "Tanh", "None")


@pytest.mark.parametrize("encoding,n_networks,share,grouped", [
    ("grid", 1, False, False), ("grid", 3, False, False), ("grid", 3, False, True), ("grid", 3, True, False),
    ("frequency", 3, False, False)])
def test_model_eikonal_gradients_match_float64(encoding, n_networks, share, grouped, tuned):
    tuned(group_by_network=grouped)  # grouped: the batch runs in network order (`tuning.group_by_network`)
    enc_cfg = GRID if encoding == "grid" else {"otype": "Frequency", "n_frequencies": 2}
    model = NetworkWithInputEncoding(3, 1, enc_cfg, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1,
                                                     "activation": "Tanh"},
                                     n_networks=n_networks, seed=5, share_encoding=share)
    if encoding == "grid":
        with torch.no_grad():  # O(1) table values so the grid's share of the gradient is visible
            model.encoding.params.copy_(torch.rand(model.encoding.params.shape, generator=torch.Generator()
                                                   .manual_seed(2)).to(dev()) - 0.5)
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(60, 3, generator=gen).to(dev()).requires_grad_()
    ids = torch.randint(0, n_networks, (60,), generator=gen).to(dev())
    (g,) = torch.autograd.grad(model(x, ids).sum(), x, create_graph=True)
    tables = [t for t in (model.encoding.params, model.network.params) if t is not None]
    grads = torch.autograd.grad(eikonal(g), [x] + tables)

    xd = x.detach().cpu().double().requires_grad_()
    td = [t.detach().cpu().double().requires_grad_() for t in tables]
    enc_p = td[0] if model.encoding.params is not None else None
    y = _model_reference(model, encoding, xd, ids.cpu(), enc_p, td[-1])
    (gd,) = torch.autograd.grad(y.sum(), xd, create_graph=True)
    refs = torch.autograd.grad(eikonal(gd), [xd] + td)
    assert rel_err(g.cpu(), gd) < 1e-5
    for name, a, b in zip(["x"] + ["table"] * len(tables), grads, refs):
        assert rel_err(a.cpu(), b) < 1e-4, name


def test_a_loss_on_dx_reaches_dy():
    """dy depends on a trainable output weighting: d(loss on dx)/d(weighting) runs through d/d(dy)."""
    net = NetworkArray(2, 3, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Tanh"},
                       n_networks=2, seed=7)
    x = torch.rand(30, 2, device=dev(), requires_grad=True)
    ids = torch.randint(0, 2, (30,), device=dev())
    w = torch.randn(3, device=dev(), requires_grad=True)
    (g,) = torch.autograd.grad((net(x, ids) * w).sum(), x, create_graph=True)
    (gw,) = torch.autograd.grad(g.square().sum(), w)

    xd = x.detach().cpu().double().requires_grad_()
    wd = w.detach().cpu().double().requires_grad_()
    y = mlp_array(net, net.params.detach().cpu().double(), xd, ids.cpu(), "Tanh", "None")
    (gd,) = torch.autograd.grad((y * wd).sum(), xd, create_graph=True)
    (gwd,) = torch.autograd.grad(gd.square().sum(), wd)
    assert rel_err(gw.cpu(), gwd) < 1e-5


def test_differentiating_parameter_gradients_is_a_clear_error():
    net = NetworkArray(2, 1, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=2)
    x = torch.rand(10, 2, device=dev())
    ids = torch.randint(0, 2, (10,), device=dev())
    (gp,) = torch.autograd.grad(net(x, ids).sum(), net.params, create_graph=True)
    with pytest.raises(tinn.SecondOrderError, match="parameter gradients of NetworkArray"):
        gp.square().sum().backward()


def test_sdf_demo_fits_with_the_eikonal_term():
    """demos/sdf_eikonal.py at small size: the distance error and the eikonal residual both fall far."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import sdf_eikonal
    r = sdf_eikonal.train(steps=80, batch=1024, log_every=0)
    assert r["before"]["distance_error"] > 0.1 and r["before"]["eikonal_residual"] > 0.5
    assert r["after"]["distance_error"] < 0.02
    assert r["after"]["eikonal_residual"] < 0.2
