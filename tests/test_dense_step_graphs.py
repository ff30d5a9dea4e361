"""A dense single network's training step replayed from fixed buffers (`tinn/dense_graphs.py`; CUDA graphs on
CUDA, plain calls on the same buffers elsewhere): the same values as the eager path, outputs and gradients that
are the caller's own, and the eager path wherever the buffers are taken."""
import pytest
import torch

import tinn
from tinn import dense_graphs
from tinn.networks import NetworkArray
from tinn.part import FEATURE_MAJOR, SAMPLE_MAJOR
from tinn.trainer import Trainer

from reference import mlp_array, rel_err

DEV = tinn.runtime.device()
CONFIG = {"n_neurons": 32, "n_hidden_layers": 2, "activation": "ReLU", "output_activation": "Sigmoid"}


def pair(tuned, precision="float32", config=CONFIG, **kw):
    """Two networks with the same weights: the replayed one and the eager one."""
    tuned(precision=precision, dense_single_network=True, dense_step_graphs=True)
    replayed = NetworkArray(6, 3, config, seed=4, **kw)
    tuned(precision=precision, dense_single_network=True, dense_step_graphs=False)
    eager = NetworkArray(6, 3, config, seed=4, **kw)
    assert replayed._step_graphs is not None and eager._step_graphs is None
    return replayed, eager


def captured(net, x):
    """Two training steps on x's batch shape: the second captures it, so the next forward replays."""
    for _ in range(2):
        step(net, x, torch.ones(x.shape[0], 3, device=DEV), SAMPLE_MAJOR)


def step(net, x, dy, layout):
    ids = torch.zeros(x.shape[0], dtype=torch.int32, device=DEV)
    xin = x.t().contiguous() if layout == FEATURE_MAJOR else x
    y, ctx = net.forward_with_context(xin, ids, train=True, x_layout=layout)
    dx, (dp,) = net.backward(ctx, dy, need_dx=True)
    replayed = getattr(ctx, "held_buffers", None) is not None
    del ctx
    return y, (dx.t() if layout == FEATURE_MAJOR else dx), dp, replayed


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("layout", [SAMPLE_MAJOR, FEATURE_MAJOR])
def test_replayed_steps_match_the_eager_path(precision, layout, tuned):
    """Several steps with the weights changed in between: the buffers take the new weights each time."""
    replayed, eager = pair(tuned, precision, input_padding=(2, 1.0), output_padding=5)
    gen = torch.Generator().manual_seed(1)
    used = []
    for i in range(4):
        x = (torch.rand(700, 6, generator=gen) * 2 - 1).to(DEV)
        dy = torch.randn(700, 3, generator=gen).to(DEV)
        y, dx, dp, was_replayed = step(replayed, x, dy, layout)
        y2, dx2, dp2, _ = step(eager, x, dy, layout)
        used.append(was_replayed)
        for a, b in ((y, y2), (dx, dx2), (dp, dp2)):
            assert rel_err(a, b) < 1e-6
        assert torch.all(dp[:, -5 * 32:] == 0)  # tcnn's padded output rows
        with torch.no_grad():
            for net in (replayed, eager):
                net.params.add_(dp, alpha=-0.5)
    assert used == [False, True, True, True]  # captured at the shape's second step


def test_a_second_forward_before_the_backward_runs_eagerly(tuned):
    """Two forwards, then one backward through both: the second could not take the held buffers."""
    replayed, eager = pair(tuned)
    gen = torch.Generator().manual_seed(2)
    x1, x2 = ((torch.rand(500, 6, generator=gen) * 2 - 1).to(DEV) for _ in range(2))
    captured(replayed, x1)
    grads = []
    for net in (replayed, eager):
        net.params.grad = None
        xa, xb = x1.clone().requires_grad_(), x2.clone().requires_grad_()
        ya, yb = net(xa, None), net(xb, None)
        ((ya * ya).sum() + (yb * 2).sum()).backward()
        grads.append((ya.detach(), yb.detach(), xa.grad, xb.grad, net.params.grad.clone()))
    for a, b in zip(*grads):
        assert rel_err(a, b) < 1e-6


def test_outputs_and_gradients_stay_the_callers(tuned):
    """A kept output and gradient do not change when the next step replays into the buffers."""
    replayed, _ = pair(tuned)
    gen = torch.Generator().manual_seed(3)
    kept = []
    for _ in range(3):
        x = (torch.rand(400, 6, generator=gen) * 2 - 1).to(DEV)
        y, dx, dp, _ = step(replayed, x, torch.randn(400, 3, generator=gen).to(DEV), SAMPLE_MAJOR)
        kept.append((y, y.clone(), dx, dx.clone(), dp, dp.clone()))
    for y, y0, dx, dx0, dp, dp0 in kept:
        assert torch.equal(y, y0) and torch.equal(dx, dx0) and torch.equal(dp, dp0)
    assert not torch.equal(kept[1][0], kept[2][0])


def test_retained_graph_backward_twice_accumulates(tuned):
    """Two backward passes through one retained graph leave twice a single pass's gradient in `.grad`, on the
    replayed and the eager path, and a single pass's is the float64 reference's."""
    replayed, eager = pair(tuned)
    x = (torch.rand(300, 6, generator=torch.Generator().manual_seed(4)) * 2 - 1).to(DEV)
    captured(replayed, x)
    ids = torch.zeros(300, dtype=torch.int32, device=DEV)
    p64 = eager.params.detach().double().requires_grad_(True)
    (mlp_array(eager, p64, x.double(), ids, "ReLU", "Sigmoid") ** 2).sum().backward()
    for net in (replayed, eager):
        net.params.grad = None
        loss = (net(x, None) ** 2).sum()
        loss.backward(retain_graph=True)
        once = net.params.grad.clone()
        loss.backward()
        assert rel_err(once, p64.grad) < 1e-5
        assert rel_err(net.params.grad, 2 * once) < 1e-6


def test_batch_shapes_are_bounded_and_large_ones_run_eagerly(tuned, monkeypatch):
    replayed, _ = pair(tuned)
    gen = torch.Generator().manual_seed(5)
    for batch in (100, 200, 300, 100, 200, 300, 300):
        step(replayed, torch.rand(batch, 6, generator=gen).to(DEV), torch.ones(batch, 3, device=DEV), SAMPLE_MAJOR)
    assert len(replayed._step_graphs.shapes) <= dense_graphs.MAX_SHAPES
    assert (300, False) in replayed._step_graphs.shapes
    # Cycling through more shapes than are kept: a bounded number of evictions (each costs a capture), then eager.
    for _ in range(6):
        for batch in (100, 200, 300):
            step(replayed, torch.rand(batch, 6, generator=gen).to(DEV), torch.ones(batch, 3, device=DEV),
                 SAMPLE_MAJOR)
    assert replayed._step_graphs.evictions == dense_graphs.MAX_EVICTIONS
    # Without `dense_step_graphs=True`, only shapes whose buffers fit MAX_AUTO_BYTES.
    replayed._step_graphs.any_size = False
    monkeypatch.setattr(dense_graphs, "MAX_AUTO_BYTES", 1000)
    x = torch.rand(500, 6, generator=gen).to(DEV)
    assert not any(step(replayed, x, torch.ones(500, 3, device=DEV), SAMPLE_MAJOR)[3] for _ in range(3))


def test_where_steps_are_replayed(tuned):
    tuned(dense_single_network=True)  # dense_step_graphs None: on CUDA only
    assert (NetworkArray(4, 2, CONFIG)._step_graphs is not None) == (tinn.runtime.arch() == "cuda")
    tuned(dense_single_network=True, dense_step_graphs=True, vendor_weight_gradients=False)
    assert NetworkArray(4, 2, CONFIG)._step_graphs is None  # Taichi's kernel computes the weight gradients
    tuned(dense_single_network=False, dense_step_graphs=True)
    assert NetworkArray(4, 2, CONFIG)._step_graphs is None
    tuned(dense_single_network=True, dense_step_graphs=True)
    assert NetworkArray(4, 2, CONFIG, n_networks=3)._step_graphs is None


def test_the_trainer_steps_the_same_with_replayed_steps(tuned):
    """A hash grid feeding the network feature-major, the loss seeding the backward (Trainer): identical losses."""
    config = {"encoding": {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 10,
                           "base_resolution": 4, "per_level_scale": 1.5},
              "network": {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2},
              "loss": {"otype": "RelativeL2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-2}}
    runs = []
    for graphs in (True, False):
        tuned(dense_single_network=True, dense_step_graphs=graphs, precision="float16")
        trainer = Trainer.from_config(config, 2, 3, seed=3)
        gen = torch.Generator().manual_seed(6)
        losses = []
        for _ in range(5):
            x = torch.rand(1024, 2, generator=gen)
            losses.append(float(trainer.training_step(x.to(DEV), (x[:, :1] * x).repeat(1, 2)[:, :3].to(DEV))))
        runs.append((losses, trainer.model.network._step_graphs))
    (replayed, graphs), (eager, _) = runs
    assert graphs is not None and graphs.shapes  # the steps did replay
    # The same kernels either way; on CUDA the grid's table gradient adds with float atomics, whose order
    # differs run to run, so losses agree to float32 rounding compounded over the steps, not bit for bit.
    tolerance = 1e-5 if DEV.type == "cpu" else 1e-4
    assert all(abs(a - b) <= tolerance * abs(b) for a, b in zip(replayed, eager)), (replayed, eager)


def test_a_loop_that_keeps_the_last_loss_alive_replays_every_step(tuned):
    """tcnn's sample loop: `loss` of step k lives until step k+1 has run its forward. The hold ends with the
    backward, so each step still replays."""
    replayed, _ = pair(tuned)
    x = (torch.rand(256, 6, generator=torch.Generator().manual_seed(7)) * 2 - 1).to(DEV)
    opt = torch.optim.SGD(replayed.parameters(), lr=0.1)
    loss = None
    for _ in range(6):
        opt.zero_grad()
        loss = (replayed(x, None) ** 2).mean()
        loss.backward()
        opt.step()
    assert replayed._step_graphs.replayed_forwards == 5  # every step after the first (the shape's capture)


def test_a_second_backward_after_another_forward_took_the_buffers_recomputes(tuned):
    """retain_graph: the first forward's second backward finds the next forward's activations in the buffers and
    recomputes its own; the gradients equal the eager network's."""
    replayed, eager = pair(tuned)
    gen = torch.Generator().manual_seed(8)
    xa, xb = ((torch.rand(300, 6, generator=gen) * 2 - 1).to(DEV) for _ in range(2))
    captured(replayed, xa)
    grads = []
    for net in (replayed, eager):
        net.params.grad = None
        loss_a = (net(xa, None) ** 2).sum()
        loss_a.backward(retain_graph=True)
        (net(xb, None) * 3).sum().backward()   # takes the buffers (replayed network)
        loss_a.backward()
        grads.append(net.params.grad.clone())
    assert replayed._step_graphs.replayed_forwards == 3  # the capture, forward a, forward b
    assert rel_err(grads[0], grads[1]) < 1e-6


def test_second_derivatives_through_replayed_steps_match_the_eager_path(tuned):
    """create_graph=True (an eikonal-style loss): the first derivative from the replayed backward, the second
    from the network's float64-checked second-order pass, as on the eager path."""
    replayed, eager = pair(tuned, "float16", config=dict(CONFIG, activation="Tanh", output_activation="None"))
    x = (torch.rand(200, 6, generator=torch.Generator().manual_seed(9)) * 2 - 1).to(DEV)
    grads = []
    for net in (replayed, eager):
        net.params.grad = None
        for _ in range(3):  # the replayed network captures at the second step
            xg = x.clone().requires_grad_()
            (g,) = torch.autograd.grad(net(xg, None).sum(), xg, create_graph=True)
            (g ** 2).sum().backward()
        grads.append(net.params.grad.clone())
    assert replayed._step_graphs.replayed_forwards == 2
    assert rel_err(grads[0], grads[1]) < 1e-6 and float(grads[0].norm()) > 0
