"""The Trainer's autograd-free step on tinn models: bit-identical to the autograd path, and it steps
aside whenever something (hooks, unknown encodings, subclasses) needs the autograd graph."""
import pytest
import torch

import tinn
import tinn.torch as tcnn
from tinn.direct_step import DirectStep
from tinn.models import NetworkWithInputEncoding
from tinn.networks import NetworkArray
from tinn.trainer import Trainer

GRID = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 10,
        "base_resolution": 4, "per_level_scale": 2.0}
NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "ReLU"}


def make(kind, n_networks=1):
    if kind == "grid":
        return NetworkWithInputEncoding(2, 3, GRID, NET, n_networks=n_networks, seed=4)
    if kind == "shared_grid":
        return NetworkWithInputEncoding(2, 3, GRID, NET, n_networks=n_networks, seed=4, share_encoding=True)
    if kind == "frequency":
        return NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 3}, NET,
                                        n_networks=n_networks, seed=4)
    if kind == "tcnn_grid":
        return tcnn.NetworkWithInputEncoding(2, 3, GRID, NET, seed=4, n_networks=n_networks)
    if kind == "network":
        return NetworkArray(2, 3, NET, n_networks=n_networks, seed=4)
    raise ValueError(kind)


def same(a, b, name):
    """Bit-identical on the CPU. On CUDA the grid's backward sums with float atomics in no fixed order
    (two autograd runs differ too) and the fused network's GEMMs see transposed operands: equal up to
    summation order, so CUDA compares one step's gradients, before Adam magnifies rounding noise."""
    if tinn.runtime.arch() == "cpu":
        assert torch.equal(a, b), name
    else:
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), name


def batch(n_networks, step, size=600):
    gen = torch.Generator().manual_seed(100 + step)
    dev = tinn.runtime.device()
    x = torch.rand(size, 2, generator=gen).to(dev)
    t = torch.rand(size, 3, generator=gen).to(dev)
    ids = torch.randint(0, n_networks, (size,), generator=gen, dtype=torch.int32).to(dev)
    return x, t, (ids if n_networks > 1 else None)


def train(model, direct: bool, steps=3, n_networks=1, run_optimizer=True):
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    if not direct:
        trainer._direct = None
    # One batch throughout, so the loss must fall.
    losses = [float(trainer.training_step(*batch(n_networks, 0), run_optimizer=run_optimizer)) for _ in range(steps)]
    return trainer, losses


@pytest.mark.parametrize("kind,n_networks", [("grid", 1), ("grid", 4), ("shared_grid", 4), ("frequency", 1),
                                             ("frequency", 8), ("tcnn_grid", 1), ("network", 1), ("network", 5)])
def test_direct_step_is_bit_identical_to_autograd(kind, n_networks, monkeypatch):
    calls = []
    real_run = DirectStep.run
    monkeypatch.setattr(DirectStep, "run", lambda self, *a: calls.append(1) or real_run(self, *a))
    cpu = tinn.runtime.arch() == "cpu"
    steps = 3 if cpu else 1
    direct, direct_losses = train(make(kind, n_networks), True, steps, n_networks, run_optimizer=cpu)
    assert len(calls) == steps  # the direct step really ran
    graph, graph_losses = train(make(kind, n_networks), False, steps, n_networks, run_optimizer=cpu)
    assert len(calls) == steps
    if cpu:
        assert direct_losses == graph_losses
        assert direct_losses[-1] < direct_losses[0]
    else:
        assert abs(direct_losses[0] - graph_losses[0]) <= 1e-6 * graph_losses[0]
    for (name, p), (_, q) in zip(direct.model.named_parameters(), graph.model.named_parameters()):
        same(p, q, name)
        same(p.grad, q.grad, name)


def test_frozen_grid_is_left_alone():
    model = make("grid")
    model.encoding.params.requires_grad_(False)
    before = model.encoding.params.detach().clone()
    trainer, _ = train(model, True)
    assert trainer._direct is not None
    assert model.encoding.params.grad is None and torch.equal(model.encoding.params, before)
    graph, _ = train(make("grid"), False)  # the trainable grid moved in the reference run
    assert not torch.equal(graph.model.encoding.params, before)


def test_hooks_take_the_autograd_path(monkeypatch):
    model = make("grid")
    seen = []
    model.network.register_forward_hook(lambda *a: seen.append("forward"))
    model.encoding.params.register_hook(lambda g: seen.append("grad") or g)
    monkeypatch.setattr(DirectStep, "run", lambda *a: pytest.fail("direct step ran despite hooks"))
    train(model, True, steps=2)
    assert seen.count("forward") == 2 and seen.count("grad") == 2


def test_models_it_does_not_cover():
    composite = {"otype": "Composite", "nested": [{**GRID, "n_dims_to_encode": 2, "otype": "DenseGrid"},
                                                  {"otype": "Identity"}]}
    assert DirectStep.for_model(NetworkWithInputEncoding(3, 3, composite, NET)) is None

    class Custom(NetworkWithInputEncoding):
        def forward(self, x, net_ids=None):
            return super().forward(x * 0.5, net_ids)

    assert DirectStep.for_model(Custom(2, 3, GRID, NET)) is None
    assert DirectStep.for_model(torch.nn.Linear(2, 3)) is None
    assert DirectStep.for_model(make("tcnn_grid")) is not None


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setattr("tinn.direct_step.ENABLED", False)
    assert DirectStep.for_model(make("grid")) is None


def test_replaced_submodules_are_followed():
    """The step reads the model's parts at every call: a swapped-in network is the one trained, and a
    swapped-in encoding it does not cover sends the step to autograd."""
    model = make("grid")
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "SGD", "learning_rate": 1.0})
    model.network = NetworkArray(model.encoding.n_output_dims, 3, NET, seed=9)
    before = model.network.params.detach().clone()
    trainer.optimizer = tinn.optimizers.create_optimizer({"otype": "SGD", "learning_rate": 1.0},
                                                         list(model.named_parameters()))
    trainer.training_step(*batch(1, 0))
    assert not torch.equal(model.network.params, before)
    composite = {"otype": "Composite", "nested": [{**GRID, "n_dims_to_encode": 2, "otype": "DenseGrid"}]}
    model.encoding = tinn.encodings.create_encoding(2, composite)
    assert not trainer._direct.applies(10)
