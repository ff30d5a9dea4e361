"""Dynamic gradient scaling of float16 networks (tinn/gradient_scaling.py): the scale's arithmetic, and training
whose gradients overflow float16 with tcnn's static scale."""
import math

import pytest
import torch

import tinn
from tinn.errors import ConfigError
from tinn.gradient_scaling import GradientScaler
from tinn.networks import NetworkArray
from tinn.trainer import Trainer

DEV = tinn.runtime.device()
NET = {"otype": "FullyFusedMLP", "n_neurons": 32, "n_hidden_layers": 2, "activation": "Tanh",
       "output_activation": "None"}


def expected_scale(init, flags, growth=2.0, backoff=0.5, interval=3):
    """The scale after a sequence of steps (True: finite), from the rule: x backoff per non-finite step, x growth
    after `interval` finite steps in a row (a non-finite step restarts the count)."""
    scale, run = init, 0
    for finite in flags:
        run = run + 1 if finite else 0
        scale *= backoff if not finite else (growth if run == interval else 1.0)
        run = 0 if run == interval else run
    return scale


def test_scale_grows_and_backs_off_by_the_rule():
    scaler = GradientScaler(DEV, init_scale=128.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    flags = [True, True, True, False, True, True, False, False, True, True, True, True, True, True]
    good = torch.ones(5, device=DEV)
    for i, finite in enumerate(flags):
        grad = torch.full((4,), 3.0, device=DEV) * float(scaler.value)
        if not finite:
            grad[2] = math.inf if i % 2 else math.nan
        scaler.unscale_([good.clone(), grad])
        if finite:
            torch.testing.assert_close(grad, torch.full((4,), 3.0, device=DEV))  # unscaled in place
        assert scaler.update() == finite
        assert scaler.value == expected_scale(128.0, flags[:i + 1])
        assert float(scaler.scale) == scaler.value and float(scaler.found_inf) == 0.0
    assert scaler.skipped_steps == flags.count(False)
    assert scaler.value == 128.0 * 2 ** 3 * 0.5 ** 3   # three growths and three backoffs
    with pytest.raises(ConfigError, match=r"backoff_factor=1.5 must be in \(0, 1\)"):
        GradientScaler(DEV, backoff_factor=1.5)


def test_only_float16_networks_get_a_dynamic_scaler(tuned):
    for precision, static, expected in [("float16", False, True), ("float16", True, False),
                                        ("bfloat16", False, False), ("float32", False, False)]:
        tuned(precision=precision, gradient_scaling="static" if static else "dynamic")
        net = NetworkArray(3, 2, NET, seed=1)
        assert (net.gradient_scaler is not None) == expected, (precision, static)
        if expected:
            assert net.gradient_scale is net.gradient_scaler.scale and net.gradient_scaler.value == 128.0
    with pytest.raises(ConfigError, match=r"gradient_scaling='auto'.*allowed: \['dynamic', 'static'\]"):
        tuned(gradient_scaling="auto")


def _summed_loss(pred, target):
    """A summed loss times 1000: output gradients of ~1e3 per element, which tcnn's scale of 128 takes past
    float16's largest value (65504)."""
    return 1000.0 * ((pred - target) ** 2).sum()


def _train(precision, scaling, tuned, steps=60):
    tuned(precision=precision, gradient_scaling=scaling)
    net = NetworkArray(2, 1, NET, seed=3)
    trainer = Trainer(net, _summed_loss, {"otype": "Adam", "learning_rate": 1e-2})
    gen = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(steps):
        x = torch.rand(256, 2, generator=gen)
        y = (torch.sin(3 * x[:, :1]) * x[:, 1:] + 0.5)
        losses.append(float(trainer.training_step(x.to(DEV), y.to(DEV))))
    return trainer, losses


def test_float16_training_overflows_with_the_static_scale_and_recovers_with_the_dynamic_one(tuned):
    _, static = _train("float16", "static", tuned)
    assert not math.isfinite(static[-1])   # one step with inf gradients turned the parameters into NaN
    trainer, dynamic = _train("float16", "dynamic", tuned)
    _, reference = _train("float32", "dynamic", tuned)
    scaler = trainer.model.gradient_scaler
    assert trainer.skipped_steps >= 1 and trainer.skipped_steps == scaler.skipped_steps
    assert trainer.step + trainer.skipped_steps == 60
    assert trainer.summary() == {"step": trainer.step, "skipped_steps": trainer.skipped_steps,
                                 "gradient_scale": scaler.value}
    assert scaler.value == 128.0 * 0.5 ** trainer.skipped_steps   # no growth within 60 steps
    assert all(math.isfinite(v) for v in dynamic)
    assert bool(torch.isfinite(trainer.model.params).all())
    end, ref_end = sum(dynamic[-5:]) / 5, sum(reference[-5:]) / 5
    assert end < dynamic[0] / 10, (dynamic[0], end)
    assert abs(end - ref_end) < 0.25 * ref_end, (end, ref_end)


def test_autograd_users_get_unscaled_gradients_and_the_overflow_flag(tuned):
    """Through torch autograd (the tcnn facade's path): gradients arrive unscaled; an overflow is flagged in
    the scaler, whose `update()` tells the caller to skip the step and backs the scale off."""
    tuned(precision="float16", gradient_scaling="dynamic")
    net = NetworkArray(2, 1, NET, seed=3)
    scaler = net.gradient_scaler
    x = torch.rand(64, 2, device=DEV)
    y = net(x, None)
    (y.sum() * 1e-3).backward()
    small = net.params.grad.clone()
    assert scaler.update() and bool(torch.isfinite(small).all())
    tuned(precision="float32")
    reference = NetworkArray(2, 1, NET, seed=3)
    (reference(x, None).sum() * 1e-3).backward()
    torch.testing.assert_close(small, reference.params.grad, rtol=2e-2, atol=2e-2 * float(small.abs().max()))
    net.params.grad = None
    (net(x, None).sum() * 1e4).backward()   # 1e4 x 128 passes float16's range
    assert not scaler.update() and scaler.value == 64.0 and scaler.skipped_steps == 1


def test_a_tcnn_facade_loop_skips_the_overflowing_step(tuned):
    """tcnn's PyTorch module (tinn.torch) in a loop of the user's own: `model.network.gradient_scaler.update()`
    after each backward says whether to step; the step that overflowed is skipped, the grid's and network's
    parameters stay finite, and the scale is halved."""
    import tinn.torch as tcnn

    tuned(precision="float16", gradient_scaling="dynamic")
    enc = {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 8, "base_resolution": 4}
    model = tcnn.NetworkWithInputEncoding(2, 1, enc, NET, seed=5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = model.network.gradient_scaler
    x = torch.rand(128, 2, generator=torch.Generator().manual_seed(1)).to(DEV)
    taken = []
    for weight in (1.0, 1e5, 1.0):   # the middle step's output gradients pass float16's range at scale 128
        optimizer.zero_grad()
        (weight * (model(x).float() - 0.5).square().sum()).backward()
        taken.append(scaler.update())
        if taken[-1]:
            optimizer.step()
    assert taken == [True, False, True] and scaler.value == 64.0
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


@pytest.mark.skipif(tinn.runtime.arch() != "cuda", reason="the tensor-core path runs on CUDA")
def test_the_tensor_core_path_takes_the_scale_as_a_float_and_flags_overflow(tuned):
    """An array of networks on the tensor cores in float16: its kernels take the scaler's host value, the
    gradients arrive unscaled (against float32 within float16's accuracy) and an overflow is flagged."""
    from tinn.networks import tensor_cores

    if tensor_cores.unavailable_reason("cuda", None) is not None:
        pytest.skip(tensor_cores.unavailable_reason("cuda", None))
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(4096, 2, generator=gen).to(DEV)
    ids = torch.randint(0, 8, (4096,), generator=gen, dtype=torch.int32).to(DEV)
    grads = []
    for precision in ("float32", "float16"):
        tuned(precision=precision, kernels="tensor_cores", gradient_scaling="dynamic")
        net = NetworkArray(2, 1, dict(NET, n_neurons=64), n_networks=8, seed=3)
        assert net.tensor_cores is not None and net.precision == precision
        (net(x, ids).float().square().mean()).backward()
        grads.append(net.params.grad.clone())
    scaler = net.gradient_scaler
    assert scaler.update()
    err = float((grads[1] - grads[0]).norm() / grads[0].norm())
    assert err < 2e-2, err
    net.params.grad = None
    (net(x, ids).float().sum() * 1e5).backward()
    assert not scaler.update() and scaler.value == 64.0
