"""Compact (bfloat16) grid tables: lookups, sparse gradients against float64, the lazy Adam step, training,
checkpoints, chunked tables and the errors around them."""
import math

import pytest
import torch

import tinn
from tinn.encodings import GridEncoding, create_encoding
from tinn.errors import ConfigError, InputError
from tinn.kernels import compact as KC
from tinn.optimizers import create_optimizer
from tinn.part import SecondOrderError
from tinn.trainer import Trainer

from test_encodings_grid import CONFIGS, IDS, inputs, ref_grid

DEV = tinn.runtime.device()


def compact_and_float(n_dims, n_networks, seed=0, **kw):
    """A compact grid with O(1) values and a float32 grid holding exactly the same (bfloat16) values."""
    c = GridEncoding(n_dims, n_networks=n_networks, table_dtype="bfloat16", **kw)
    f = GridEncoding(n_dims, n_networks=n_networks, **kw)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        c.params.copy_(torch.rand(c.params.shape, generator=gen) * 2 - 1)
        f.params.copy_(c.params.float())
    return c, f


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bfloat16 values around |x| (normal range)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(1e-30)))
    return torch.pow(2.0, e - 7)


@pytest.mark.parametrize("n_dims,kw,n_networks", CONFIGS, ids=IDS)
def test_lookup_and_sparse_gradient_match_float64(n_dims, kw, n_networks, grid_path, request):
    # The lookup on both launch paths (Triton's reads the bfloat16 bits itself); the sparse gradient is Taichi's.
    launches = request.getfixturevalue("triton_grid_launches") if grid_path == "triton" else None
    c, f = compact_and_float(n_dims, n_networks, **kw)
    x, ids = inputs(c, 96)
    xr = x.double().requires_grad_(True)
    pr = c.params.detach().double().requires_grad_(True)
    yr = ref_grid(c, xr, pr, ids)
    w = torch.randn(yr.shape, generator=torch.Generator().manual_seed(3)).to(DEV)
    (yr * w.double()).sum().backward()

    x.requires_grad_(True)
    y = c(x, ids)
    torch.testing.assert_close(y.detach().double(), yr.detach(), rtol=1e-5, atol=1e-5 * float(yr.detach().abs().max()))
    (y * w).sum().backward()
    g = c.params.grad
    assert g.is_sparse and g.dtype == torch.bfloat16
    g = g.coalesce()
    # Exactly the entries the batch touched, each the float64 sum rounded once to bfloat16.
    touched = pr.grad != 0
    dense = g.to_dense().double()
    assert torch.equal(torch.sparse_coo_tensor(g.indices(), torch.ones(g._nnz(), device=DEV),
                                               g.shape).to_dense() != 0, touched | (dense != 0))
    err = (dense - pr.grad).abs()
    assert bool((err <= bf16_ulp(pr.grad) * 0.5 + 1e-6 * float(pr.grad.abs().max())).all())
    if kw.get("interpolation") != "Nearest":
        torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-4, atol=1e-4 * float(xr.grad.abs().max()))
    # The float32 table with the same values gives the same features.
    torch.testing.assert_close(f(x.detach(), ids), y.detach(), rtol=0, atol=1e-6)
    if launches is not None:
        assert launches.count("grid_forward") == 2 and "grid_backward_table" not in launches, launches


def test_bfloat16_rounding_nearest_and_stochastic():
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4096, generator=gen) * 10.0 ** torch.randint(-20, 20, (4096,), generator=gen),
                   torch.tensor([0.0, -0.0, math.inf, -math.inf, 1.0 + 2**-8, 1.0 + 3 * 2**-8])]).to(DEV)
    out = torch.empty(x.shape, dtype=torch.int16, device=DEV)
    KC.round_stochastic(x, out, 5)
    rounded = out.view(torch.bfloat16).double()
    finite = torch.isfinite(x)
    # Stochastic rounding lands on one of the two bfloat16 neighbours of x; infinities and zeros stay.
    spacing = bf16_ulp(x.double())
    assert bool(((rounded - x.double()).abs()[finite] <= spacing[finite]).all())
    assert torch.equal(rounded[~finite], x.double()[~finite]) and bool((rounded[-6:-4] == 0).all())
    # ... and rounds up with probability equal to the distance: the mean of many roundings is x.
    for value in (1.0 + 0.3 * 2**-7, -(1.0 + 0.3 * 2**-7), 3.0e-5 * (1 + 0.71 * 2**-7)):
        v = torch.full((200_000,), value, device=DEV)
        o = torch.empty(v.shape, dtype=torch.int16, device=DEV)
        KC.round_stochastic(v, o, 11)
        mean = float(o.view(torch.bfloat16).double().mean())
        spacing = float(bf16_ulp(torch.tensor(value, dtype=torch.float64)))
        assert abs(mean - value) < 0.01 * spacing, (value, mean)


def _adam_reference(w, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """tcnn's Adam in float64 on the given (bfloat16-valued) operands."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    lr_t = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    return w - lr_t / (v.sqrt() + eps) * m, m, v


def test_lazy_adam_steps_touched_entries_against_float64(tuned):
    tuned(table_chunk_elements=2048)  # the table spans several row chunks
    c, _ = compact_and_float(3, 7, n_levels=3, n_features_per_level=2, log2_hashmap_size=7, base_resolution=4,
                             per_level_scale=1.5)
    assert len(tinn.chunks.row_spans(c.params.shape[0], c.params.shape[1])) > 1
    opt = create_optimizer({"otype": "Adam", "learning_rate": 3e-2, "l2_reg": 0.0}, list(c.named_parameters()))
    assert opt.state["m.params"].dtype == torch.bfloat16 and "steps.params" in opt.scalars
    lr_scale = torch.linspace(0.5, 1.5, 7, device=DEV)
    opt.set_lr_scale("params", lr_scale)
    m = torch.zeros(c.params.shape, dtype=torch.float64, device=DEV)
    v = torch.zeros_like(m)
    for t in (1, 2, 3):
        x, ids = inputs(c, 64, seed=t)
        before = c.params.detach().clone()
        m_before = opt.state["m.params"].double()
        v_before = opt.state["v.params"].double()
        c.params.grad = None
        (c(x, ids) * torch.linspace(-1, 1, 6, device=DEV)).sum().backward()
        g = c.params.grad.coalesce()
        touched = g.to_dense() != 0
        opt.step()
        after = c.params.detach()
        # Entries without a gradient keep their bits, and so do their moments.
        assert torch.equal(after[~touched].view(torch.int16), before[~touched].view(torch.int16))
        assert bool((opt.state["m.params"].double()[~touched] == m_before[~touched]).all())
        lr = 3e-2 * lr_scale[:, None].double().expand_as(m)
        w_ref, m_ref, v_ref = _adam_reference(before.double(), g.to_dense().double(), m_before, v_before, t, lr)
        sel = touched
        got_m = opt.state["m.params"].double()[sel]
        assert bool(((got_m - m_ref[sel]).abs() <= bf16_ulp(m_ref[sel]) * 0.51 + 1e-12).all())
        got_v = opt.state["v.params"].double()[sel]
        assert bool(((got_v - v_ref[sel]).abs() <= bf16_ulp(v_ref[sel]) * 0.51 + 1e-12).all())
        # The weight is one of the two bfloat16 neighbours of the float64 update.
        got_w = after.double()[sel]
        assert bool(((got_w - w_ref[sel]).abs() <= bf16_ulp(w_ref[sel]) * 1.01).all())
        assert int(sel.sum()) > 100 and bool((got_w != before.double()[sel]).any())
        m, v = m_ref, v_ref
    assert opt.scalars["steps.params"] == 3


def _regression(table_dtype, steps, n_networks=4):
    enc = {"otype": "HashGrid", "n_levels": 6, "n_features_per_level": 2, "log2_hashmap_size": 10,
           "base_resolution": 4, "per_level_scale": 1.6, "table_dtype": table_dtype}
    config = {"encoding": enc, "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1},
              "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta2": 0.99}}
    trainer = Trainer.from_config(config, 2, 1, n_networks=n_networks, seed=3)
    gen = torch.Generator().manual_seed(5)
    losses = []
    for step in range(steps):
        x = torch.rand(2048, 2, generator=gen)
        ids = torch.randint(0, n_networks, (2048,), generator=gen, dtype=torch.int32)
        y = torch.sin(6 * x[:, :1]) * torch.cos(5 * x[:, 1:]) + ids[:, None].float() * 0.1
        losses.append(float(trainer.training_step(x.to(DEV), y.to(DEV), ids.to(DEV))))
    return trainer, losses


def test_compact_grid_trains_like_float32():
    _, ref = _regression("float32", 150)
    trainer, losses = _regression("bfloat16", 150)
    assert trainer.model.encoding.params.dtype == torch.bfloat16
    start, end, ref_end = sum(losses[:5]) / 5, sum(losses[-10:]) / 10, sum(ref[-10:]) / 10
    assert end < start / 20, (start, end)
    assert end < 1.5 * ref_end, (end, ref_end)


def test_autograd_objective_and_trainer_step_agree(tuned):
    """The Trainer's direct step and its autograd path (taken when a hook observes the model) give the same
    compact update, bit for bit (deterministic mode: the network's CUDA weight gradients are atomics)."""
    tuned(deterministic=True)
    a, _ = _regression("bfloat16", 3)
    b, _ = _regression("bfloat16", 3)
    gen = torch.Generator().manual_seed(9)
    x = torch.rand(512, 2, generator=gen).to(DEV)
    ids = torch.randint(0, 4, (512,), generator=gen, dtype=torch.int32).to(DEV)
    y = torch.rand(512, 1, generator=gen).to(DEV)
    a.training_step(x, y, ids)
    b.model.register_forward_hook(lambda *args: None)
    b.training_step(x, y, ids)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa.view(torch.int16) if pa.dtype == torch.bfloat16 else pa,
                           pb.view(torch.int16) if pb.dtype == torch.bfloat16 else pb)


def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    trainer, _ = _regression("bfloat16", 4)
    path = tmp_path / "compact.tinn"
    trainer.save_checkpoint(path)
    other, _ = _regression("bfloat16", 1)
    other.load_checkpoint(path)
    for (name, p), (_, q) in zip(trainer.model.named_parameters(), other.model.named_parameters()):
        assert p.dtype == q.dtype and torch.equal(p.detach().view(torch.uint8), q.detach().view(torch.uint8)), name
    sa, sb = trainer.optimizer.state_dict(), other.optimizer.state_dict()
    assert sa.keys() == sb.keys()
    for key, value in sa.items():
        assert (torch.equal(value.view(torch.uint8), sb[key].view(torch.uint8))
                if isinstance(value, torch.Tensor) else value == sb[key]), key
    # Both continue identically.
    x = torch.rand(256, 2, device=DEV)
    ids = torch.zeros(256, dtype=torch.int32, device=DEV)
    y = torch.rand(256, 1, device=DEV)
    assert float(trainer.training_step(x, y, ids)) == float(other.training_step(x, y, ids))
    assert torch.equal(trainer.model.encoding.params.view(torch.int16), other.model.encoding.params.view(torch.int16))


def test_compact_table_memory_is_two_bytes_per_value():
    c = GridEncoding(3, n_levels=4, log2_hashmap_size=8, table_dtype="bfloat16", n_networks=3)
    f = GridEncoding(3, n_levels=4, log2_hashmap_size=8, n_networks=3)
    assert c.memory_bytes() * 2 == f.memory_bytes() == f.params.numel() * 4
    report = c.memory_report()
    assert report["table_dtype"] == "bfloat16" and report["total_bytes"] == c.params.numel() * 2


def test_errors_name_the_field_and_allowed_values():
    with pytest.raises(ConfigError, match=r"table_dtype='float16'.*allowed: \['float32', 'bfloat16'\]"):
        GridEncoding(3, table_dtype="float16")
    with pytest.raises(ConfigError, match=r"table_dtype.*allowed"):
        create_encoding(3, {"otype": "HashGrid", "table_dtype": "half"})
    c = GridEncoding(3, n_levels=2, log2_hashmap_size=6, table_dtype="bfloat16")
    # An optimizer that cannot step compact tables says which can.
    with pytest.raises(InputError, match=r"'params' is a compact \(bfloat16\) table.*SGD.*allowed.*Adam"):
        create_optimizer({"otype": "SGD"}, list(c.named_parameters()))
    with pytest.raises(InputError, match=r"compact.*EMA.*allowed.*Adam"):
        create_optimizer({"otype": "EMA", "nested": {"otype": "Adam"}}, list(c.named_parameters()))
    create_optimizer({"otype": "ExponentialDecay", "nested": {"otype": "Adam"}}, list(c.named_parameters()))
    # A Composite holds one float32 table.
    with pytest.raises(ConfigError, match=r"table_dtype='bfloat16'.*Composite.*allowed.*float32"):
        create_encoding(3, {"otype": "Composite", "nested": [
            {"otype": "HashGrid", "n_dims_to_encode": 3, "table_dtype": "bfloat16", "n_levels": 2,
             "log2_hashmap_size": 6}]})
    # No second derivatives through a sparse gradient.
    x = torch.rand(8, 3, device=DEV, requires_grad=True)
    (dx,) = torch.autograd.grad(c(x).sum(), x, create_graph=True)
    with pytest.raises(SecondOrderError, match="bfloat16.*float32"):
        dx.sum().backward()
    # A table converted behind the module's back is refused by name.
    c.params.data = c.params.data.float()
    with pytest.raises(InputError, match=r"params has dtype torch.float32.*bfloat16"):
        c(x.detach())


def test_tcnn_facade_keeps_the_compact_table():
    """tinn.torch binds a single model's tables into one float32 flat vector (tcnn's `params`); a compact table
    keeps its own bfloat16 storage instead, trains through autograd and reloads its state dict."""
    import tinn.torch as tcnn

    m = tcnn.NetworkWithInputEncoding(3, 3, {"otype": "HashGrid", "n_levels": 4, "log2_hashmap_size": 10,
                                             "table_dtype": "bfloat16"},
                                      {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1})
    assert m.encoding.params.dtype == torch.bfloat16 and m.network.params.dtype == torch.float32
    x = torch.rand(100, 3, device=DEV)
    m(x).square().sum().backward()
    assert m.encoding.params.grad.is_sparse and m.encoding.params.grad._nnz() > 0
    state = {k: v.clone() for k, v in m.state_dict().items()}
    opt = create_optimizer({"otype": "Adam", "learning_rate": 1e-2}, list(m.named_parameters()))
    opt.step()
    assert not torch.equal(m.encoding.params.view(torch.int16), state["encoding.params"].view(torch.int16))
    m.load_state_dict(state)
    assert torch.equal(m.encoding.params.view(torch.int16), state["encoding.params"].view(torch.int16))
