"""Dynamic gradient scaling of float16 networks (tinn/gradient_scaling.py): the scale's arithmetic, training whose
gradients overflow float16 with tcnn's static scale, and the skip of an overflowing step decided on the device
(every optimizer's state as if the step had never been asked, no host read, checkpoints)."""
import math

import pytest
import torch

import tinn
from tinn.errors import ConfigError
from tinn.gradient_scaling import GradientScaler
from tinn.networks import NetworkArray
from tinn.trainer import Trainer

DEV = tinn.runtime.device()
pytestmark = pytest.mark.default_precision
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


@pytest.fixture(params=["taichi", "triton"])
def scaler_kernels(request, tuned, monkeypatch):
    """The scaler's two device steps on both launch paths (`tuning.triton_step_kernels`): Taichi's kernels, and
    Triton's (the CUDA default; its interpreter on the CPU). A test on the Triton path must have launched it."""
    launches = []
    if request.param == "triton":
        from tinn.kernels import scaler_triton, triton_available
        if not triton_available():
            pytest.skip("Triton is not installed")
        for name in ("record_non_finite", "update_scale"):
            original = getattr(scaler_triton, name)
            monkeypatch.setattr(scaler_triton, name, (lambda f: lambda *a: (launches.append(1), f(*a)))(original))
    tuned(triton_step_kernels=request.param == "triton")
    yield request.param
    if request.param == "triton":
        assert launches, "the Triton path was never launched"


def test_scale_grows_and_backs_off_by_the_rule(scaler_kernels):
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


def test_non_finite_values_are_recorded_and_a_growth_that_overflows_is_refused(scaler_kernels):
    """record_non_finite flags inf, -inf and NaN (in float32 and float16 gradients) but not float32's largest
    finite values or subnormals; the flag accumulates until `update`; a growth past float32's range keeps the
    scale."""
    scaler = GradientScaler(DEV, init_scale=3.0e38, growth_interval=1)
    fine = torch.tensor([3.4e38, -3.4e38, 1e-45, 0.0, -0.0], device=DEV)
    for bad in (math.inf, -math.inf, math.nan):
        scaler.record_non_finite([fine, None, torch.zeros(0, device=DEV)])
        assert float(scaler.found_inf) == 0.0
        g = torch.ones(2, 33, device=DEV)
        g[1, 17] = bad
        scaler.record_non_finite([g.half() if bad == -math.inf else g, fine])
        assert float(scaler.found_inf) == 1.0
        scaler.record_non_finite([fine])  # stays recorded until the update
        assert scaler.update() is False and float(scaler.found_inf) == 0.0
    assert scaler.value == pytest.approx(3.0e38 * 0.5 ** 3, rel=1e-6) and scaler.skipped_steps == 3
    scaler.load_state_dict({"scale": torch.tensor([3.0e38]), "growth_tracker": torch.tensor([0], dtype=torch.int32),
                            "skipped_steps": torch.tensor([0], dtype=torch.int32)})
    assert scaler.update() is True and scaler.value == pytest.approx(3.0e38) and scaler.finite_in_a_row == 0
    assert float(scaler._inverse) == pytest.approx(1.0 / 3.0e38)


def test_a_non_finite_value_is_found_in_any_block_of_a_long_tensor(scaler_kernels):
    """The check covers every value of a tensor longer than one program's block, wherever the bad one sits."""
    scaler = GradientScaler(DEV)
    n = 3 * 4096 + 5
    for where in (0, 4095, 4096, 2 * 4096 + 17, n - 1):
        g = torch.ones(n, device=DEV)
        scaler.record_non_finite([g])
        assert float(scaler.found_inf) == 0.0
        g[where] = math.nan
        scaler.record_non_finite([g])
        assert float(scaler.found_inf) == 1.0, where
        assert scaler.update() is False


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
    assert trainer.step == 60 and trainer.optimizer.step_count + trainer.skipped_steps == 60
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
def test_the_tensor_core_path_reads_the_scale_on_the_device_and_flags_overflow(tuned):
    """An array of networks on the tensor cores in float16: its kernels read the scaler's device tensor, the
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


# ---- the skip decided on the device ---------------------------------------------------------------------
class _WeightedL2:
    """A summed L2 loss times `weight`: 1e5 takes the output gradients past float16's range at scale 128."""

    def __init__(self):
        self.weight = 1.0

    def __call__(self, pred, target):
        return self.weight * ((pred - target) ** 2).sum()


def _f16_trainer(tuned, optimizer, seed=3, **tuning):
    tuned(precision="float16", gradient_scaling="dynamic", **tuning)
    net = NetworkArray(2, 1, NET, seed=seed)
    assert net.precision == "float16" and net.gradient_scaler is not None
    return Trainer(net, _WeightedL2(), optimizer)


def _batch(i):
    gen = torch.Generator().manual_seed(10 + i)
    x = torch.rand(128, 2, generator=gen)
    return x.to(DEV), (torch.sin(3 * x[:, :1]) * 0.5).to(DEV)


def _snapshot(trainer):
    return trainer.model.params.detach().clone(), trainer.optimizer.state_dict()


def _assert_same_state(a, b):
    (params_a, state_a), (params_b, state_b) = a, b
    if isinstance(params_a, torch.Tensor):
        params_a, params_b = [params_a], [params_b]
    assert len(params_a) == len(params_b) and all(torch.equal(x, y) for x, y in zip(params_a, params_b))
    assert set(state_a) == set(state_b)
    for key, value in state_a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, state_b[key]), key
        else:
            assert value == state_b[key], key


ADAM = {"otype": "Adam", "learning_rate": 1e-2}
SKIP_OPTIMIZERS = [ADAM, {"otype": "SGD", "learning_rate": 1e-3}, {"otype": "Novograd", "learning_rate": 1e-2},
                   {"otype": "EMA", "decay": 0.9, "nested": {"otype": "Lookahead", "alpha": 0.5, "n_steps": 2,
                                                             "nested": ADAM}},
                   {"otype": "Average", "n_samples": 2, "nested": ADAM},
                   {"otype": "Composite", "nested": [dict(ADAM, params="params")]},
                   # ExponentialDecay computes the nested rate on the device; Batched reads the flag on the host
                   {"otype": "ExponentialDecay", "decay_start": 1, "decay_interval": 1, "decay_base": 0.5,
                    "nested": ADAM},
                   {"otype": "Batched", "batch_size_multiplier": 2, "nested": ADAM}]
ON_HOST = ("Batched",)


@pytest.mark.parametrize("optimizer", SKIP_OPTIMIZERS, ids=[o["otype"] for o in SKIP_OPTIMIZERS])
def test_an_overflowing_step_is_skipped_exactly(tuned, optimizer):
    """Steps good, overflowing, good: the overflowing one leaves parameters and optimizer state bit-identical
    (moments and step counts too) and halves the scale, and the run then equals one that never took it (given
    the same scale), as torch's GradScaler with a fused optimizer."""
    _check_overflow_skipped(tuned, optimizer, triton_step_kernels=False)


ADAM_OVER_TRITON = [o for o in SKIP_OPTIMIZERS if o["otype"] in ("Adam", "EMA", "ExponentialDecay")]


@pytest.mark.parametrize("optimizer", ADAM_OVER_TRITON, ids=[o["otype"] for o in ADAM_OVER_TRITON])
def test_an_overflowing_step_is_skipped_exactly_by_adams_triton_launch(tuned, optimizer):
    """The same through Adam's Triton launch (tinn/kernels/adam_triton.py): the skip flag, the pending step
    counts and a rate computed on the device, read by that kernel."""
    from tinn.kernels import adam_triton, triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    launches = []
    with pytest.MonkeyPatch.context() as patch:
        original = adam_triton.adam_step
        patch.setattr(adam_triton, "adam_step", lambda *a: (launches.append(1), original(*a)))
        _check_overflow_skipped(tuned, optimizer, triton_step_kernels=True)
    assert launches


def _check_overflow_skipped(tuned, optimizer, **tuning):
    trainer = _f16_trainer(tuned, optimizer, **tuning)
    assert trainer.optimizer.skips_on_device == (optimizer["otype"] not in ON_HOST)
    trainer.training_step(*_batch(0))
    before = _snapshot(trainer)
    trainer.loss.weight = 1e5
    trainer.training_step(*_batch(1))
    assert trainer.skipped_steps == 1 and trainer.gradient_scale == 64.0 and trainer.step == 2
    _assert_same_state(_snapshot(trainer), before)
    trainer.loss.weight = 1.0
    for i in (2, 3):
        trainer.training_step(*_batch(i))
    assert trainer.optimizer.step_count == 3

    reference = _f16_trainer(tuned, optimizer, **tuning)
    reference.training_step(*_batch(0))
    reference.model.gradient_scaler.load_state_dict({"value": 64.0, "finite_in_a_row": 0, "skipped_steps": 1})
    for i in (2, 3):
        reference.training_step(*_batch(i))
    _assert_same_state(_snapshot(trainer), _snapshot(reference))


def test_the_scale_grows_after_growth_interval_finite_trainer_steps(tuned):
    trainer = _f16_trainer(tuned, {"otype": "Adam", "learning_rate": 1e-3})
    trainer.model.gradient_scaler.growth_interval = 2
    for i in range(5):
        trainer.training_step(*_batch(i))
    assert trainer.gradient_scale == 128.0 * 4 and trainer.skipped_steps == 0
    assert trainer.model.gradient_scaler.finite_in_a_row == 1


def test_a_float16_trainer_step_reads_nothing_back_from_the_device(tuned, monkeypatch):
    """The step's skip decision stays on the device: no tensor is read on the host during the step (on a GPU
    such a read is a sync; tests/test_host_sync_cuda.py checks that with torch's sync debug mode)."""
    trainer = _f16_trainer(tuned, {"otype": "Adam", "learning_rate": 1e-2})
    batches = [_batch(i) for i in range(3)]
    for _ in range(2):   # first-call set-up (compiling; on CUDA the dense step's graph capture) outside
        trainer.training_step(*batches[0])

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read on the host during a training step")

    with tinn.checks.disabled():
        with monkeypatch.context() as patch:
            for name in ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy"):
                patch.setattr(torch.Tensor, name, refuse)
            trainer.loss.weight = 1e5
            trainer.training_step(*batches[1])   # overflows: skipped on the device
            trainer.loss.weight = 1.0
            trainer.training_step(*batches[2])
    assert trainer.step == 4 and trainer.skipped_steps == 1 and trainer.optimizer.step_count == 3


def test_a_checkpoint_mid_run_keeps_the_scaling_state(tuned, tmp_path):
    """Saved after a skipped step, loaded into a fresh trainer: the scale, growth count and skip count come back
    bit-exact, and both runs continue identically."""
    trainer = _f16_trainer(tuned, {"otype": "Adam", "learning_rate": 1e-2})
    trainer.model.gradient_scaler.growth_interval = 3
    for i, weight in enumerate([1.0, 1e5, 1.0, 1.0]):
        trainer.loss.weight = weight
        trainer.training_step(*_batch(i))
    path = tmp_path / "run.tinn"
    trainer.save_checkpoint(path)
    restored = _f16_trainer(tuned, {"otype": "Adam", "learning_rate": 1e-2}, seed=9)
    restored.model.gradient_scaler.growth_interval = 3
    restored.load_checkpoint(path)
    for t in (trainer, restored):
        assert t.step == 4 and t.skipped_steps == 1 and t.gradient_scale == 64.0
        assert t.model.gradient_scaler.finite_in_a_row == 2
    for i in range(4, 7):   # the scale grows at the first of these
        for t in (trainer, restored):
            t.training_step(*_batch(i))
    assert trainer.gradient_scale == restored.gradient_scale == 128.0
    _assert_same_state(_snapshot(trainer), _snapshot(restored))
    for key, value in trainer.gradient_scaling_state().items():
        assert torch.equal(value, restored.gradient_scaling_state()[key]), key


ALL_OPTIMIZERS = [
    ADAM, {"otype": "Adam", "learning_rate": 1e-2, "adabound": True}, {"otype": "SGD", "learning_rate": 1e-2},
    {"otype": "Novograd", "learning_rate": 1e-2}, {"otype": "Shampoo", "learning_rate": 1e-2},
    {"otype": "EMA", "decay": 0.9, "nested": ADAM}, {"otype": "Average", "n_samples": 2, "nested": ADAM},
    {"otype": "Lookahead", "alpha": 0.5, "n_steps": 2, "nested": ADAM},
    {"otype": "ExponentialDecay", "decay_start": 1, "decay_interval": 2, "decay_base": 0.5,
     "nested": {"otype": "SGD", "learning_rate": 1e-2}},
    {"otype": "Batched", "batch_size_multiplier": 2, "nested": ADAM},
    {"otype": "Composite", "nested": [dict(ADAM, params="encoding"), {"otype": "Novograd", "params": "network"}]},
]


@pytest.mark.parametrize("config", ALL_OPTIMIZERS,
                         ids=[f"{c['otype']}{'-adabound' if c.get('adabound') else ''}" for c in ALL_OPTIMIZERS])
def test_a_device_flag_steps_exactly_as_the_host_decides(config):
    """Every optimizer, given the same gradients: steps with a device skip flag (0, 1, 0, 0, 0) end bit-identical
    to steps taken on the host with the flagged one left out, state dict included; a flag of 1 changes
    nothing."""
    from tinn.optimizers import create_optimizer

    def params():
        net = torch.nn.Parameter(torch.linspace(-1, 1, 3 * 12, device=DEV).view(3, 12))
        net.tinn_layer_shapes = [(3, 4)]
        return [("network.params", net),
                ("encoding.params", torch.nn.Parameter(torch.linspace(0.5, -0.5, 10, device=DEV).view(2, 5)))]

    host_params, device_params = params(), params()
    host, device = create_optimizer(config, host_params), create_optimizer(config, device_params)
    gen = torch.Generator().manual_seed(7)
    grads = [[torch.randn(p.shape, generator=gen).to(DEV) for _, p in host_params] for _ in range(5)]
    flags = [0, 1, 0, 0, 0]
    for step_grads, flag in zip(grads, flags):
        before = [p.detach().clone() for _, p in device_params], device.state_dict()
        for (_, p), g in zip(device_params, step_grads):
            p.grad = g.clone()
        device.step(skip=torch.full((1,), flag, dtype=torch.int32, device=DEV))
        if flag:
            _assert_same_state(([p.detach() for _, p in device_params], device.state_dict()), before)
            continue
        for (_, p), g in zip(host_params, step_grads):
            p.grad = g.clone()
        host.step()
        for (_, a), (_, b) in zip(host_params, device_params):
            assert torch.equal(a, b)
        _assert_same_state(([], host.state_dict()), ([], device.state_dict()))
    assert device.step_count == host.step_count == 4


def test_checkpoints_move_between_precisions(tuned, tmp_path):
    """A checkpoint keeps no precision: one saved in float16 (with its scaling state) loads into a float32 trainer,
    which has nothing to scale, and one saved in float32 loads into a float16 trainer, whose scaler starts
    afresh."""
    f16 = _f16_trainer(tuned, ADAM)
    f16.loss.weight = 1e5
    f16.training_step(*_batch(0))
    assert f16.skipped_steps == 1 and f16.gradient_scale == 64.0
    f16.save_checkpoint(tmp_path / "f16.tinn")
    tuned(precision="float32")
    f32 = Trainer(NetworkArray(2, 1, NET, seed=8), _WeightedL2(), ADAM)
    f32.load_checkpoint(tmp_path / "f16.tinn")
    assert f32.step == 1 and f32.skipped_steps == 0 and f32.gradient_scale is None
    assert torch.equal(f32.model.params, f16.model.params)
    f32.training_step(*_batch(1))
    f32.save_checkpoint(tmp_path / "f32.tinn")
    f16.load_checkpoint(tmp_path / "f32.tinn")
    assert f16.step == 2 and f16.skipped_steps == 0 and f16.gradient_scale == 128.0
    assert torch.equal(f16.model.params, f32.model.params)


def test_a_float16_array_on_the_tensor_cores_skips_an_overflow(tuned):
    """An array on the tensor-core kernels (Triton's interpreter on the CPU, at a toy size) in float16: its
    backward reads the scaler's device scale, its gradients match float32's within float16's accuracy, and a
    step whose gradients overflow leaves parameters and Adam's state bit-identical while the scale halves."""
    net_config = dict(NET, n_neurons=16, n_hidden_layers=1)
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(48, 2, generator=gen).to(DEV)
    y = torch.rand(48, 1, generator=gen).to(DEV)
    ids = torch.randint(0, 3, (48,), generator=gen, dtype=torch.int32).to(DEV)
    grads = {}
    for precision in ("float32", "float16"):
        tuned(precision=precision, kernels="tensor_cores", gradient_scaling="dynamic")
        net = NetworkArray(2, 1, net_config, n_networks=3, seed=4)
        assert net.tensor_cores is not None and net.precision == precision
        trainer = Trainer(net, _WeightedL2(), ADAM)
        trainer.training_step(x, y, ids, run_optimizer=False)
        grads[precision] = net.params.grad.clone()
    err = float((grads["float16"] - grads["float32"]).norm() / grads["float32"].norm())
    assert err < 2e-2, err
    assert trainer.gradient_scale == 128.0 and trainer.model.gradient_scaler.finite_in_a_row == 0
    trainer.training_step(x, y, ids)
    before = _snapshot(trainer)
    trainer.loss.weight = 1e6
    trainer.training_step(x, y, ids)
    assert trainer.skipped_steps == 1 and trainer.gradient_scale == 64.0
    _assert_same_state(_snapshot(trainer), before)
    trainer.loss.weight = 1.0
    trainer.training_step(x, y, ids)
    assert not torch.equal(trainer.model.params, before[0]) and trainer.optimizer.step_count == 2


@pytest.mark.parametrize("path", ["tensor_cores", "dense"])  # an array on the tensor cores; one network's GEMMs
@pytest.mark.parametrize("lifted", [True, False])
def test_a_large_batch_means_small_output_gradients_survive_float16(tuned, monkeypatch, lifted, path):
    """A mean loss over 2^18 samples gives each sample an output gradient of about 2 |error| / 2^18, and less where
    the loss reaches the network through small factors: a radiance field's density in empty space, nearly fitted,
    got 1e-11 to 1e-10 per element. Times the scale (128) they round to zero in float16, and so do the input and
    weight gradients they carry; lifted to a unit size first (`lift_small`), they come out within float16's
    accuracy of float32's (tensor-core kernels under Triton's interpreter on the CPU, and a single network's
    dense GEMMs)."""
    from tinn import gradient_scaling

    if not lifted:  # the failure the lift avoids
        monkeypatch.setattr(gradient_scaling, "lift_small", lambda dy: (dy, None))
    net_config = dict(NET, n_neurons=16, n_hidden_layers=1)
    n_networks = 3 if path == "tensor_cores" else 1
    gen = torch.Generator().manual_seed(8)
    x = torch.rand(64, 2, generator=gen).to(DEV)
    ids = torch.randint(0, n_networks, (64,), generator=gen, dtype=torch.int32).to(DEV)
    dy = (torch.randn(64, 1, generator=gen) * 1e-10).to(DEV)
    out = {}
    for precision in ("float32", "float16"):
        dense = path == "dense"
        tuned(precision=precision, kernels="auto" if dense else "tensor_cores", gradient_scaling="dynamic",
              dense_single_network=True if dense else None, dense_step_graphs=False)
        net = NetworkArray(2, 1, net_config, n_networks=n_networks, seed=4)
        assert net.path == path and net.precision == precision
        _, ctx = net.forward_with_context(x, ids, train=True)
        dx, (grad,) = net.backward(ctx, dy, need_dx=True)
        out[precision] = (dx, grad)
    (dx32, g32), (dx16, g16) = out["float32"], out["float16"]
    dx_err = float((dx16 - dx32).norm() / dx32.norm())
    grad_err = float((g16 - g32).norm() / g32.norm())
    lost = float(((dx16 == 0) & (dx32 != 0)).float().mean())
    if lifted:
        assert dx_err < 2e-3 and grad_err < 2e-3 and lost == 0.0, (dx_err, grad_err, lost)
        assert net.gradient_scaler.value == 128.0  # the scale itself is untouched
    else:
        assert dx_err > 0.5 and lost > 0.5, (dx_err, grad_err, lost)


@pytest.mark.parametrize("hidden_layers", [1, 4])  # the backward that recomputes the forward; the layer-by-layer one
@pytest.mark.parametrize("lifted", [True, False])
def test_a_mean_over_many_elements_keeps_its_gradients_with_the_loss_inside_float16(tuned, monkeypatch, lifted,
                                                                                    hidden_layers):
    """The backward that takes a tinn loss's gradient itself: a mean over 2^32 elements (`mean_over` stands in for
    a large batch) gives each element 2 |error| / 2^32, about 1e-10, which times the scale (128) rounds to zero in
    float16. With the scale lifted by the mean's power of two (`mean_lift`) the gradients come out within float16's
    accuracy of float32's, through `backward_from_loss` after a forward and `gradients_from_loss` without one."""
    from tinn import gradient_scaling
    from tinn.losses import Loss

    if not lifted:  # the failure the lift avoids
        monkeypatch.setattr(gradient_scaling, "mean_lift", lambda count: 1.0)
    net_config = dict(NET, n_neurons=16, n_hidden_layers=hidden_layers)
    gen = torch.Generator().manual_seed(9)
    x = torch.rand(64, 2, generator=gen).to(DEV)
    ids = torch.randint(0, 3, (64,), generator=gen, dtype=torch.int32).to(DEV)
    t = torch.rand(64, 1, generator=gen).to(DEV)
    loss = Loss("L2", mean_over=2 ** 32)
    out = {}
    for precision in ("float32", "float16"):
        tuned(precision=precision, kernels="tensor_cores", gradient_scaling="dynamic")
        net = NetworkArray(2, 1, net_config, n_networks=3, seed=4)
        assert net.tensor_cores is not None and net.fuses_loss(need_dx=True)
        y, ctx = net.forward_with_context(x, ids, train=True)
        assert ctx.saved[0].recompute == (hidden_layers == 1)
        dx, (grad,), value = net.backward_from_loss(ctx, y, loss, t, need_dx=True)
        out[precision] = [dx, grad, value]
        if hidden_layers == 1:
            dx, (grad,), _ = net.gradients_from_loss(x, ids, loss, t, need_dx=True)
            out[precision] += [dx, grad]
    for p16, p32 in zip(out["float16"], out["float32"]):
        err = float((p16 - p32).norm() / p32.norm())
        if lifted:
            assert err < 5e-3, err
        elif p32.numel() > 1:  # (the loss value itself is a float32 sum either way)
            assert err > 0.2, err
    if lifted:
        assert net.gradient_scaler.value == 128.0 and net.gradient_scaler.finite_in_a_row == 0


def test_the_mean_lift_needs_the_dynamic_scaler(tuned):
    """`mean_lift` is the largest power of two within the count; a float16 array applies it only with the dynamic
    scaler, which can skip a step that the lifted (summed-size) gradients overflow. The static scale keeps tcnn's
    128 on the mean, and other precisions take no lift."""
    from tinn.gradient_scaling import mean_lift

    assert [mean_lift(c) for c in (1, 2, 3, 1000, 2 ** 22, 2 ** 22 + 1, 0)] == [1, 2, 2, 512, 2 ** 22, 2 ** 22, 1]
    target = torch.zeros(3000, 1, device=DEV)
    for precision, mode, want in (("float16", "dynamic", 2048.0), ("float16", "static", 1.0),
                                  ("bfloat16", "dynamic", 1.0), ("float32", "dynamic", 1.0)):
        tuned(precision=precision, kernels="tensor_cores", gradient_scaling=mode)
        net = NetworkArray(2, 1, dict(NET, n_neurons=16, n_hidden_layers=1), n_networks=3, seed=4)
        assert net._mean_lift(None, target) == want, (precision, mode)
        assert net._mean_lift(2 ** 30, target) == (2.0 ** 30 if want > 1 else 1.0)


def test_lift_small_is_an_exact_power_of_two():
    from tinn.gradient_scaling import lift_small

    for amax, want in ((3e-9, 2.0 ** 29), (1e-30, 2.0 ** 100), (0.75, 2.0), (1.0, 1.0), (5.0, 1.0), (0.0, 2.0)):
        dy = torch.tensor([[amax, -amax / 3]], device=DEV)
        lifted, unlift = lift_small(dy)
        assert torch.equal(lifted * unlift, dy)  # exact both ways
        assert float(1 / unlift) == want, (amax, float(1 / unlift))
        assert amax == 0.0 or 1.0 <= float(lifted.abs().max()) < 2.0 or amax > 2.0
    empty, none = lift_small(torch.zeros(0, 1, device=DEV))
    assert none is None and empty.numel() == 0


def test_unscale_by_divides_the_lift_out_and_records_an_overflow():
    scaler = GradientScaler(DEV)
    grad = torch.tensor([3.0, -0.5], device=DEV)
    scaler.unscale_by(grad, torch.tensor(0.25, device=DEV))
    assert grad.tolist() == [0.75, -0.125] and float(scaler.found_inf) == 0.0
    grad = torch.tensor([1.0, float("inf")], device=DEV)
    scaler.unscale_by(grad, torch.tensor(0.25, device=DEV))
    assert float(scaler.found_inf) == 1.0
