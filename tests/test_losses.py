"""Losses: values and gradients against tcnn's formulas in float64, reductions, autograd, config errors."""
import numpy as np
import pytest
import torch

from tinn.errors import ConfigError, InputError
from tinn.losses import LOSSES, Loss, LossResult, create_loss

EPS = 0.01


def _lum(p):
    rgb = p[:, :3] + (p[:, 3:6] if p.shape[1] >= 6 else 0.0)
    return (0.299 * rgb[:, 0] + 0.587 * rgb[:, 1] + 0.114 * rgb[:, 2])[:, None]


def _value64(otype, p, t, q):
    """Per-element loss in float64 as current tcnn defines it; what tcnn holds constant in the gradient is
    detached, so torch autograd of this gives tcnn's gradient."""
    d = p - t
    if otype == "L2":
        return d * d / q
    if otype == "L1":
        return d.abs() / q
    if otype == "RelativeL2":
        return d * d / (p * p + EPS).detach() / q
    if otype == "RelativeL1":
        return d.abs() / (p.abs() + EPS).detach() / q
    if otype == "MAPE":
        return d.abs() / (t.abs() + EPS) / q
    if otype == "SMAPE":
        return d.abs() / (0.5 * (t.abs() + p.abs()) + EPS).detach() / q
    if otype == "RelativeL2Luminance":
        return d * d / (_lum(p) ** 2 + EPS).detach() / q
    if otype == "CrossEntropy":
        return -t / q * torch.log(p)
    if otype == "Variance":
        f = t * t / q
        return f / p - f / q
    raise AssertionError(otype)


def reference(otype, p, t, q):
    """Per-element value and d(value)/dp in float64 (torch autograd of `_value64`)."""
    p64 = p.double().requires_grad_(True)
    v = _value64(otype, p64, t.double(), q.double())
    (g,) = torch.autograd.grad(v.sum(), p64)
    return v.detach(), g


def _data(batch, dims, seed, positive):
    g = torch.Generator().manual_seed(seed)
    if positive:  # PDF-valued predictions and targets
        p = torch.rand(batch, dims, generator=g) * 2 + 0.1
        t = torch.rand(batch, dims, generator=g) * 2 + 0.1
    else:
        p = torch.randn(batch, dims, generator=g)
        t = torch.randn(batch, dims, generator=g)
    q = torch.rand(batch, dims, generator=g) + 0.5
    return p, t, q


@pytest.mark.parametrize("otype", list(LOSSES))
@pytest.mark.parametrize("with_pdf", [False, True])
def test_value_and_gradient_match_formula(otype, with_pdf, device):
    dims = 6 if otype == "RelativeL2Luminance" and with_pdf else 3
    p, t, q = _data(97, dims, seed=len(otype) + with_pdf, positive=otype in ("CrossEntropy", "Variance"))
    loss = create_loss({"otype": otype})
    res = loss.evaluate(p.to(device), t.to(device), data_pdf=q.to(device) if with_pdf else None)
    v_ref, g_ref = reference(otype, p, t, q if with_pdf else torch.ones_like(q))
    n = p.numel()
    assert isinstance(res, LossResult) and res.per_network is None
    assert res.value.dim() == 0 and res.value.dtype == torch.float32
    assert res.grad.shape == p.shape and res.grad.dtype == torch.float32
    np.testing.assert_allclose(res.value.item(), (v_ref.sum() / n).item(), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(res.grad.double().cpu().numpy(), (g_ref / n).numpy(), rtol=2e-5, atol=1e-9)


def test_l2_is_mean_squared_error_and_grad_is_2_diff_over_n(device):
    p = torch.tensor([[1.0, 2.0], [3.0, 5.0]], device=device)
    t = torch.tensor([[0.0, 2.0], [1.0, 1.0]], device=device)
    res = create_loss({"otype": "L2"}).evaluate(p, t)
    assert res.value.item() == pytest.approx((1 + 0 + 4 + 16) / 4)
    assert torch.equal(res.grad.cpu(), torch.tensor([[0.5, 0.0], [1.0, 2.0]]))


@pytest.mark.parametrize("otype", ["L2", "L1", "MAPE"])
def test_gradient_matches_torch_autograd_where_nothing_is_held_constant(otype, device):
    # For these losses tcnn's gradient is the true derivative; check it against torch autograd in float64.
    p, t, _ = _data(64, 4, seed=7, positive=False)
    p64 = p.double().requires_grad_(True)
    d = p64 - t.double()
    v = d * d if otype == "L2" else d.abs() / ((t.double().abs() + EPS) if otype == "MAPE" else 1.0)
    v.mean().backward()
    res = create_loss({"otype": otype}).evaluate(p.to(device), t.to(device))
    np.testing.assert_allclose(res.grad.double().cpu().numpy(), p64.grad.numpy(), rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("with_pdf", [False, True])
def test_relative_and_percentage_losses_by_hand(with_pdf, device):
    # One element, numbers worked out by hand from tcnn's kernels: the pdf divides the whole term and
    # the target is never divided by it (tinn's pre-2022 formulas differed here).
    p, t, q = 0.5, 0.2, (2.0 if with_pdf else 1.0)
    cases = {
        "RelativeL2": ((p - t) ** 2 / (p * p + EPS) / q, 2 * (p - t) / (p * p + EPS) / q),
        "MAPE": (abs(p - t) / (abs(t) + EPS) / q, 1 / (abs(t) + EPS) / q),
        "SMAPE": (abs(p - t) / (0.5 * (abs(t) + abs(p)) + EPS) / q, 1 / (0.5 * (abs(t) + abs(p)) + EPS) / q),
    }
    args = [torch.tensor([[v]], device=device) for v in (p, t, q)]
    for otype, (value, grad) in cases.items():
        res = create_loss({"otype": otype}).evaluate(args[0], args[1], data_pdf=args[2] if with_pdf else None)
        assert res.value.item() == pytest.approx(value, rel=1e-6), otype
        assert res.grad.item() == pytest.approx(grad, rel=1e-6), otype


def test_mean_is_over_every_output_element(device):
    # tcnn divides by batch * dims (the target's dims), so the value is the mean and the gradient 1/N.
    p, t, _ = _data(8, 5, seed=2, positive=False)
    res = create_loss({"otype": "RelativeL1"}).evaluate(p.to(device), t.to(device))
    v_ref, g_ref = reference("RelativeL1", p, t, torch.ones_like(p))
    assert res.value.item() == pytest.approx(v_ref.mean().item(), rel=1e-6)
    np.testing.assert_allclose(res.grad.cpu().numpy(), (g_ref / 40).numpy(), rtol=1e-5)


@pytest.mark.parametrize("otype", ["L2", "RelativeL1"])
def test_mean_over_a_larger_batch_divides_by_its_count(otype, device):
    """A loss averaged over n elements (a piece of a larger batch evaluated apart): the value is the piece's sum
    over n and the gradient 1/n, in float64's values; evaluate, the differentiable call and averaged_over agree."""
    p, t, _ = _data(8, 5, seed=3, positive=False)
    loss = Loss(otype).averaged_over(100)
    assert loss.mean_over == 100 and Loss(otype).mean_over is None and "mean_over=100" in repr(loss)
    res = loss.evaluate(p.to(device), t.to(device))
    v_ref, g_ref = reference(otype, p, t, torch.ones_like(p))
    assert res.value.item() == pytest.approx(v_ref.sum().item() / 100, rel=1e-6)
    np.testing.assert_allclose(res.grad.cpu().numpy(), (g_ref / 100).numpy(), rtol=1e-5)
    pd = p.to(device).requires_grad_()
    value = loss(pd, t.to(device))
    value.backward()
    assert value.item() == pytest.approx(res.value.item(), rel=1e-6)
    np.testing.assert_allclose(pd.grad.cpu().numpy(), res.grad.cpu().numpy(), rtol=1e-6)
    empty = loss.evaluate(torch.zeros(0, 5, device=device), torch.zeros(0, 5, device=device))
    assert empty.value.item() == 0.0


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_a_bad_mean_over_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match=r"mean_over=.*allowed: None .* or a positive integer"):
        Loss("L2", mean_over=bad)


def test_relative_l2_luminance_uses_luminance_of_prediction(device):
    p = torch.tensor([[0.2, 0.4, 0.6]], device=device)
    t = torch.tensor([[0.0, 0.0, 0.0]], device=device)
    lum = 0.299 * 0.2 + 0.587 * 0.4 + 0.114 * 0.6
    res = create_loss({"otype": "RelativeL2Luminance"}).evaluate(p, t)
    expected = (0.04 + 0.16 + 0.36) / (lum * lum + 0.01) / 3
    assert res.value.item() == pytest.approx(expected, rel=1e-6)


def test_per_network_mean(device):
    p, t, _ = _data(50, 2, seed=3, positive=False)
    ids = torch.tensor([i % 3 for i in range(50)], dtype=torch.int32)  # network 3 gets no samples
    res = create_loss({"otype": "RelativeL2"}).evaluate(p.to(device), t.to(device), net_ids=ids.to(device),
                                                         n_networks=4)
    v_ref, _ = reference("RelativeL2", p, t, torch.ones_like(p))
    expected = [v_ref[ids == k].mean().item() if (ids == k).any() else 0.0 for k in range(4)]
    assert res.per_network.shape == (4,)
    np.testing.assert_allclose(res.per_network.cpu().numpy(), expected, rtol=2e-5)
    assert res.per_network[3].item() == 0.0
    # The global value and gradient do not depend on the grouping.
    plain = create_loss({"otype": "RelativeL2"}).evaluate(p.to(device), t.to(device))
    assert torch.equal(plain.grad, res.grad) and torch.equal(plain.value, res.value)


def test_single_network_per_network_without_ids(device):
    p, t, _ = _data(10, 3, seed=5, positive=False)
    res = create_loss({"otype": "L1"}).evaluate(p.to(device), t.to(device), n_networks=1)
    assert res.per_network.shape == (1,)
    assert res.per_network[0].item() == pytest.approx(res.value.item(), rel=1e-6)


def test_call_is_differentiable_and_composes(device):
    p, t, _ = _data(20, 3, seed=11, positive=False)
    loss = create_loss({"otype": "SMAPE"})
    x = p.to(device).requires_grad_(True)
    value = loss(x * 2.0, t.to(device))
    (3.0 * value).backward()
    res = loss.evaluate((p * 2.0).to(device), t.to(device))
    assert value.item() == pytest.approx(res.value.item(), rel=1e-6)
    np.testing.assert_allclose(x.grad.cpu().numpy(), (6.0 * res.grad).cpu().numpy(), rtol=1e-6)


def test_create_loss_names_and_defaults(device):
    assert create_loss({}).otype == "RelativeL2"  # tcnn's default
    assert create_loss({"otype": "mape"}).otype == "MAPE"  # case-insensitive, tcnn registers "Mape"
    assert create_loss({"otype": "Smape"}).otype == "SMAPE"
    assert isinstance(create_loss({"otype": "Variance"}), Loss)


def test_unknown_loss_names_key_and_allowed_values():
    with pytest.raises(ConfigError, match=r"loss\.otype='L3'.*allowed.*RelativeL2Luminance"):
        create_loss({"otype": "L3"})


def test_bad_inputs(device):
    loss = create_loss({"otype": "L2"})
    p = torch.zeros(4, 3, device=device)
    with pytest.raises(InputError, match="target has last dimension 2"):
        loss.evaluate(p, torch.zeros(4, 2, device=device))
    with pytest.raises(InputError, match="target has batch size 5"):
        loss.evaluate(p, torch.zeros(5, 3, device=device))
    with pytest.raises(InputError, match="float32"):
        loss.evaluate(p.double(), p.double())
    with pytest.raises(InputError, match="dims >= 3"):
        create_loss({"otype": "RelativeL2Luminance"}).evaluate(p[:, :2], p[:, :2])
    with pytest.raises(InputError, match="net_ids contains 7"):
        loss.evaluate(p, p, net_ids=torch.tensor([0, 1, 7, 0], dtype=torch.int32, device=device), n_networks=2)
