"""`Settings.deterministic`: bit-identical training run to run, with the gradients still right.

The cases put several kernel tiles (CPU tiles hold 4096 samples) into one network and many samples into one
hash-grid entry, where the default kernels add with float atomics in scheduling order.
"""
import pytest
import torch

import tinn
from reference import mlp_array_float64, rel_err
from test_encodings_grid import assert_close, make, ref_grid
from tinn import chunks
from tinn.errors import ConfigError
from tinn.models import NetworkWithInputEncoding
from tinn.networks import NetworkArray
from tinn.trainer import Trainer

DEV = tinn.runtime.device()
NET = {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2, "activation": "ReLU",
       "output_activation": "None"}
GRID = {"otype": "HashGrid", "n_levels": 6, "n_features_per_level": 2, "log2_hashmap_size": 9, "base_resolution": 4,
        "per_level_scale": 1.6}
WEIGHTS = [20.0, 1.0, 0.0, 0.5, 3.0, 1.0]  # network 0: ~15,000 of 20,000 samples; network 2: none


def batch(n_in=3, n_out=4, size=20000, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(size, n_in, generator=gen)
    t = torch.rand(size, n_out, generator=gen)
    ids = torch.multinomial(torch.tensor(WEIGHTS), size, replacement=True, generator=gen).int()
    return x.to(DEV), t.to(DEV), ids.to(DEV)


def train(make_model, steps=4, autograd=False):
    model = make_model()
    x, t, ids = batch()
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    losses = []
    for _ in range(steps):
        if autograd:  # the torch path: module call, loss, backward, the trainer's optimizer
            losses.append(float(trainer.optimize(lambda: ((model(x, ids) - t) ** 2).mean())))
        else:
            losses.append(float(trainer.training_step(x, t, ids)))
    return losses, [p.detach().clone() for p in model.parameters()]


MODELS = {
    "mlp": lambda: NetworkArray(3, 4, NET, n_networks=len(WEIGHTS), seed=3),
    "grid+mlp": lambda: NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=len(WEIGHTS), seed=3),
}


@pytest.mark.parametrize("autograd", [False, True], ids=["trainer", "autograd"])
@pytest.mark.parametrize("name", list(MODELS))
def test_runs_are_bit_identical(name, autograd, tuned):
    tuned(deterministic=True)
    first = train(MODELS[name], autograd=autograd)
    for _ in range(2):
        again = train(MODELS[name], autograd=autograd)
        assert again[0] == first[0]
        assert all(torch.equal(a, b) for a, b in zip(again[1], first[1]))
    assert first[0][-1] < first[0][0]


def test_deterministic_training_follows_the_default_path(tuned):
    """The same steps as the fast kernels, up to summation order."""
    tuned(deterministic=False)
    fast = train(MODELS["grid+mlp"])
    tuned(deterministic=True)
    fixed = train(MODELS["grid+mlp"])
    torch.testing.assert_close(torch.tensor(fixed[0]), torch.tensor(fast[0]), rtol=1e-4, atol=0)


def test_mlp_gradients_match_float64(tuned):
    tuned(deterministic=True)
    net = MODELS["mlp"]()
    assert not net.fused
    x, _, ids = batch()
    w = torch.randn(x.shape[0], 4, generator=torch.Generator().manual_seed(2)).to(DEV)
    xg = x.clone().requires_grad_(True)
    (net(xg, ids) * w).sum().backward()
    _, dx64, dp64 = mlp_array_float64(net, x, ids, w, "ReLU", "None")
    assert rel_err(net.params.grad, dp64) < 1e-4
    assert rel_err(xg.grad, dx64) < 1e-4
    assert net.params.grad[2].abs().max() == 0  # the network without samples


@pytest.mark.parametrize("interpolation", ["Linear", "Smoothstep", "Nearest"])
def test_grid_gradients_match_float64_across_chunks(interpolation, tuned):
    """Table and input gradients of the sorted-terms path against float64, with the table cut into
    chunks of two grids and the batch into several blocks of terms."""
    enc = make(3, 5, seed=4, n_levels=4, n_features_per_level=2, log2_hashmap_size=7, base_resolution=3,
               per_level_scale=1.7, interpolation=interpolation)
    tuned(deterministic=True, table_chunk_elements=2 * enc.n_params_per_network())
    assert len(chunks.row_spans(5, enc.n_params_per_network())) == 3
    from tinn.kernels import deterministic as deterministic_kernels
    block = deterministic_kernels.GRID_TERMS_PER_BLOCK
    deterministic_kernels.GRID_TERMS_PER_BLOCK = 4 * 8 * 2 * 700   # blocks of 700 samples
    try:
        x, _, ids = batch(size=3000)
        ids = ids.clamp(max=4)
        w = torch.randn(x.shape[0], enc.n_output_dims, generator=torch.Generator().manual_seed(5)).to(DEV)
        xg = x.clone().requires_grad_(interpolation != "Nearest")
        (enc(xg, ids) * w).sum().backward()
        grads = enc.params.grad.clone(), (xg.grad.clone() if xg.requires_grad else None)
        enc.params.grad = None
        xg2 = x.clone().requires_grad_(xg.requires_grad)
        (enc(xg2, ids) * w).sum().backward()
        assert torch.equal(enc.params.grad, grads[0])
    finally:
        deterministic_kernels.GRID_TERMS_PER_BLOCK = block
    x64 = x.double().requires_grad_(xg.requires_grad)
    p64 = enc.params.detach().double().requires_grad_(True)
    (ref_grid(enc, x64, p64, ids) * w.double()).sum().backward()
    assert_close(grads[0], p64.grad, what="d/dparams")
    if xg.requires_grad:
        assert torch.equal(xg2.grad, grads[1])
        assert_close(grads[1], x64.grad, rtol=1e-4, atol_frac=1e-4, what="d/dx")


def test_settings_and_fused_kernels_are_checked(tuned):
    with pytest.raises(ConfigError, match=r"settings\.deterministic='yes' must be true or false"):
        tinn.Settings(deterministic="yes")
    tuned(deterministic=True)
    with pytest.raises(ConfigError, match=r"kernels='fused'"):
        NetworkArray(3, 4, NET, n_networks=2, kernels="fused")
