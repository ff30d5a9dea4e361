"""The part contract (tinn/part.py): the Trainer drives it directly and gets what torch autograd gets,
one autograd Function drives it for torch users, layouts are handed over by declaration, and second
derivatives either match float64 torch or raise SecondOrderError."""
import threading

import pytest
import torch

import tinn
import tinn.torch as tcnn
from tinn.encodings import create_encoding
from tinn.models import NetworkWithInputEncoding
from tinn.networks import NetworkArray
from tinn.part import FEATURE_MAJOR, SAMPLE_MAJOR, Part, common_layout
from tinn.trainer import Trainer


@pytest.fixture(autouse=True)
def float32_networks(tuned):
    """These tests hold float32 kernels to float64 at float32's accuracy: arrays compute in float32 here, whatever
    precision the process's settings name (TINN_SETTINGS)."""
    tuned(precision="float32")


GRID = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 10,
        "base_resolution": 4, "per_level_scale": 2.0}
NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "ReLU"}
COMPOSITE = {"otype": "Composite", "nested": [{**GRID, "n_dims_to_encode": 2, "otype": "DenseGrid"},
                                              {"otype": "Frequency", "n_frequencies": 2}]}


def make(kind, n_networks=1):
    if kind == "grid":
        return NetworkWithInputEncoding(2, 3, GRID, NET, n_networks=n_networks, seed=4)
    if kind == "shared_grid":
        return NetworkWithInputEncoding(2, 3, GRID, NET, n_networks=n_networks, seed=4, share_encoding=True)
    if kind == "frequency":
        return NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 3}, NET,
                                        n_networks=n_networks, seed=4)
    if kind == "composite":
        return NetworkWithInputEncoding(3, 3, COMPOSITE, NET, n_networks=n_networks, seed=4)
    if kind == "tcnn_grid":
        return tcnn.NetworkWithInputEncoding(2, 3, GRID, NET, seed=4, n_networks=n_networks)
    if kind == "network":
        return NetworkArray(2, 3, NET, n_networks=n_networks, seed=4)
    raise ValueError(kind)


def same(a, b, name):
    """Bit-identical on the CPU in deterministic mode, where every sum has a fixed order (the tests that call this
    turn it on); otherwise float atomics sum in no fixed order (CUDA, or the CPU's threads racing), so within 1e-5
    of the largest element."""
    if tinn.runtime.arch() == "cpu" and tinn.runtime.settings().deterministic:
        assert torch.equal(a, b), name
    else:
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), name


def batch(model, n_networks, step, size=600):
    gen = torch.Generator().manual_seed(100 + step)
    dev = tinn.runtime.device()
    x = torch.rand(size, model.n_input_dims, generator=gen).to(dev)
    t = torch.rand(size, 3, generator=gen).to(dev)
    ids = torch.randint(0, n_networks, (size,), generator=gen, dtype=torch.int32).to(dev)
    return x, t, (ids if n_networks > 1 else None)


def train(model, contract: bool, steps=3, n_networks=1, run_optimizer=True, monkeypatch=None):
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    if not contract:
        monkeypatch.setattr(trainer, "_uses_contract", lambda batch: False)
    losses = [float(trainer.training_step(*batch(model, n_networks, 0), run_optimizer=run_optimizer))
              for _ in range(steps)]
    return trainer, losses


@pytest.mark.parametrize("kind,n_networks", [("grid", 1), ("grid", 4), ("shared_grid", 4), ("frequency", 1),
                                             ("frequency", 8), ("composite", 3), ("tcnn_grid", 1), ("network", 1),
                                             ("network", 5)])
def test_trainer_contract_step_equals_autograd(kind, n_networks, monkeypatch, tuned):
    tuned(deterministic=True)
    cpu = tinn.runtime.arch() == "cpu"
    steps = 3 if cpu else 1
    model = make(kind, n_networks)
    contract, contract_losses = train(model, True, steps, n_networks, run_optimizer=cpu)
    assert contract._uses_contract(10)
    graph, graph_losses = train(make(kind, n_networks), False, steps, n_networks, run_optimizer=cpu,
                                monkeypatch=monkeypatch)
    if cpu:
        assert contract_losses == graph_losses
        assert contract_losses[-1] < contract_losses[0]
    else:
        assert abs(contract_losses[0] - graph_losses[0]) <= 1e-6 * graph_losses[0]
    for (name, p), (_, q) in zip(contract.model.named_parameters(), graph.model.named_parameters()):
        same(p, q, name)
        same(p.grad, q.grad, name)


def _float64_reference(model, x, ids, t):
    """RelativeL2 of the model's function re-implemented in float64 torch (grid lookup, MLP; the denominator a
    constant in the gradient, as tcnn's): (loss, dL/dx, dL/d each table)."""
    from reference import mlp_array
    from test_encodings_grid import ref_grid

    x64 = x.double().requires_grad_(True)
    tables = [tb.detach().double().requires_grad_(True) for tb in model.parameter_tables()]
    net = getattr(model, "network", model)
    if net is model:
        h = x64
    else:
        h = ref_grid(model.encoding, x64, tables[0], ids if model.encoding.n_networks > 1 else ids * 0)
    y = mlp_array(net, tables[-1], h, ids, "ReLU", "None")
    loss = ((y - t.double()) ** 2 / (y.detach() ** 2 + 0.01)).mean()
    loss.backward()
    return loss.detach(), x64.grad, [tb.grad for tb in tables]


@pytest.mark.parametrize("kind", ["grid", "network"])
def test_backward_from_loss_matches_a_float64_reference(kind):
    """The contract's loss-seeded backward (what the Trainer calls where a part fuses the loss) and the loss
    kernel's gradient handed to `backward` both give the float64 reference's loss value and gradients."""
    model = make(kind, 3)
    x, t, ids = batch(model, 3, 0)
    ids = ids.int()
    loss = tinn.losses.create_loss({"otype": "RelativeL2"})
    ref_value, ref_dx, ref_grads = _float64_reference(model, x, ids, t)
    y, ctx = model.forward_with_context(x, ids, train=True)
    dx, grads, value = model.backward_from_loss(ctx, y, loss, t, need_dx=True)
    y2, ctx2 = model.forward_with_context(x, ids, train=True)
    result = loss.evaluate(y2, t)
    dx2, grads2 = model.backward(ctx2, result.grad, need_dx=True)
    for got_value, got_dx, got_grads in ((value, dx, grads), (result.value, dx2, grads2)):
        assert float(got_value) == pytest.approx(float(ref_value), rel=1e-5)
        torch.testing.assert_close(got_dx.double(), ref_dx, rtol=1e-3, atol=1e-4 * float(ref_dx.abs().max()))
        assert len(got_grads) == len(ref_grads)
        for g, r in zip(got_grads, ref_grads):
            torch.testing.assert_close(g.double(), r, rtol=1e-3, atol=1e-4 * float(r.abs().max()))
    with pytest.raises(tinn.InputError, match="target"):
        model.backward_from_loss(ctx, y, loss, t[:, :2], need_dx=False)


def test_trainer_seeds_the_backward_with_the_loss_where_the_model_fuses_it(monkeypatch, tuned):
    """Where `fuses_loss()` (the fused MLP on CUDA) the Trainer hands the loss to the backward; its losses and
    gradients are those of the loss-then-gradient step (here on whatever path the machine runs)."""
    from tinn.networks import NetworkArray
    tuned(deterministic=True)
    calls = []
    real = NetworkArray.backward_from_loss  # where the composition's gradients_from_loss hands the loss on to
    monkeypatch.setattr(NetworkWithInputEncoding, "fuses_loss", lambda self, need_dx=False: True)
    monkeypatch.setattr(NetworkArray, "backward_from_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    # On CUDA the float atomics' order differs run to run and Adam's normalisation magnifies it: one step,
    # gradients compared without the optimizer (as test_trainer_contract_step_equals_autograd does)
    cpu = tinn.runtime.arch() == "cpu"
    steps = 2 if cpu else 1
    seeded, seeded_losses = train(make("grid", 2), True, steps=steps, n_networks=2, run_optimizer=cpu)
    assert len(calls) == steps
    monkeypatch.setattr(NetworkWithInputEncoding, "fuses_loss", lambda self, need_dx=False: False)
    plain, plain_losses = train(make("grid", 2), True, steps=steps, n_networks=2, run_optimizer=cpu)
    assert len(calls) == steps
    for a, b in zip(seeded_losses, plain_losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    for (name, p), (_, q) in zip(seeded.model.named_parameters(), plain.model.named_parameters()):
        same(p, q, name)
        same(p.grad, q.grad, name)


def test_which_networks_fuse_the_loss(tuned):
    """tuning.fused_loss: None = arrays of several networks on the fused kernels whose input gradient is not
    needed (measured faster there, H100; slower on the image step: one network, its grid needing the input
    gradient); True / False force it where the fused kernels run."""
    one, many = make("network", 1), make("network", 4)
    grid, frozen = make("grid", 4), make("grid", 4)
    frozen.encoding.params.requires_grad_(False)
    for net in (one, many, grid.network, frozen.network):
        net.fused = True  # (the fused kernels are CUDA's; only the rule is checked here)
    assert (one.fuses_loss(), many.fuses_loss(), many.fuses_loss(need_dx=True)) == (False, True, False)
    assert not grid.fuses_loss() and frozen.fuses_loss()  # a trained grid needs the network's input gradient
    tuned(fused_loss=True)
    assert one.fuses_loss() and many.fuses_loss(need_dx=True) and grid.fuses_loss()
    tuned(fused_loss=False)
    assert not one.fuses_loss() and not many.fuses_loss()
    many.fused = False
    tuned(fused_loss=True)
    assert not many.fuses_loss()  # the unfused kernels have no loss inside


def test_contract_path_really_runs_without_autograd(monkeypatch):
    """The contract step builds no autograd graph: the generic Function is never applied."""
    from tinn import part
    model = make("grid", 3)
    monkeypatch.setattr(part._PartFunction, "apply", lambda *a: pytest.fail("autograd Function used"))
    trainer, losses = train(model, True, steps=2, n_networks=3)
    assert model.encoding.params.grad is not None and model.network.params.grad is not None


def test_frozen_grid_is_left_alone():
    model = make("grid")
    model.encoding.params.requires_grad_(False)
    before = model.encoding.params.detach().clone()
    trainer, _ = train(model, True)
    assert model.encoding.params.grad is None and torch.equal(model.encoding.params, before)
    assert not torch.equal(model.network.params, make("grid").network.params)


def test_hooks_and_own_forwards_take_the_autograd_path():
    model = make("grid")
    seen = []
    model.network.register_forward_hook(lambda *a: seen.append("forward"))
    model.encoding.params.register_hook(lambda g: seen.append("grad") or g)
    trainer, _ = train(model, True, steps=2)
    assert not trainer._uses_contract(10)
    assert seen.count("forward") == 2 and seen.count("grad") == 2

    class Custom(NetworkWithInputEncoding):
        def forward(self, x, net_ids=None):
            return super().forward(x * 0.5, net_ids)

    custom = Custom(2, 3, GRID, NET)
    assert not Custom.direct_training and not Trainer(custom)._uses_contract(10)
    assert Trainer(make("tcnn_grid"))._uses_contract(10)  # tcnn's names only adapt constructors
    assert not Trainer(torch.nn.Linear(2, 3).to(tinn.runtime.device()))._uses_contract(10)


def test_replaced_submodules_are_followed():
    """The contract reads the model's parts at every call: a swapped-in network is the one trained."""
    model = make("grid")
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "SGD", "learning_rate": 1.0})
    model.network = NetworkArray(model.encoding.n_output_dims, 3, NET, seed=9)
    before = model.network.params.detach().clone()
    trainer.optimizer = tinn.optimizers.create_optimizer({"otype": "SGD", "learning_rate": 1.0},
                                                         list(model.named_parameters()))
    trainer.training_step(*batch(model, 1, 0))
    assert not torch.equal(model.network.params, before)


def test_callable_loss_is_differentiated():
    """Any callable loss(pred, target) works on the contract path: same step as the tinn L2 loss."""
    a, b = make("grid", 2), make("grid", 2)
    ta = Trainer(a, {"otype": "L2"}, {"otype": "SGD", "learning_rate": 0.5})
    tb = Trainer(b, lambda p, t: ((p - t) ** 2).mean(), {"otype": "SGD", "learning_rate": 0.5})
    data = batch(a, 2, 1)
    la, lb = float(ta.training_step(*data)), float(tb.training_step(*data))
    assert abs(la - lb) <= 1e-6 * la
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-7)


def test_trainer_reset_restores_the_start():
    model = make("grid", 2)
    fresh = make("grid", 2)
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    for step in range(3):
        trainer.training_step(*batch(model, 2, step))
    assert trainer.step == 3 and not torch.equal(model.network.params, fresh.network.params)
    trainer.reset()
    assert trainer.step == 0
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(p, q)
    # The same first step as a fresh trainer: optimizer moments were reset too.
    other = Trainer(fresh, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    assert float(trainer.training_step(*batch(model, 2, 0))) == float(other.training_step(*batch(model, 2, 0)))
    if tinn.runtime.arch() == "cpu":  # (CUDA's float atomics sum gradients in no fixed order; Adam magnifies it)
        for p, q in zip(model.parameters(), fresh.parameters()):
            assert torch.equal(p, q)


def test_optimize_with_decay_schedule():
    """Trainer.optimize steps an objective; the scenes' exponential decay is the optimizer's wrapper."""
    from tinn.scenes.training.photometric import decaying_adam
    net = NetworkArray(2, 1, NET, seed=3)
    x = torch.rand(64, 2, device=tinn.runtime.device())
    trainer = Trainer(net, None, decaying_adam(0.1, total_steps=4, final_lr_factor=0.01))
    rates = []
    for _ in range(6):
        trainer.optimize(lambda: net(x).square().mean())
        rates.append(trainer.learning_rate)
    expected = [0.1 * 0.01 ** (min(k, 4) / 4) for k in range(6)]  # the rate step k + 1 used
    assert rates == pytest.approx(expected, rel=1e-6)
    with pytest.raises(tinn.InputError, match="0-d loss"):
        trainer.optimize(lambda: net(x))


class _BackwardProbe(torch.autograd.Function):
    """Identity whose backward records where it ran: the thread, and torch's thread-local switch for
    multithreaded backward passes as that thread sees it."""
    seen: list = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _BackwardProbe.seen.append((threading.get_ident(), torch._C._is_multithreading_enabled()))
        return g


@pytest.mark.parametrize("calling_thread", [True, False])
def test_trainer_backward_runs_where_the_settings_say(tuned, calling_thread):
    """The Trainer's own autograd passes (an objective; a model outside the contract) run on the calling
    thread by default (settings.autograd_calling_thread), and on torch's default worker otherwise; the
    step's result is the same either way."""
    tuned(autograd_calling_thread=calling_thread)
    dev = tinn.runtime.device()
    net = NetworkArray(2, 1, NET, seed=3)
    x = torch.rand(64, 2, device=dev)
    trainer = Trainer(net, None, {"otype": "SGD", "learning_rate": 0.1})
    _BackwardProbe.seen = []
    loss = trainer.optimize(lambda: _BackwardProbe.apply(net(x)).square().mean())
    (thread, multithreaded), = _BackwardProbe.seen
    assert multithreaded is not calling_thread
    if calling_thread or dev.type == "cpu":  # torch runs a CPU backward on the calling thread anyway
        assert thread == threading.get_ident()
    else:
        assert thread != threading.get_ident()  # torch's device thread

    class Wrapped(Part):  # a part with its own forward: the Trainer differentiates it with autograd
        def __init__(self):
            super().__init__(2, 1)
            self.net = NetworkArray(2, 1, NET, seed=3)

        def forward(self, x, net_ids=None):
            return _BackwardProbe.apply(self.net(x))

    wrapped = Wrapped()
    _BackwardProbe.seen = []
    Trainer(wrapped, {"otype": "L2"}, {"otype": "SGD", "learning_rate": 0.1}).training_step(x, torch.zeros(64, 1, device=dev))
    (_, multithreaded), = _BackwardProbe.seen
    assert multithreaded is not calling_thread
    # Same arithmetic on either thread: one SGD step from the same start.
    reference = NetworkArray(2, 1, NET, seed=3)
    ref_loss = reference(x).square().mean()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach())
    torch.testing.assert_close(net.params.detach(), (reference.params - 0.1 * reference.params.grad).detach(),
                               rtol=1e-5, atol=1e-6)


# ---- layouts ---------------------------------------------------------------------------------------
def test_layout_handover_is_declared():
    grid = create_encoding(2, GRID)
    freq = create_encoding(2, {"otype": "Frequency", "n_frequencies": 2})
    net = NetworkArray(grid.n_output_dims, 3, NET)
    assert grid.output_layouts[0] == FEATURE_MAJOR and freq.output_layouts == (SAMPLE_MAJOR,)
    assert net.fused or net.dense  # the fused kernels (CUDA) and the dense path (CPU) read features as a grid
    assert common_layout(grid, net) == FEATURE_MAJOR  # writes them
    assert common_layout(freq, net) == SAMPLE_MAJOR
    unfused = NetworkArray(grid.n_output_dims, 3, NET, kernels="unfused")
    assert common_layout(grid, unfused) == SAMPLE_MAJOR


def test_grid_writes_both_layouts_and_reads_gradients_in_them():
    grid = create_encoding(2, GRID, n_networks=3)
    x = torch.rand(50, 2, device=tinn.runtime.device())
    ids = torch.randint(0, 3, (50,), dtype=torch.int32, device=x.device)
    y_sm, ctx_sm = grid.forward_with_context(x, ids, train=True, y_layout=SAMPLE_MAJOR)
    y_fm, ctx_fm = grid.forward_with_context(x, ids, train=True, y_layout=FEATURE_MAJOR)
    assert torch.equal(y_sm, y_fm.t())
    dy = torch.randn_like(y_sm)
    dx1, (g1,) = grid.backward(ctx_sm, dy, need_dx=True)
    dx2, (g2,) = grid.backward(ctx_fm, dy.t().contiguous(), need_dx=True)
    assert torch.allclose(dx1, dx2, atol=1e-6) and torch.allclose(g1, g2, atol=1e-6)


# ---- second order ---------------------------------------------------------------------------------
def _frequency64(v, n):
    k = torch.arange(n, dtype=torch.float64, device=v.device)
    a = (2.0 ** k)[None, None, :] * torch.pi * v[:, :, None]
    # tcnn's order per input dim: sin and cos of each frequency in turn
    return torch.stack([torch.sin(a), torch.cos(a)], -1).reshape(v.shape[0], -1)


@pytest.mark.parametrize("reduction", ["Concatenation", "Sum", "Product"])
def test_parameter_free_composite_second_order_matches_float64(reduction):
    nested = [{"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 2},
              {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 2}]
    enc = create_encoding(4, {"otype": "Composite", "reduction": reduction, "nested": nested})
    x = torch.rand(30, 4, device=tinn.runtime.device(), requires_grad=True)
    w = torch.randn(30, enc.n_output_dims, device=x.device)
    (g,) = torch.autograd.grad((enc(x) * w).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.square().sum(), x)

    xd = x.detach().double().requires_grad_()
    a, b = _frequency64(xd[:, :2], 2), _frequency64(xd[:, 2:], 2)
    y = {"Concatenation": lambda: torch.cat([a, b], 1), "Sum": lambda: a + b, "Product": lambda: a * b}[reduction]()
    assert torch.allclose(enc(x.detach()).double(), y.detach(), atol=1e-5)
    (gd,) = torch.autograd.grad((y * w.double()).sum(), xd, create_graph=True)
    (hd,) = torch.autograd.grad(gd.square().sum(), xd)
    assert torch.allclose(g.double(), gd, rtol=1e-4, atol=1e-4)
    assert torch.allclose(h.double(), hd, rtol=1e-3, atol=1e-3 * float(hd.abs().max()))


# ---- checked path ---------------------------------------------------------------------------------
def test_forward_checks_finite_inputs_and_full_ids():
    net = NetworkArray(2, 1, NET, n_networks=4)
    x = torch.rand(5, 2, device=tinn.runtime.device())
    with pytest.raises(tinn.InputError, match="NaN or Inf"):
        net(torch.where(torch.arange(5, device=x.device)[:, None] == 2, float("nan"), x),
            torch.zeros(5, dtype=torch.int32, device=x.device))
    with pytest.raises(tinn.InputError, match=str(2**32 + 1)):
        net(x, torch.full((5,), 2**32 + 1, dtype=torch.int64, device=x.device))
    with pytest.raises(tinn.InputError, match="dtype torch.float64"):
        net.double()(x.double(), torch.zeros(5, dtype=torch.int32, device=x.device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_all_finite_finds_every_nan_and_infinity_wherever_it_is(dtype):
    dev = tinn.runtime.device()
    x = (torch.rand(300, 7, device=dev) * 2e3 - 1e3).to(dtype)
    assert x.dtype == dtype and bool(tinn.checks.all_finite(x))
    assert bool(tinn.checks.all_finite(torch.empty(0, 3, device=dev, dtype=dtype)))
    big = torch.full((4,), float(torch.finfo(dtype).max), device=dev, dtype=dtype)
    assert bool(tinn.checks.all_finite(torch.cat([big, -big])))         # the largest finite values are finite
    for bad in (float("nan"), float("inf"), -float("inf")):
        for where in ((0, 0), (299, 6), (150, 3)):
            y = x.clone()
            y[where] = bad
            assert not bool(tinn.checks.all_finite(y)), (bad, where)
    y = x.clone()
    y[7, 1], y[8, 2] = float("inf"), -float("inf")                      # both ends infinite
    assert not bool(tinn.checks.all_finite(y))


def test_trainer_checks_full_int64_ids():
    trainer = Trainer(NetworkArray(2, 3, NET, n_networks=4))
    x = torch.rand(5, 2, device=tinn.runtime.device())
    with pytest.raises(tinn.InputError, match=str(2**32 + 1)):
        trainer.training_step(x, torch.rand(5, 3, device=x.device),
                              torch.full((5,), 2**32 + 1, dtype=torch.int64, device=x.device))


@pytest.mark.parametrize("otype,cfg,dims", [
    ("Identity", {}, 3), ("Frequency", {"n_frequencies": 2}, 3), ("TriangleWave", {"n_frequencies": 2}, 3),
    ("OneBlob", {"n_bins": 4}, 3), ("SphericalHarmonics", {"degree": 2}, 3), ("HashGrid", GRID, 3),
    ("DenseGrid", {**GRID, "interpolation": "Nearest"}, 2), ("NRC", {}, 8)])
def test_nan_inputs_propagate_like_torch_when_checks_are_off(otype, cfg, dims):
    """Checked: a NaN input is an error. Unchecked: the NaN row comes out NaN (as torch ops give), and
    only that row."""
    enc = create_encoding(dims, {"otype": otype, **cfg})
    x = torch.rand(4, dims, device=tinn.runtime.device())
    x[1, 0] = float("nan")
    with pytest.raises(tinn.InputError, match="NaN or Inf"):
        enc(x)
    with tinn.checks.disabled():
        y = enc(x)
    assert bool(torch.isnan(y[1]).any()) and not bool(torch.isnan(y[[0, 2, 3]]).any())
    net = NetworkArray(enc.n_output_dims, 2, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1,
                                               "activation": "ReLU"})
    with tinn.checks.disabled():
        out = net(y.detach().contiguous())
    assert bool(torch.isnan(out[1]).all()) and not bool(torch.isnan(out[[0, 2, 3]]).any())


@pytest.mark.parametrize("kind,n_networks,grouped", [("grid", 1, False), ("grid", 2, False), ("grid", 2, True),
                                                     ("shared_grid", 2, False), ("frequency", 2, False)])
def test_gradients_from_loss_equals_the_forward_then_backward_from_loss(kind, n_networks, grouped, tuned):
    """A composition's `gradients_from_loss` (the encoding's forward, the network's own `gradients_from_loss`, the
    encoding's backward) gives the input gradient, every table's gradient and the loss of the training forward
    followed by `backward_from_loss`, whichever layout the encoding hands over, grouped by network or not."""
    from tinn.part import Part
    tuned(deterministic=True, group_by_network=grouped)
    model = make(kind, n_networks)
    x, t, ids = batch(model, n_networks, 0)
    ids = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device) if ids is None else ids.int()
    loss = tinn.losses.create_loss({"otype": "RelativeL2"})
    dx, grads, value = model.gradients_from_loss(x, ids, loss, t, need_dx=True)
    ref_dx, ref_grads, ref_value = Part.gradients_from_loss(model, x, ids, loss, t, need_dx=True)
    same(value, ref_value, "loss")
    same(dx, ref_dx, "dx")
    assert len(grads) == len(ref_grads) == len(model.parameter_tables())
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        same(g, r, f"table {i}")
    no_dx, table_grads, _ = model.gradients_from_loss(x, ids, loss, t, need_dx=False)
    assert no_dx is None
    for i, (g, r) in enumerate(zip(table_grads, grads)):
        same(g, r, f"table {i} without dx")
