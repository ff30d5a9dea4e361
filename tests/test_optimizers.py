"""Optimizers: trajectories against torch.optim / float64 references, nesting, state round trips, errors."""
import math

import numpy as np
import pytest
import torch

from tinn.errors import CheckpointError, ConfigError, InputError
from tinn.optimizers import create_optimizer

N_STEPS = 25


@pytest.fixture(params=["taichi", "triton"])
def adam_kernels(request, tuned, monkeypatch):
    """Adam's two launch paths (`tuning.triton_step_kernels`): Taichi's kernels, and one Triton launch (the CUDA
    default; Triton's interpreter on the CPU). A test on the Triton path must have launched it."""
    launches = []
    if request.param == "triton":
        from tinn.kernels import triton_available
        if not triton_available():
            pytest.skip("Triton is not installed")
        from tinn.kernels import adam_triton
        original = adam_triton.adam_step
        monkeypatch.setattr(adam_triton, "adam_step", lambda tables, hyper: (launches.append(len(tables)),
                                                                              original(tables, hyper)))
    tuned(triton_step_kernels=request.param == "triton")
    yield request.param
    if request.param == "triton":
        assert launches, "the Triton path was never launched"


def make_params(device, shapes=(("network.params", (3, 8)), ("encoding.params", (3, 5))), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(n, torch.nn.Parameter(torch.randn(*s, generator=g).to(device))) for n, s in shapes]


def quad_grads(named, seed=1):
    """Gradient of a fixed convex quadratic + a wiggle: g = A * (w - c) + 0.1 * sin(3w) (deterministic)."""
    g = torch.Generator().manual_seed(seed)
    consts = {n: (torch.rand(p.shape, generator=g) + 0.5, torch.randn(p.shape, generator=g)) for n, p in named}

    def grads(tensors: dict):
        return {n: a.to(w.dtype) * (w - c.to(w.dtype)) + 0.1 * torch.sin(3 * w) for n, w in tensors.items()
                for a, c in [consts[n]]}

    return grads


def run_tinn(opt, named, grad_fn, n_steps=N_STEPS, sparse=None):
    traj = []
    for _ in range(n_steps):
        gs = grad_fn({n: p.detach().cpu() for n, p in named})
        for n, p in named:
            gg = gs[n].float()
            if sparse is not None and n in sparse:
                gg = gg * sparse[n]
            p.grad = gg.to(p.device)
        opt.step()
        traj.append({n: p.detach().cpu().clone() for n, p in named})
    return traj


def test_sgd_matches_torch(device):
    named = make_params(device)
    ref = [torch.nn.Parameter(p.detach().cpu().clone()) for _, p in named]
    opt = create_optimizer({"otype": "SGD", "learning_rate": 0.05, "l2_reg": 1e-3}, named)
    tref = torch.optim.SGD(ref, lr=0.05, weight_decay=1e-3)
    grad_fn = quad_grads(named)
    for _ in range(N_STEPS):
        gs = grad_fn({n: p.detach().cpu() for n, p in named})
        for (n, p), r in zip(named, ref):
            p.grad = gs[n].to(device)
            r.grad = grad_fn({n: r.detach()})[n]
        opt.step()
        tref.step()
    for (n, p), r in zip(named, ref):
        np.testing.assert_allclose(p.detach().cpu().numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert opt.step_count == N_STEPS
    assert not torch.allclose(named[0][1].detach().cpu(), make_params("cpu")[0][1])  # it moved


def test_adam_matches_torch_when_epsilon_is_negligible(device, adam_kernels):
    # Matrix params only (tcnn skips zero grads of non-matrix params; torch does not).
    named = make_params(device, shapes=(("network.params", (4, 6)), ("network.bias", (4,))))
    ref = [torch.nn.Parameter(p.detach().cpu().clone()) for _, p in named]
    cfg = {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-12, "l2_reg": 1e-4}
    opt = create_optimizer(cfg, named)
    tref = torch.optim.Adam(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-12, weight_decay=1e-4)
    grad_fn = quad_grads(named)
    for _ in range(N_STEPS):
        gs = grad_fn({n: p.detach().cpu() for n, p in named})
        rg = grad_fn({n: r.detach() for (n, _), r in zip(named, ref)})
        for (n, p), r in zip(named, ref):
            p.grad = gs[n].to(device)
            r.grad = rg[n]
        opt.step()
        tref.step()
    for (n, p), r in zip(named, ref):
        np.testing.assert_allclose(p.detach().cpu().numpy(), r.detach().numpy(), rtol=1e-4, atol=2e-6)
    moved = (named[0][1].detach().cpu() - make_params("cpu", shapes=(("a", (4, 6)),))[0][1]).abs().max()
    assert moved > 0.1


def adam_reference(w, grads_fn, n_steps, lr, b1=0.9, b2=0.999, eps=1e-8, l2=1e-8, rel=0.0, absd=0.0,
                   adabound=False, clip=0.0, matrix=True, scale=None, sparse=None, nm_l2=0.0, skip_zero=True,
                   grad_clip=0.0):
    """float64 re-implementation of tcnn's Adam (adam.h's adam_step), one tensor (rows, cols)."""
    w = w.double().clone()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    steps = torch.zeros_like(w)
    scale = torch.ones(w.shape[0], 1, dtype=torch.float64) if scale is None else scale.double()[:, None]
    traj = []
    for t in range(1, n_steps + 1):
        g = grads_fn(w)
        if sparse is not None:
            g = g * sparse
        active = torch.ones_like(w, dtype=torch.bool) if matrix or not skip_zero else g != 0
        g = g + (l2 if matrix else nm_l2) * w
        if grad_clip:
            g = g.clamp(-grad_clip, grad_clip)
        m = torch.where(active, b1 * m + (1 - b1) * g, m)
        v = torch.where(active, b2 * v + (1 - b2) * g * g, v)
        steps = steps + active
        st = steps.clamp(min=1)
        lr_t = lr * scale * torch.sqrt(1 - b2 ** st) / (1 - b1 ** st)
        eff = lr_t / (torch.sqrt(v) + eps)
        if adabound:
            eff = eff.clamp(0.1 - 0.1 / ((1 - b2) * t + 1), 0.1 + 0.1 / ((1 - b2) * t))
        nw = (1 - rel * lr_t) * w - torch.sign(w) * absd * lr_t - eff * m
        if clip:
            nw = nw.clamp(-clip, clip)
        w = torch.where(active, nw, w)
        traj.append(w.clone())
    return traj


@pytest.mark.parametrize("variant", [
    dict(eps=1e-3, l2=1e-3),  # epsilon large enough that tcnn's placement differs from torch's
    dict(rel=0.05, absd=1e-3),
    dict(adabound=True, b2=0.99),
    dict(clip=0.3),
])
def test_adam_options_match_float64_reference(variant, device, adam_kernels):
    named = make_params(device, shapes=(("network.params", (3, 7)),), seed=4)
    w0 = named[0][1].detach().cpu().clone()
    cfg = {"otype": "Adam", "learning_rate": 2e-2, "beta1": 0.9, "beta2": variant.get("b2", 0.999),
           "epsilon": variant.get("eps", 1e-8), "l2_reg": variant.get("l2", 1e-8),
           "relative_decay": variant.get("rel", 0.0), "absolute_decay": variant.get("absd", 0.0),
           "adabound": variant.get("adabound", False), "clipping_magnitude": variant.get("clip", 0.0)}
    opt = create_optimizer(cfg, named)
    grad_fn = quad_grads(named, seed=2)
    traj = run_tinn(opt, named, grad_fn)
    ref = adam_reference(w0, lambda w: grad_fn({"network.params": w})["network.params"], N_STEPS, 2e-2,
                         b2=cfg["beta2"], eps=cfg["epsilon"], l2=cfg["l2_reg"], rel=cfg["relative_decay"],
                         absd=cfg["absolute_decay"], adabound=cfg["adabound"], clip=cfg["clipping_magnitude"])
    for step in (0, 9, N_STEPS - 1):
        np.testing.assert_allclose(traj[step]["network.params"].numpy(), ref[step].numpy(), rtol=1e-4, atol=3e-6)


def test_adam_non_matrix_params_skip_zero_gradients_and_per_network_lr_scale(device, adam_kernels):
    named = make_params(device, shapes=(("encoding.params", (4, 6)),), seed=5)
    w0 = named[0][1].detach().cpu().clone()
    sparse = (torch.rand(4, 6, generator=torch.Generator().manual_seed(9)) > 0.4).float()
    scale = torch.tensor([1.0, 0.5, 0.0, 2.0])
    opt = create_optimizer({"otype": "Adam", "learning_rate": 1e-2, "l2_reg": 0.1}, named)
    opt.set_lr_scale("encoding.params", scale.to(device))
    grad_fn = quad_grads(named, seed=3)
    traj = run_tinn(opt, named, grad_fn, sparse={"encoding.params": sparse})
    ref = adam_reference(w0, lambda w: grad_fn({"encoding.params": w})["encoding.params"], N_STEPS, 1e-2,
                         l2=0.1, matrix=False, scale=scale, sparse=sparse)
    np.testing.assert_allclose(traj[-1]["encoding.params"].numpy(), ref[-1].numpy(), rtol=1e-4, atol=3e-6)
    final = traj[-1]["encoding.params"]
    assert torch.equal(final[sparse == 0], w0[sparse == 0])  # untouched entries did not move
    assert torch.equal(final[2], w0[2])  # network 2 has scale 0
    assert (final[3] - w0[3]).abs().max() > 0.05


def test_adam_bias_corrections_past_the_first_table_match_float64(device, adam_kernels, monkeypatch):
    """Both launch paths read the bias correction of a step count from a table the optimizer keeps (every count
    asked so far, in float64 once) that grows by doubling: a run past its first 1024 entries, with per-element
    counts (an encoding table skipping zero gradients, so its counts fall behind) and one shared count (the
    network), against the float64 reference."""
    named = make_params(device, shapes=(("network.params", (2, 3)), ("encoding.params", (2, 4))), seed=6)
    w0 = {n: p.detach().cpu().clone() for n, p in named}
    sparse = {"encoding.params": (torch.rand(2, 4, generator=torch.Generator().manual_seed(2)) > 0.3).float()}
    from tinn.optimizers.adam import Adam
    monkeypatch.setattr(Adam, "FIRST_TABLE", 1024)  # (the default's first table holds 2^17 counts)
    opt = create_optimizer({"otype": "Adam", "learning_rate": 1e-3, "l2_reg": 0.0}, named)
    grad_fn = quad_grads(named, seed=7)
    n_steps = 1100
    traj = run_tinn(opt, named, grad_fn, n_steps=n_steps, sparse=sparse)
    assert opt._corrections.shape[0] == 2048  # grown once, past the first 1024 counts
    for name, matrix in (("network.params", True), ("encoding.params", False)):
        ref = adam_reference(w0[name], lambda w: grad_fn({name: w})[name], n_steps, 1e-3, l2=0.0, matrix=matrix,
                             sparse=sparse.get(name))
        for step in (0, 1023, 1024, n_steps - 1):
            np.testing.assert_allclose(traj[step][name].numpy(), ref[step].numpy(), rtol=1e-4, atol=2e-5,
                                       err_msg=f"{name} at step {step + 1}")


@pytest.mark.parametrize("skip_zero", [True, False])
def test_adam_non_matrix_l2_gradient_clipping_and_zero_grad_skipping(skip_zero, device, adam_kernels):
    """tcnn's non-matrix options: non_matrix_l2_reg (not l2_reg) regularises encoding tables, zero-gradient
    entries move only when skip_zero_grad_non_matrix_params is false, and gradient_clipping_magnitude
    clamps the regularised gradient of both kinds before the moments."""
    named = make_params(device, shapes=(("network.params", (3, 6)), ("encoding.params", (3, 5))), seed=8)
    w0 = {n: p.detach().cpu().clone() for n, p in named}
    sparse = {"encoding.params": (torch.rand(3, 5, generator=torch.Generator().manual_seed(4)) > 0.5).float()}
    cfg = {"otype": "Adam", "learning_rate": 3e-2, "l2_reg": 0.2, "non_matrix_l2_reg": 0.05,
           "gradient_clipping_magnitude": 0.4, "skip_zero_grad_non_matrix_params": skip_zero}
    opt = create_optimizer(cfg, named)
    grad_fn = quad_grads(named, seed=5)
    traj = run_tinn(opt, named, grad_fn, sparse=sparse)
    for name, matrix in (("network.params", True), ("encoding.params", False)):
        ref = adam_reference(w0[name], lambda w: grad_fn({name: w})[name], N_STEPS, 3e-2, l2=0.2, nm_l2=0.05,
                             grad_clip=0.4, matrix=matrix, skip_zero=skip_zero, sparse=sparse.get(name))
        # Distances travelled, not positions. tcnn's bias correction 1 - beta2^t cancels in float32: with
        # beta2 = 0.999 an error of pow(beta2, t) reaches the step size magnified ~1000 / t times, and the
        # fast-math pow of Taichi's CUDA code is less exact near 1 and errs the same way at every step. Where the
        # clipped gradient is constant, nothing pulls the weight back, so those errors add up along the path: a
        # weight that ends near 0 would be held to a bound float32 cannot meet; its path's length is the scale.
        start = w0[name].numpy()
        for step in (0, N_STEPS - 1):
            np.testing.assert_allclose(traj[step][name].numpy() - start, ref[step].numpy() - start, rtol=1e-4,
                                       atol=3e-6)
    untouched = sparse["encoding.params"] == 0
    moved = (traj[-1]["encoding.params"] - w0["encoding.params"])[untouched].abs()
    if skip_zero:
        assert moved.max() == 0
    else:  # zero gradient + non_matrix_l2_reg still decays them
        assert moved.min() > 1e-3
    # The clip binds: the quadratic's gradient at w0 exceeds 0.4 somewhere, so an unclipped run differs.
    assert grad_fn({"network.params": w0["network.params"]})["network.params"].abs().max() > 0.4
    unclipped = adam_reference(w0["network.params"], lambda w: grad_fn({"network.params": w})["network.params"],
                               N_STEPS, 3e-2, l2=0.2)
    assert (unclipped[-1] - traj[-1]["network.params"].double()).abs().max() > 1e-3


def test_wrappers_default_to_a_nested_adam(device):
    # tcnn: a wrapper without "nested" wraps Adam with its defaults.
    from tinn.optimizers.adam import Adam
    for otype in ("EMA", "Average", "Lookahead", "ExponentialDecay", "Batched"):
        opt = create_optimizer({"otype": otype}, make_params(device))
        assert isinstance(opt.nested, Adam), otype
        assert opt.nested.learning_rate == pytest.approx(1e-3) and opt.nested.l2_reg == pytest.approx(1e-8)
    named = make_params(device)
    w0 = named[0][1].detach().cpu().clone()
    opt = create_optimizer({"otype": "EMA", "decay": 0.9}, named)
    grad_fn = quad_grads(named, seed=2)
    traj = run_tinn(opt, named, grad_fn, n_steps=5)
    ref = adam_reference(w0, lambda w: grad_fn({"network.params": w})["network.params"], 5, 1e-3)
    np.testing.assert_allclose(traj[-1]["network.params"].numpy(), ref[-1].numpy(), rtol=1e-5, atol=1e-7)


def test_adam_updates_two_tensors_in_one_launch_like_one_each(device, monkeypatch, adam_kernels):
    """An encoding and a network (the usual model) are updated by one launch: each matches the float64
    reference, and the bits equal those of one launch per tensor."""
    from tinn.kernels import adam_triton
    from tinn.kernels import optimizers as optimizer_kernels
    cfg = {"otype": "Adam", "learning_rate": 1e-2, "l2_reg": 0.1, "relative_decay": 0.05,
           "non_matrix_learning_rate_factor": 0.5}
    sparse = {"encoding.params": (torch.rand(3, 5, generator=torch.Generator().manual_seed(9)) > 0.4).float()}
    runs = []
    for pair in (True, False):
        named = make_params(device, seed=6)
        w0 = {n: p.detach().cpu().clone() for n, p in named}
        opt = create_optimizer(cfg, named)
        launches = []
        if adam_kernels == "triton":  # the launch's table count names it
            monkeypatch.setattr(adam_triton, "adam_step", (lambda k: lambda tables, hyper: (
                launches.append("adam_step_pair" if len(tables) == 2 else "adam_step"), k(tables, hyper)))(
                adam_triton.adam_step))
        else:
            for kernel in ("adam_step", "adam_step_pair"):
                monkeypatch.setattr(optimizer_kernels, kernel, (lambda k, name: lambda *a: (launches.append(name),
                                                                                           k(*a)))(
                    getattr(optimizer_kernels, kernel), kernel))
        if not pair:  # one optimizer per tensor: the single-tensor kernel
            opts = [create_optimizer(cfg, [item]) for item in named]
            opt.step = lambda: [o.step() for o in opts]
        runs.append(run_tinn(opt, named, quad_grads(named, seed=3), sparse=sparse))
        assert set(launches) == {"adam_step_pair" if pair else "adam_step"}
        monkeypatch.undo()
    for name in ("network.params", "encoding.params"):
        assert torch.equal(runs[0][-1][name], runs[1][-1][name])
    grad_fn = quad_grads(make_params(device, seed=6), seed=3)
    for name, matrix in (("network.params", True), ("encoding.params", False)):
        ref = adam_reference(w0[name], lambda w: grad_fn({name: w})[name], N_STEPS, 1e-2 * (1 if matrix else 0.5),
                             l2=0.1, rel=0.05, matrix=matrix, sparse=sparse.get(name))
        np.testing.assert_allclose(runs[0][-1][name].numpy(), ref[-1].numpy(), rtol=1e-4, atol=3e-6)


def test_params_without_grad_are_skipped(device):
    named = make_params(device)
    before = named[1][1].detach().clone()
    opt = create_optimizer({"otype": "Adam", "learning_rate": 0.1}, named)
    named[0][1].grad = torch.ones_like(named[0][1])
    opt.step()
    assert torch.equal(named[1][1].detach(), before)
    assert not torch.equal(named[0][1].detach().cpu(), make_params("cpu")[0][1])
    opt.zero_grad()
    assert all(p.grad is None for _, p in named)


def test_learning_rate_property(device):
    opt = create_optimizer({"otype": "Adam", "learning_rate": 1e-2}, make_params(device))
    assert opt.learning_rate == pytest.approx(1e-2)
    opt.learning_rate = 3e-3
    assert opt.learning_rate == pytest.approx(3e-3)
    with pytest.raises(ConfigError, match="learning_rate"):
        opt.learning_rate = -1.0


def _resume_check(cfg, device, n_first=12, n_second=13, sparse=None):
    """Run n_first + n_second steps straight, and n_first, save, rebuild, load, n_second: bit-identical."""
    named_a = make_params(device)
    opt_a = create_optimizer(cfg, named_a)
    grad_fn = quad_grads(named_a)
    run_tinn(opt_a, named_a, grad_fn, n_first, sparse)
    state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt_a.state_dict().items()}
    weights = [p.detach().clone() for _, p in named_a]
    for k, v in state.items():  # flat and pickle-free
        assert isinstance(k, str) and isinstance(v, (torch.Tensor, int, float, str, bool)), (k, type(v))
    run_tinn(opt_a, named_a, grad_fn, n_second, sparse)

    named_b = make_params(device, seed=123)  # different initial weights: everything must come from the state
    with torch.no_grad():
        for (_, p), w in zip(named_b, weights):
            p.copy_(w)
    opt_b = create_optimizer(cfg, named_b)
    opt_b.load_state_dict(state)
    assert opt_b.step_count == opt_a.step_count - n_second
    run_tinn(opt_b, named_b, grad_fn, n_second, sparse)
    for (_, pa), (_, pb) in zip(named_a, named_b):
        assert torch.equal(pa.detach(), pb.detach())
    for k, v in opt_a.state_dict().items():
        w = opt_b.state_dict()[k]
        assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, k
    return opt_a, opt_b


@pytest.mark.parametrize("cfg", [
    {"otype": "SGD", "learning_rate": 0.05},
    {"otype": "Adam", "learning_rate": 1e-2, "adabound": True},
])
def test_state_dict_round_trip_resumes_bit_exactly(cfg, device):
    sparse = {"encoding.params": (torch.arange(15).reshape(3, 5) % 3 != 0).float()}
    _resume_check(cfg, device, sparse=sparse)


def test_adam_non_finite_gradients_are_not_hidden(device, tuned):
    """Without a gradient scaler nothing skips an inf or NaN gradient: both launch paths carry each into its weight
    (clipping off must not clamp it away; a NaN is not a zero gradient to skip, even in an encoding table that skips
    zeros), as tcnn's Adam does, and they agree on every element."""
    from tinn.kernels import triton_available
    paths = (False, True) if triton_available() else (False,)
    results = []
    for triton in paths:
        tuned(triton_step_kernels=triton)
        named = make_params(device, shapes=(("network.params", (2, 5)), ("encoding.params", (2, 4))), seed=3)
        opt = create_optimizer({"otype": "Adam", "learning_rate": 1e-2}, named)
        bad = {}
        for name, p in named:
            g = torch.linspace(-1.0, 1.0, p.numel()).reshape(p.shape)
            g[0, 1], g[1, 2] = math.inf, math.nan
            bad[name] = ~g.isfinite()
            p.grad = g.to(device)
        opt.step()
        results.append({name: p.detach().cpu() for name, p in named})
        for name, w in results[-1].items():
            assert torch.equal(~w.isfinite(), bad[name]), (triton, name)
    for name in results[0]:
        a, b = results[0][name], results[-1][name]
        finite = a.isfinite()
        torch.testing.assert_close(a[finite], b[finite], rtol=1e-5, atol=1e-7)


def test_adam_resumes_bit_exactly_on_both_launch_paths(device, adam_kernels):
    sparse = {"encoding.params": (torch.arange(15).reshape(3, 5) % 3 != 0).float()}
    _resume_check({"otype": "Adam", "learning_rate": 1e-2, "l2_reg": 1e-3}, device, sparse=sparse)


@pytest.mark.parametrize("cfg, match", [
    ({"otype": "Adamm"}, r"optimizer\.otype='Adamm'.*allowed"),
    ({"otype": "Adam", "learning_rate": -1e-3}, r"optimizer\.learning_rate=-0\.001 is out of range"),
    ({"otype": "SGD", "learning_rate": -1}, r"optimizer\.learning_rate"),
    ({"otype": "Adam", "beta1": 1.5}, r"optimizer\.beta1"),
    ({"otype": "Adam", "learnig_rate": 1e-3}, r"optimizer\.learnig_rate is not an option.*learning_rate"),
])
def test_bad_configs_name_the_key(cfg, match, device):
    with pytest.raises(ConfigError, match=match):
        create_optimizer(cfg, make_params(device))


def test_bad_inputs(device):
    named = make_params(device)
    opt = create_optimizer({"otype": "Adam"}, named)
    with pytest.raises(InputError, match=r"shape \(3,\)"):
        opt.set_lr_scale("network.params", torch.ones(4, device=device))
    with pytest.raises(InputError, match="unknown parameter 'nope'"):
        opt.set_lr_scale("nope", torch.ones(3, device=device))
    with pytest.raises(InputError, match="float32"):
        create_optimizer({"otype": "SGD"}, [("x", torch.nn.Parameter(torch.zeros(3, dtype=torch.float64)))])
    with pytest.raises(CheckpointError, match="missing"):
        opt.load_state_dict({"otype": "Adam"})
    other = create_optimizer({"otype": "SGD"}, named).state_dict()
    with pytest.raises(CheckpointError):
        opt.load_state_dict(other)


# ---- Novograd -----------------------------------------------------------------------------------

def novograd_reference(w, grads_fn, n_steps, lr, segments, b1=0.9, b2=0.999, eps=1e-8, rel=0.0, absd=0.0):
    w = w.double().clone()
    m = torch.zeros_like(w)
    v = torch.zeros(w.shape[0], len(segments), dtype=torch.float64)
    traj = []
    for t in range(n_steps):
        g = grads_fn(w)
        beta1, beta2 = (0.0, 0.0) if t == 0 else (b1, b2)
        for s, (lo, hi) in enumerate(segments):
            v[:, s] = beta2 * v[:, s] + (1 - beta2) * (g[:, lo:hi] ** 2).sum(1)
            m[:, lo:hi] = beta1 * m[:, lo:hi] + (1 - beta1) * g[:, lo:hi] / (v[:, s:s + 1].sqrt() + eps)
        w = (1 - rel * lr) * w - torch.sign(w) * absd * lr - lr * m
        traj.append(w.clone())
    return traj


def test_novograd_matches_float64_reference_per_layer(device):
    named = make_params(device, shapes=(("network.params", (3, 12)), ("encoding.params", (3, 5))), seed=6)
    named[0][1].tinn_layer_shapes = [(2, 3), (3, 2)]  # two 6-weight layers per network row
    w0 = {n: p.detach().cpu().clone() for n, p in named}
    cfg = {"otype": "Novograd", "learning_rate": 1e-2, "beta1": 0.8, "beta2": 0.95, "relative_decay": 0.01,
           "absolute_decay": 1e-4}
    opt = create_optimizer(cfg, named)
    grad_fn = quad_grads(named, seed=8)
    traj = run_tinn(opt, named, grad_fn)
    for name, segs in (("network.params", [(0, 6), (6, 12)]), ("encoding.params", [(0, 5)])):
        ref = novograd_reference(w0[name], lambda w: grad_fn({name: w})[name], N_STEPS, 1e-2, segs, b1=0.8, b2=0.95,
                                 rel=0.01, absd=1e-4)
        np.testing.assert_allclose(traj[-1][name].numpy(), ref[-1].numpy(), rtol=1e-4, atol=3e-6)
    # Per-layer normalisation differs from one norm over the whole row: the layer split matters.
    whole = novograd_reference(w0["network.params"], lambda w: grad_fn({"network.params": w})["network.params"],
                               N_STEPS, 1e-2, [(0, 12)], b1=0.8, b2=0.95, rel=0.01, absd=1e-4)
    assert (whole[-1].float() - traj[-1]["network.params"]).abs().max() > 1e-3


# ---- Shampoo ------------------------------------------------------------------------------------

def _deb(beta, t):
    norm = 1 - beta ** (t + 1)
    return (1 - beta) / norm, beta * (1 - beta ** t) / norm


def _inv4_svd(a, identity):
    a = 0.5 * (a + a.transpose(-1, -2)) * (1 - identity) + identity * torch.eye(a.shape[-1], dtype=a.dtype)
    u, s, _ = torch.linalg.svd(a)  # SPD: singular vectors are eigenvectors
    return u @ torch.diag_embed(s ** -0.25) @ u.transpose(-1, -2)


def shampoo_reference(w, grads_fn, n_steps, lr, shape, b1=0.9, b2=0.99, b3=0.9, bs=0.9, eps=1e-8, identity=0.01,
                      l2=1e-5, interval=None):
    """float64 Shampoo as documented in tinn/optimizers/shampoo.py; shape=(M, N) or None (no matrices)."""
    w = w.double().clone()
    rows = w.shape[0]
    m1, m2, sm = torch.zeros_like(w), torch.zeros_like(w), torch.zeros_like(w)
    if shape:
        M, N = shape
        L, R = torch.zeros(rows, M, M, dtype=torch.float64), torch.zeros(rows, N, N, dtype=torch.float64)
    traj = []
    for t in range(n_steps):
        g = grads_fn(w) + l2 * w
        a, b = _deb(b1, t)
        m1 = b * m1 + a * g
        a, b = _deb(b2, t)
        m2 = b * m2 + a * g * g
        u = m1 / (m2.sqrt() + eps)
        if not shape:
            w = w - lr * u
        else:
            X = u.reshape(rows, M, N)
            a, b = _deb(b3, t)
            L = b * L + a * X @ X.transpose(1, 2)
            R = b * R + a * X.transpose(1, 2) @ X
            step = t + 1
            if step == 1 or step % (interval or (10 if step < 100 else 200)) == 0:
                Lr, Rr = _inv4_svd(L, identity), _inv4_svd(R, identity)
            a, b = _deb(bs, t)
            sm = b * sm + a * (Lr @ X @ Rr).reshape(rows, -1)
            lr_n = lr * u.norm(dim=1, keepdim=True) / sm.norm(dim=1, keepdim=True)
            w = w - lr_n * sm
        traj.append(w.clone())
    return traj


def test_shampoo_matches_float64_reference(device):
    named = make_params(device, shapes=(("network.params", (2, 5, 3)), ("encoding.params", (2, 4))), seed=10)
    w0 = {n: p.detach().cpu().clone() for n, p in named}
    opt = create_optimizer({"otype": "Shampoo", "learning_rate": 2e-2, "root_update_interval": 3}, named)
    grad_fn = quad_grads(named, seed=12)
    traj = run_tinn(opt, named, grad_fn)
    ref = shampoo_reference(w0["network.params"].reshape(2, 15),
                            lambda w: grad_fn({"network.params": w.reshape(2, 5, 3)})["network.params"].reshape(2, 15),
                            N_STEPS, 2e-2, (5, 3), interval=3)
    np.testing.assert_allclose(traj[-1]["network.params"].reshape(2, 15).numpy(), ref[-1].numpy(),
                               rtol=1e-3, atol=1e-5)
    ref_enc = shampoo_reference(w0["encoding.params"], lambda w: grad_fn({"encoding.params": w})["encoding.params"],
                                N_STEPS, 2e-2, None)
    np.testing.assert_allclose(traj[-1]["encoding.params"].numpy(), ref_enc[-1].numpy(), rtol=1e-4, atol=3e-6)
    # Preconditioning changes the direction: plain Adam-direction steps end elsewhere.
    plain = shampoo_reference(w0["network.params"].reshape(2, 15),
                              lambda w: grad_fn({"network.params": w.reshape(2, 5, 3)})["network.params"].reshape(2, 15),
                              N_STEPS, 2e-2, None)
    assert (plain[-1] - ref[-1]).abs().max() > 1e-3


def test_shampoo_inverse_root_and_size_limit(device):
    from tinn.optimizers.shampoo import inverse_fourth_root

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 6, generator=g, dtype=torch.float64)
    a = x @ x.transpose(1, 2)
    root = inverse_fourth_root(a, 0.01).double()
    target = 0.99 * a + 0.01 * torch.eye(6, dtype=torch.float64)
    np.testing.assert_allclose((torch.linalg.matrix_power(root, 4) @ target).numpy(),
                               np.broadcast_to(np.eye(6), (3, 6, 6)), atol=1e-4)
    big = [("network.params", torch.nn.Parameter(torch.zeros(1, 129, 4, device=device)))]
    with pytest.raises(ConfigError, match="up to 128x128"):
        create_optimizer({"otype": "Shampoo"}, big)


# ---- wrappers -----------------------------------------------------------------------------------

def sgd_trajectory(w0, grads_fn, n_steps, lr_fn, l2=1e-8, grad_windows=1):
    """torch.optim.SGD run (float32), optionally on gradients averaged over `grad_windows` calls."""
    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SGD([p], lr=lr_fn(0), weight_decay=l2)
    traj, pool = [], torch.zeros_like(w0)
    for t in range(n_steps):
        pool += grads_fn(p.detach()) / grad_windows
        if (t + 1) % grad_windows == 0:
            for group in opt.param_groups:
                group["lr"] = lr_fn(t // grad_windows)
            p.grad = pool
            opt.step()
            pool = torch.zeros_like(w0)
        traj.append(p.detach().clone())
    return traj


def _single(device, seed=14):
    named = make_params(device, shapes=(("network.params", (3, 6)),), seed=seed)
    return named, named[0][1].detach().cpu().clone(), quad_grads(named, seed=seed + 1)


def test_ema_is_bias_corrected_average_of_sgd_weights(device):
    named, w0, grad_fn = _single(device)
    opt = create_optimizer({"otype": "EMA", "decay": 0.8, "nested": {"otype": "SGD", "learning_rate": 0.05}}, named)
    assert torch.equal(opt.inference_params("network.params"), named[0][1])  # before any step: live weights
    traj = run_tinn(opt, named, grad_fn)
    ref = sgd_trajectory(w0, lambda w: grad_fn({"network.params": w})["network.params"], N_STEPS, lambda t: 0.05)
    np.testing.assert_allclose(traj[-1]["network.params"].numpy(), ref[-1].numpy(), rtol=1e-5, atol=1e-6)
    d = 0.8  # EMA by formula: sum_i d^(t-i) (1-d) w_i / (1 - d^t)
    ema = sum(d ** (N_STEPS - 1 - i) * (1 - d) * ref[i].double() for i in range(N_STEPS)) / (1 - d ** N_STEPS)
    got = opt.inference_params("network.params").cpu()
    np.testing.assert_allclose(got.numpy(), ema.numpy(), rtol=1e-5, atol=1e-6)
    assert (got - named[0][1].detach().cpu()).abs().max() > 1e-3  # it really lags the live weights
    live = named[0][1].detach().clone()
    with opt.swap_in_inference_params():
        assert torch.equal(named[0][1].detach(), got.to(device))
    assert torch.equal(named[0][1].detach(), live)


def test_average_is_window_mean(device):
    named, w0, grad_fn = _single(device, seed=16)
    opt = create_optimizer({"otype": "Average", "n_samples": 4, "nested": {"otype": "SGD", "learning_rate": 0.05}},
                           named)
    ref = sgd_trajectory(w0, lambda w: grad_fn({"network.params": w})["network.params"], N_STEPS, lambda t: 0.05)
    for t in range(N_STEPS):
        run_tinn(opt, named, grad_fn, 1)
        window = [ref[i].double() for i in range(max(0, t - 3), t + 1)]
        np.testing.assert_allclose(opt.inference_params("network.params").cpu().numpy(),
                                   (sum(window) / len(window)).numpy(), rtol=1e-5, atol=2e-6)


def test_lookahead_matches_float64_reference(device):
    named, w0, grad_fn = _single(device, seed=18)
    opt = create_optimizer({"otype": "Lookahead", "alpha": 0.3, "n_steps": 7,
                            "nested": {"otype": "SGD", "learning_rate": 0.05, "l2_reg": 0.0}}, named)
    traj = run_tinn(opt, named, grad_fn)
    w = w0.double()
    slow = w.clone()
    for t in range(1, N_STEPS + 1):  # k = 7 fast steps, then the slow weights move and the fast restart there
        w = w - 0.05 * grad_fn({"network.params": w})["network.params"]
        if t % 7 == 0:
            w = slow + 0.3 * (w - slow)
            slow = w.clone()
    np.testing.assert_allclose(traj[-1]["network.params"].numpy(), w.numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(opt.inference_params("network.params").cpu().numpy(), slow.numpy(), rtol=1e-5, atol=2e-6)


def test_exponential_decay_schedule_and_trajectory(device):
    named, w0, grad_fn = _single(device, seed=20)
    cfg = {"otype": "ExponentialDecay", "decay_start": 5, "decay_interval": 4, "decay_end": 15, "decay_base": 0.5,
           "nested": {"otype": "SGD", "learning_rate": 0.08}}
    opt = create_optimizer(cfg, named)

    def lr_at(t):  # decays before steps 5, 9, 13 (t counts from 0), not after decay_end
        return 0.08 * 0.5 ** sum(1 for s in (5, 9, 13) if t >= s)

    lrs = []
    for _ in range(N_STEPS):
        run_tinn(opt, named, grad_fn, 1)
        lrs.append(opt.learning_rate)
    assert lrs == pytest.approx([lr_at(t) for t in range(N_STEPS)], rel=1e-12)
    ref = sgd_trajectory(w0, lambda w: grad_fn({"network.params": w})["network.params"], N_STEPS, lr_at)
    np.testing.assert_allclose(named[0][1].detach().cpu().numpy(), ref[-1].numpy(), rtol=1e-5, atol=1e-6)
    opt.learning_rate = 0.02  # tcnn: sets the current rate, the factor stays
    assert opt.learning_rate == pytest.approx(0.02) and opt.nested.learning_rate == pytest.approx(0.02)


def test_batched_averages_gradients_over_windows(device):
    named, w0, grad_fn = _single(device, seed=22)
    opt = create_optimizer({"otype": "Batched", "batch_size_multiplier": 3,
                            "nested": {"otype": "SGD", "learning_rate": 0.1}}, named)
    traj = run_tinn(opt, named, grad_fn, 24)
    ref = sgd_trajectory(w0, lambda w: grad_fn({"network.params": w})["network.params"], 24, lambda t: 0.1,
                         grad_windows=3)
    for t in (1, 2, 11, 23):
        np.testing.assert_allclose(traj[t]["network.params"].numpy(), ref[t].numpy(), rtol=1e-5, atol=1e-6)
    assert torch.equal(traj[0]["network.params"], w0)  # nothing moves inside the first window
    assert opt.step_count == 24 and opt.nested.step_count == 8


# ---- nesting from JSON, Composite ---------------------------------------------------------------

def test_nesting_from_json_file_matches_composed_reference(device):
    import tinn
    from tinn.optimizers.adam import Adam
    from tinn.optimizers.wrappers import EMA, ExponentialDecay

    cfg = tinn.load_config("tinn/configs/optimizer_ema_decay_adam.json")
    named, w0, grad_fn = _single(device, seed=24)
    opt = create_optimizer(cfg, named)
    assert isinstance(opt, EMA) and isinstance(opt.nested, ExponentialDecay) and isinstance(opt.nested.nested, Adam)
    assert opt.nested.nested.epsilon == 1e-15 and opt.decay == 0.95
    assert opt.hyperparams()["nested"]["nested"]["beta2"] == 0.99
    traj = run_tinn(opt, named, grad_fn)
    # Reference: Adam in float64 with the learning rate decayed at steps 10, 15, 20 (x 0.33), then EMA by formula.
    w = w0.double()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    ws = []
    for t in range(1, N_STEPS + 1):
        lr = 1e-2 * 0.33 ** sum(1 for s in (10, 15, 20) if t - 1 >= s)
        g = grad_fn({"network.params": w})["network.params"] + 1e-6 * w
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        w = w - lr * math.sqrt(1 - 0.99 ** t) / (1 - 0.9 ** t) * m / (v.sqrt() + 1e-15)
        ws.append(w)
    np.testing.assert_allclose(traj[-1]["network.params"].numpy(), w.numpy(), rtol=1e-4, atol=3e-6)
    ema = sum(0.95 ** (N_STEPS - i) * 0.05 * ws[i - 1] for i in range(1, N_STEPS + 1)) / (1 - 0.95 ** N_STEPS)
    np.testing.assert_allclose(opt.inference_params("network.params").cpu().numpy(), ema.numpy(), rtol=1e-4, atol=3e-6)


def test_composite_routes_groups_to_their_optimizers(device):
    import tinn

    cfg = tinn.load_config("tinn/configs/optimizer_composite.json")
    named = make_params(device, seed=26)
    opt = create_optimizer(cfg, named)
    assert [type(c).__name__ for c in opt.nested] == ["Adam", "Lookahead"]
    # The same run done by two standalone optimizers on copies.
    copies = make_params(device, seed=26)
    enc = create_optimizer({k: v for k, v in cfg["nested"][0].items() if k != "params"}, [copies[1]])
    net = create_optimizer({k: v for k, v in cfg["nested"][1].items() if k != "params"}, [copies[0]])
    grad_fn = quad_grads(named, seed=27)
    for _ in range(N_STEPS):
        for group in (named, copies):
            gs = grad_fn({n: p.detach().cpu() for n, p in group})
            for n, p in group:
                p.grad = gs[n].to(device)
        opt.step()
        enc.step()
        net.step()
    for (_, a), (_, b) in zip(named, copies):
        assert torch.equal(a.detach(), b.detach())
    assert opt.step_count == N_STEPS
    assert torch.equal(opt.inference_params("network.params"), net.inference_params("network.params"))
    # learning_rate is tcnn's learning_rate_scale: it scales every group.
    assert opt.learning_rate == 1.0
    opt.learning_rate = 0.5
    assert opt.nested[0].learning_rate == pytest.approx(5e-3) and opt.nested[1].learning_rate == pytest.approx(5e-4)
    opt.learning_rate = 0.0
    opt.learning_rate = 2.0
    assert opt.nested[0].learning_rate == pytest.approx(2e-2) and opt.nested[1].learning_rate == pytest.approx(2e-3)
    # Per-network scales go to the owning group.
    opt.set_lr_scale("encoding.params", torch.tensor([1.0, 0.0, 1.0], device=device))
    assert torch.equal(opt.nested[0].lr_scale("encoding.params").cpu(), torch.tensor([1.0, 0.0, 1.0]))


def test_composite_assignment_by_order_and_by_count(device):
    named = make_params(device)  # network.params (24 values), encoding.params (15 values)
    opt = create_optimizer({"otype": "Composite", "nested": [{"otype": "SGD"}, {"otype": "Adam"}]}, named)
    assert [c.named_params[0][0] for c in opt.nested] == ["network.params", "encoding.params"]
    opt = create_optimizer({"otype": "Composite", "nested": [{"otype": "SGD", "params": "encoding"},
                                                              {"otype": "Adam", "n_params_to_optimize": 24}]}, named)
    assert [c.named_params[0][0] for c in opt.nested] == ["encoding.params", "network.params"]
    with pytest.raises(ConfigError, match=r"optimizer\.nested\[0\]\.n_params_to_optimize=20 does not end"):
        create_optimizer({"otype": "Composite", "nested": [{"otype": "SGD", "n_params_to_optimize": 20},
                                                           {"otype": "SGD"}]}, named)
    with pytest.raises(ConfigError, match=r"\['encoding.params'\] are not assigned"):
        create_optimizer({"otype": "Composite", "nested": [{"otype": "SGD", "params": "network"}]}, named)
    with pytest.raises(ConfigError, match=r"optimizer\.nested must be a non-empty list"):
        create_optimizer({"otype": "Composite", "nested": {"otype": "SGD"}}, named)
    with pytest.raises(ConfigError, match=r"optimizer\.nested\[1\]\.otype='Adamw'"):
        create_optimizer({"otype": "Composite", "nested": [{"otype": "SGD"}, {"otype": "Adamw"}]}, named)
    with pytest.raises(ConfigError, match=r"optimizer\.nested\[1\].*'network.params' is already optimized"):
        create_optimizer({"otype": "Composite", "nested": [{"otype": "SGD", "params": "network"},
                                                           {"otype": "SGD", "params": ["network", "encoding"]}]},
                         named)


@pytest.mark.parametrize("cfg, match", [
    ({"otype": "EMA", "nested": {"otype": "Adam", "learning_rate": -1}}, r"optimizer\.nested\.learning_rate"),
    ({"otype": "ExponentialDecay", "nested": {"otype": "EMA", "nested": {"otype": "Nope"}}},
     r"optimizer\.nested\.nested\.otype='Nope'"),
    ({"otype": "Batched", "batch_size_multiplier": 0, "nested": {"otype": "SGD"}},
     r"optimizer\.batch_size_multiplier=0"),
    ({"otype": "EMA", "nested": "Adam"}, r"optimizer\.nested must be a JSON object"),
])
def test_bad_nested_configs_name_the_key(cfg, match, device):
    with pytest.raises(ConfigError, match=match):
        create_optimizer(cfg, make_params(device))


def test_wrappers_delegate_learning_rate_and_lr_scale(device):
    named = make_params(device)
    opt = create_optimizer({"otype": "EMA", "nested": {"otype": "Lookahead", "nested": {"otype": "Adam",
                                                                                        "learning_rate": 0.01}}}, named)
    assert opt.learning_rate == pytest.approx(0.01)
    opt.learning_rate = 0.002
    assert opt.nested.nested.learning_rate == pytest.approx(0.002)
    opt.set_lr_scale("network.params", torch.tensor([0.0, 1.0, 2.0], device=device))
    assert torch.equal(opt.nested.nested.lr_scale("network.params").cpu(), torch.tensor([0.0, 1.0, 2.0]))


@pytest.mark.parametrize("cfg", [
    {"otype": "Novograd", "learning_rate": 1e-2},
    {"otype": "Shampoo", "learning_rate": 1e-2},
    {"otype": "EMA", "decay": 0.9, "nested": {"otype": "Adam", "learning_rate": 1e-2}},
    {"otype": "Average", "n_samples": 5, "nested": {"otype": "SGD", "learning_rate": 0.05}},
    {"otype": "Lookahead", "n_steps": 5, "nested": {"otype": "Adam", "learning_rate": 1e-2}},
    {"otype": "ExponentialDecay", "decay_start": 3, "decay_interval": 7, "nested": {"otype": "Adam"}},
    {"otype": "Batched", "batch_size_multiplier": 5, "nested": {"otype": "Adam", "learning_rate": 1e-2}},
    {"otype": "Composite", "learning_rate_scale": 0.5, "nested": [
        {"params": "encoding", "otype": "Adam", "learning_rate": 1e-2},
        {"params": "network", "otype": "EMA", "nested": {"otype": "Novograd", "learning_rate": 1e-2}}]},
], ids=lambda c: c["otype"])
def test_every_optimizer_resumes_bit_exactly(cfg, device):
    named = make_params(device)
    named[0][1].tinn_layer_shapes = [(2, 4)]  # exercise Shampoo / Novograd matrices on the (3, 8) param
    sparse = {"encoding.params": (torch.arange(15).reshape(3, 5) % 3 != 0).float()}
    opt_a, _ = _resume_check(cfg, device, n_first=12, n_second=13, sparse=sparse)
    assert opt_a.step_count == 25
    keys = opt_a.state_dict().keys()
    if cfg["otype"] in ("EMA", "Lookahead", "Average", "ExponentialDecay", "Batched"):
        assert any(k.startswith("nested.") for k in keys)
    if cfg["otype"] == "Composite":
        assert any(k.startswith("nested.1.nested.m.") for k in keys)


# tcnn's DOCUMENTATION.md sample configs, with every documented key at its documented default.
TCNN_DOCUMENTED = [
    {"otype": "Adam", "learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "l2_reg": 1e-8,
     "relative_decay": 0, "absolute_decay": 0, "adabound": False},
    {"otype": "Novograd", "learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
     "relative_decay": 0, "absolute_decay": 0},
    {"otype": "SGD", "learning_rate": 1e-3, "l2_reg": 1e-8},
    {"otype": "Shampoo", "learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.99, "beta3": 0.9, "beta_shampoo": 0.9,
     "epsilon": 1e-8, "identity": 0.01, "cg_on_momentum": True, "l2_reg": 1e-5, "relative_decay": 0,
     "absolute_decay": 0, "frobenius_normalization": True},
    {"otype": "Average", "n_samples": 128, "nested": {"otype": "Adam"}},
    {"otype": "Batched", "batch_size_multiplier": 16, "nested": {"otype": "Adam"}},
    {"otype": "EMA", "decay": 0.99, "nested": {"otype": "Adam"}},
    {"otype": "ExponentialDecay", "decay_base": 0.1, "decay_start": 10000, "decay_end": 10000000,
     "decay_interval": 10000, "nested": {"otype": "Adam"}},
    {"otype": "Lookahead", "alpha": 0.5, "n_steps": 16, "nested": {"otype": "Adam"}},
    # Adam's keys that adam.h reads beyond the documentation, at adam.h's defaults.
    {"otype": "Adam", "clipping_magnitude": 0, "gradient_clipping_magnitude": 0, "non_matrix_learning_rate_factor": 1,
     "non_matrix_l2_reg": 0, "optimize_matrix_params": True, "optimize_non_matrix_params": True,
     "skip_zero_grad_non_matrix_params": True},
]


@pytest.mark.parametrize("cfg", TCNN_DOCUMENTED, ids=lambda c: c["otype"])
def test_every_documented_key_is_read_with_tcnns_default(cfg, device):
    opt = create_optimizer(cfg, make_params(device))
    own = opt.hyperparams()
    for key, value in cfg.items():
        if key != "nested":
            assert own[key] == pytest.approx(value), key
    # The same defaults when the keys are left out.
    bare = create_optimizer({"otype": cfg["otype"]}, make_params(device)).hyperparams()
    assert {k: bare[k] for k in own if k != "nested"} == pytest.approx({k: own[k] for k in own if k != "nested"})
    with pytest.raises(ConfigError, match=r"optimizer\.bogus is not an option"):
        create_optimizer({**cfg, "bogus": 1}, make_params(device))
