"""The loss computed inside the tensor-core backward (`backward_from_loss`): the output layer recomputes the
prediction and takes the loss's gradient, against the loss kernel followed by `backward`, and float64.

On the CPU the kernels run in Triton's interpreter (toy sizes); on CUDA compiled."""
import pytest
import torch

import tinn
from tinn.kernels import losses as loss_kernels
from tinn.losses import LOSSES, Loss
from tinn.networks import NetworkArray
from tinn.networks import tensor_cores
from tinn.trainer import Trainer

from reference import check_loss_inside_backward, mlp_array, rel_err

DEV = tinn.runtime.device()
pytestmark = pytest.mark.skipif(tensor_cores.unavailable_reason(tinn.runtime.arch(), None) is not None,
                                reason=str(tensor_cores.unavailable_reason(tinn.runtime.arch(), None)))


def test_the_kernels_number_the_losses_as_tinn_does():
    from tinn.kernels.tensor_cores import mlp
    names = ("L2", "L1", "RELATIVE_L2", "RELATIVE_L1", "MAPE", "SMAPE", "RELATIVE_L2_LUMINANCE", "CROSS_ENTROPY",
             "VARIANCE")
    assert [getattr(mlp, n).value for n in names] == [getattr(loss_kernels, n) for n in names]
    assert sorted(LOSSES.values()) == list(range(len(names)))


def _case(otype, n_networks=5, batch=300, n_in=5, hidden_layers=2):
    dims = 6 if otype == "RelativeL2Luminance" else 3
    positive = otype in ("CrossEntropy", "Variance")  # PDF-valued predictions
    out_act = "Exponential" if positive else "Sigmoid"
    cfg = {"n_neurons": 16, "n_hidden_layers": hidden_layers, "activation": "Tanh", "output_activation": out_act}
    net = NetworkArray(n_in, dims, cfg, n_networks=n_networks, seed=3)
    gen = torch.Generator().manual_seed(len(otype))
    x = (torch.rand(batch, n_in, generator=gen) * 2 - 1).to(DEV)
    ids = torch.multinomial(torch.rand(n_networks, generator=gen) + 0.1, batch, replacement=True, generator=gen)
    t = (torch.rand(batch, dims, generator=gen) + (0.1 if positive else -0.5)).to(DEV)
    return net, x, ids.to(torch.int32).to(DEV), t, out_act


@pytest.mark.parametrize("otype", list(LOSSES))
def test_loss_inside_the_output_layer_matches_the_loss_kernel_and_float64(otype, tuned):
    tuned(precision="float32", kernels="tensor_cores")
    net, x, ids, t, out_act = _case(otype)
    assert net.tensor_cores is not None and net.fuses_loss() and net.fuses_loss(need_dx=True)
    from test_losses import _value64
    check_loss_inside_backward(net, x, ids, t, Loss(otype), lambda p, q, w: _value64(otype, p, q, w), "Tanh", out_act,
                               1e-4)


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_loss_inside_the_output_layer_in_16_bit_precisions(precision, tuned):
    """The 16-bit kernels with the loss inside: the same gradients as the loss kernel and `backward` (up to the
    order of float32 sums), and float64's within the precision's rounding; the gradient scale divides out."""
    tuned(precision=precision, kernels="tensor_cores")
    net, x, ids, t, out_act = _case("L2", n_networks=3, batch=200, hidden_layers=1)
    loss = Loss("L2")
    y, ctx = net.forward_with_context(x, ids, train=True)
    dx, (dp,), value = net.backward_from_loss(ctx, y, loss, t, need_dx=True)
    result = loss.evaluate(y, t)
    y2, ctx2 = net.forward_with_context(x, ids, train=True)
    dx2, (dp2,) = net.backward(ctx2, result.grad, need_dx=True)
    assert abs(float(value) - float(result.value)) <= 1e-5 * abs(float(result.value))
    assert rel_err(dp, dp2) < 1e-3 and rel_err(dx, dx2) < 1e-3
    p64 = net.params.detach().double().requires_grad_()
    y64 = mlp_array(net, p64, x.double(), ids, "Tanh", out_act)
    ((y64 - t.double()) ** 2).mean().backward()
    assert rel_err(dp, p64.grad) < (5e-3 if precision == "float16" else 3e-2)


def test_a_trainer_step_with_the_loss_inside_equals_the_separate_loss(tuned):
    """Trainer.training_step takes the fused route on the tensor-core path; the tuning setting `fused_loss=False`
    takes the loss kernel: the same loss and the same parameters after a step."""
    states = []
    for fused in (None, False):
        tuned(precision="float32", kernels="tensor_cores", fused_loss=fused)
        net, x, ids, t, _ = _case("L2", n_networks=4, batch=256)
        assert net.fuses_loss() == (fused is None)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
        value = trainer.training_step(x, t, ids)
        states.append((float(value), net.params.detach().clone()))
    (v1, p1), (v2, p2) = states
    assert abs(v1 - v2) <= 1e-6 * abs(v2) and rel_err(p1, p2) < 1e-6


@pytest.mark.parametrize("route", ["backward_from_loss", "gradients_from_loss"])
def test_a_loss_averaged_over_a_larger_batch_scales_the_gradients(route, tuned):
    """The kernels take the loss's `mean_over` (a sharded array's owners average over the senders' batches): the
    gradients and the value scale by batch x dims / mean_over against the batch's own mean."""
    tuned(precision="float32", kernels="tensor_cores")
    net, x, ids, t, _ = _case("L2", n_networks=3, batch=200, hidden_layers=1)
    count = 5 * t.numel()
    results = []
    for loss in (Loss("L2"), Loss("L2").averaged_over(count)):
        if route == "backward_from_loss":
            y, ctx = net.forward_with_context(x, ids, train=True)
            results.append(net.backward_from_loss(ctx, y, loss, t, need_dx=True))
        else:
            results.append(net.gradients_from_loss(x, ids, loss, t, need_dx=True))
    (dx, (dp,), value), (dx5, (dp5,), value5) = results
    assert rel_err(dp5 * 5, dp) < 1e-6 and rel_err(dx5 * 5, dx) < 1e-6
    assert abs(float(value5) * 5 - float(value)) <= 1e-6 * abs(float(value))


def test_a_loss_the_kernels_do_not_know_is_refused():
    from tinn.kernels.tensor_cores import launch
    with pytest.raises(ValueError, match=r"loss_kind=42.*losses \[0, 1"):
        launch.backward_from_loss(42, torch.zeros(1, 1), None)


def test_the_trainer_runs_no_forward_when_the_backward_recomputes_it(tuned, monkeypatch):
    """A Trainer step of an array on the tensor cores with the loss inside: routing, packing and the recomputing
    backward only (the forward kernel's output would go unread); the same step as the forward-then-backward
    route within float32's rounding."""
    from tinn.kernels.tensor_cores import launch
    states = []
    for skip in (True, False):
        tuned(precision="float32", kernels="tensor_cores")
        net, x, ids, t, _ = _case("L2", n_networks=4, batch=256)
        assert net.tensor_cores.recomputes()
        if not skip:  # the Part contract's default: a training forward, then backward_from_loss
            monkeypatch.setattr(NetworkArray, "gradients_from_loss", NetworkArray.__mro__[1].gradients_from_loss)
        forwards = []
        original = launch.forward
        monkeypatch.setattr(launch, "forward", lambda *a, **k: forwards.append(1) or original(*a, **k))
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
        value = trainer.training_step(x, t, ids)
        assert len(forwards) == (0 if skip else 1)
        states.append((float(value), net.params.detach().clone()))
        monkeypatch.undo()
    (v1, p1), (v2, p2) = states
    assert abs(v1 - v2) <= 1e-6 * abs(v2) and rel_err(p1, p2) < 1e-6


@pytest.mark.parametrize("n_networks", [1, 3])
def test_an_encoded_model_step_runs_no_network_forward(n_networks, tuned, monkeypatch):
    """A hash grid feeding an array on the tensor cores (handed over feature-major), as tcnn's image sample
    and the scenes train: the Trainer's step runs the grid's forward and the recomputing backward, no network
    forward, and ends where the forward-then-backward route does, up to float32's rounding."""
    from tinn.kernels.tensor_cores import launch
    from tinn.models import NetworkWithInputEncoding
    from tinn.part import Part
    grid = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 10,
            "base_resolution": 4, "per_level_scale": 2.0}
    net_cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
               "output_activation": "None"}
    gen = torch.Generator().manual_seed(7)
    x = torch.rand(192, 2, generator=gen).to(DEV)
    t = torch.rand(192, 3, generator=gen).to(DEV)
    ids = torch.randint(0, n_networks, (192,), generator=gen).to(torch.int32).to(DEV)
    states = []
    for skip in (True, False):
        tuned(precision="float32", kernels="tensor_cores")
        model = NetworkWithInputEncoding(2, 3, grid, net_cfg, n_networks=n_networks, seed=5)
        assert model.network.path == "tensor_cores" and model.fuses_loss()
        initial_grid = model.parameter_tables()[0].detach().clone()
        if not skip:
            monkeypatch.setattr(NetworkWithInputEncoding, "gradients_from_loss", Part.gradients_from_loss)
        forwards = []
        original = launch.forward
        monkeypatch.setattr(launch, "forward", lambda *a, **k: forwards.append(1) or original(*a, **k))
        trainer = Trainer(model, {"otype": "RelativeL2"}, {"otype": "Adam", "learning_rate": 1e-2})
        values = [float(trainer.training_step(x, t, ids if n_networks > 1 else None)) for _ in range(2)]
        assert len(forwards) == (0 if skip else 2)
        states.append((values, [p.detach().clone() for p in model.parameter_tables()]))
        monkeypatch.undo()
    (v1, p1), (v2, p2) = states
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(v1, v2))
    assert all(rel_err(a, b) < 1e-5 for a, b in zip(p1, p2))
    assert rel_err(p1[0], initial_grid) > 1e-3  # the grid trained too


def test_tuning_turns_the_recomputing_backward_off(tuned):
    """`tuning.tensor_core_recompute=False`: the training forward saves its pre-activations for the layer-by-layer
    backward, with the same gradients."""
    grads = []
    for recompute in (True, False):
        tuned(precision="float32", kernels="tensor_cores", tensor_core_recompute=recompute)
        net, x, ids, t, _ = _case("L2", n_networks=3, batch=128)
        assert net.tensor_cores.recomputes() == recompute
        y, ctx = net.forward_with_context(x, ids, train=True)
        saved, _ = ctx.saved
        assert saved.recompute == recompute and (saved.pre is None) == recompute
        _, (dp,) = net.backward(ctx, t - y, need_dx=False)
        grads.append(dp)
    assert rel_err(grads[0], grads[1]) < 1e-5


def test_a_target_of_the_wrong_shape_is_refused_before_the_kernels(tuned):
    from tinn.errors import InputError
    tuned(precision="float32", kernels="tensor_cores")
    net, x, ids, t, _ = _case("L2", n_networks=2, batch=64)
    with pytest.raises(InputError, match=r"target has shape \(64, 2\); expected \(64, 3\)"):
        net.gradients_from_loss(x, ids, Loss("L2"), t[:, :2], need_dx=False)
