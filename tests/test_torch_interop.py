"""tinn.torch: tcnn's PyTorch API on tinn's Taichi kernels.

Gradients of every autograd Function against independent float64 PyTorch re-implementations
(Taichi computes in float32), zero-copy (the kernels read and write the caller's / the module's tensors),
input validation, composition with torch layers and torch.optim, state_dict, the ported pytorch demo.
Device-agnostic: runs on tinn.runtime.device() (TINN_ARCH=cuda runs the same file on the GPU).
"""
import inspect
import io
import json
import math
import os
import sys

import numpy as np
import pytest
import torch

import tinn
import tinn.torch as tcnn
from tinn.encodings import ENCODINGS
from tinn.errors import ConfigError, InputError

from reference import mlp_array, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))

TOL = 1e-4
DEV = tinn.runtime.device()
# One MLP shape for (almost) every test, so the kernels compile once: 24 inputs -> 16 -> 3.
NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
       "output_activation": "None"}
FREQ = {"otype": "Frequency", "n_frequencies": 6}  # 2 dims -> 24 features
# 2 dims -> 12 levels x 2 = 24 features; coarse levels dense, fine levels hashed into 2^8 entries.
GRID = {"otype": "HashGrid", "n_levels": 12, "n_features_per_level": 2, "log2_hashmap_size": 8,
        "base_resolution": 2, "per_level_scale": 1.5}
HAS_GRID = "HashGrid" in ENCODINGS
needs_grid = pytest.mark.skipif(not HAS_GRID, reason="no grid encoding registered in tinn.encodings.ENCODINGS")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rand(*shape, seed=0, lo=0.0, hi=1.0):
    return (torch.rand(*shape, generator=gen(seed), dtype=torch.float64) * (hi - lo) + lo).float().to(DEV)


def rand_ids(batch, n, seed=0):
    # Ragged, shuffled routing with one network left empty (its gradient must be exactly zero).
    w = torch.rand(n, generator=gen(seed)) + 0.2
    w[n // 2] = 0.0
    return torch.multinomial(w, batch, replacement=True, generator=gen(seed + 1)).to(torch.int32).to(DEV)


# ---------------------------------------------------------------------------------------------------------
# float64 references
# ---------------------------------------------------------------------------------------------------------
def ref_identity(x, scale, offset):
    return x * scale + offset


def ref_frequency(x, n_freq):
    """tcnn's layout: feature j = sin(2^k pi x_d + (j % 2) pi / 2), d = j // 2F, k = (j // 2) % F."""
    j = torch.arange(x.shape[1] * 2 * n_freq)
    d, k = j // (2 * n_freq), (j // 2) % n_freq
    return torch.sin(x[:, d] * (2.0 ** k).double() * math.pi + (j % 2).double() * (math.pi / 2))


COHERENT_PRIMES = (1, 2654435761, 805459861, 3674653429)
M32 = 0xFFFFFFFF


def ref_grid(impl, x, params, ids):
    """Multiresolution grid (tcnn's grid_index: dense index while the stride fits, else the coherent prime
    hash; N-linear weights), differentiable in x and params. Level geometry from the layout."""
    d, f = impl.n_input_dims, impl.n_features_per_level
    assert impl.interpolation == "Linear"
    outs = []
    for lv in impl.layout.levels:
        cell = torch.floor(x.detach().float() * np.float32(lv.scale) + 0.5).long()  # cell chosen in float32
        t = x * lv.scale + 0.5 - cell
        acc = 0
        for corner in range(1 << d):
            bits = [(corner >> k) & 1 for k in range(d)]
            c = cell + torch.tensor(bits)
            w = torch.ones(x.shape[0], dtype=x.dtype)
            for k in range(d):
                w = w * (t[:, k] if bits[k] else 1 - t[:, k])
            idx, stride = torch.zeros_like(c[:, 0]), 1
            for k in range(d):
                if stride > lv.size:
                    break
                idx = idx + c[:, k] * stride
                stride *= lv.resolution
            if impl.grid_type == "Hash" and lv.size < stride:
                idx = torch.zeros_like(idx)
                for k in range(d):
                    idx = idx ^ ((c[:, k] * COHERENT_PRIMES[k]) & M32)
            idx = (idx & M32) % lv.size
            cols = (lv.offset + idx)[:, None] * f + torch.arange(f)
            acc = acc + w[:, None] * params[ids.long()[:, None], cols]
        outs.append(acc)
    return torch.cat(outs, dim=1)


def ref_encoding(enc, x, params, ids):
    cfg = enc.encoding_config
    if enc.otype == "Identity":
        return ref_identity(x, cfg.get("scale", 1.0), cfg.get("offset", 0.0))
    if enc.otype == "Frequency":
        return ref_frequency(x, cfg["n_frequencies"])
    return ref_grid(enc, x, params, ids if enc.n_networks > 1 else torch.zeros_like(ids))


def ref_network(net, params, h, ids):
    cfg = net.network_config
    return mlp_array(net, params, h, ids.cpu(), cfg["activation"], cfg["output_activation"])


def leaf64(t):
    return t.detach().cpu().double().requires_grad_()


# ---------------------------------------------------------------------------------------------------------
# The tcnn-compatible constructors and attributes
# ---------------------------------------------------------------------------------------------------------
def test_constructors_and_attributes_mirror_tcnn():
    def names(cls):  # the constructor's parameters, as tcnn's
        return list(inspect.signature(cls).parameters)

    assert names(tcnn.NetworkWithInputEncoding)[:5] == ["n_input_dims", "n_output_dims", "encoding_config",
                                                        "network_config", "seed"]
    assert names(tcnn.Network) == ["n_input_dims", "n_output_dims", "network_config", "seed"]
    assert names(tcnn.Encoding)[:4] == ["n_input_dims", "encoding_config", "seed", "dtype"]
    for cls in (tcnn.NetworkWithInputEncoding, tcnn.Network, tcnn.Encoding, tcnn.NetworkArray):
        assert inspect.signature(cls).parameters["seed"].default == 1337
        assert issubclass(cls, torch.nn.Module)

    # `tinn.torch` does not shadow the real torch inside the package (absolute imports).
    assert tcnn.__name__ == "tinn.torch" and tinn.networks.array.torch is torch and tcnn.torch is torch
    assert torch.__name__ == "torch"

    # Keyword spelling of tcnn's sample, including its `.to(device)`.
    model = tcnn.NetworkWithInputEncoding(n_input_dims=2, n_output_dims=3, encoding_config=FREQ,
                                          network_config=NET).to(DEV)
    assert (model.n_input_dims, model.n_output_dims, model.seed, model.dtype) == (2, 3, 1337, torch.float32)
    assert model.encoding.n_output_dims == 24 and model.encoding.params is None
    # tcnn's flat params: here (Frequency has no table) exactly the network's table, the same storage
    assert model.params.dim() == 1 and model.params.data_ptr() == model.network.params.data_ptr()
    # tcnn pads the 24 encoded features to 32 with ones (the first matrix is 16 x 32) and the 3 outputs to 16
    # rows (the last matrix is 16 x 16).
    assert model.n_params() == 32 * 16 + 16 * 16 == 768
    assert [n for n, _ in model.named_parameters()] == ["network.params"]
    net = tcnn.Network(n_input_dims=24, n_output_dims=3, network_config=NET, seed=5)
    assert isinstance(net.params, torch.nn.Parameter) and net.params.shape == (1, 768) and net.n_params() == 768
    arr = tcnn.NetworkArray(24, 3, NET, n_networks=7)
    assert arr.params.shape == (7, 768) and arr.n_params() == 7 * 768
    with pytest.raises(ConfigError, match="dtype"):
        tcnn.Encoding(2, FREQ, dtype=torch.bfloat16)
    assert tcnn.supports_jit_fusion() is False and tcnn.free_temporary_memory() is None

    # Same construction as tinn's own NetworkWithInputEncoding with tcnn's padding: identical parameters and
    # outputs for one seed.
    core = tinn.NetworkWithInputEncoding(2, 3, FREQ, NET, n_networks=4, seed=9, tcnn_padding=True)
    facade = tcnn.NetworkWithInputEncoding(2, 3, FREQ, NET, seed=9, n_networks=4)
    x, ids = rand(300, 2, seed=1), rand_ids(300, 4)
    assert torch.equal(core.network.params, facade.network.params)
    assert torch.equal(core(x, ids), facade(x, ids))

    # tcnn's "equivalent, but slower" variant: Sequential(Encoding, Network) with the same seeds.
    single = tcnn.NetworkWithInputEncoding(2, 3, FREQ, NET, seed=3)
    seq = torch.nn.Sequential(tcnn.Encoding(2, FREQ, seed=3), tcnn.Network(24, 3, NET, seed=4))
    assert torch.equal(single(x), seq(x))


@needs_grid
def test_grid_model_exposes_both_tables():
    model = tcnn.NetworkWithInputEncoding(2, 3, GRID, NET, n_networks=3)
    enc = model.encoding
    assert enc.otype == "HashGrid" and enc.n_output_dims == 24 and enc.params.shape[0] == 3
    assert model.n_params() == enc.params.numel() + 3 * 768  # grids pad with zeros, to 32 here
    assert [n for n, _ in model.named_parameters()] == ["encoding.params", "network.params"]
    with pytest.raises(AttributeError, match=r"model\.encoding\.params and model\.network\.params"):
        model.params
    shared = tcnn.NetworkWithInputEncoding(2, 3, GRID, NET, n_networks=3, share_encoding=True)
    assert shared.encoding.params.shape[0] == 1 and shared.network.params.shape[0] == 3


# ---------------------------------------------------------------------------------------------------------
# Gradients of every Function against float64 references
# ---------------------------------------------------------------------------------------------------------
ENCODING_CASES = [("identity", {"otype": "Identity", "scale": 2.5, "offset": -0.5}, 1),
                  ("frequency", FREQ, 1)]
if HAS_GRID:
    ENCODING_CASES.append(("hashgrid-array", GRID, 3))


@pytest.mark.parametrize("name,cfg,n", ENCODING_CASES, ids=[c[0] for c in ENCODING_CASES])
def test_encoding_gradients_match_float64_reference(name, cfg, n):
    enc = tcnn.Encoding(2, cfg, n_networks=n)
    if enc.params is not None:  # O(1) table values so interpolation errors are visible
        with torch.no_grad():
            enc.params.copy_(rand(*enc.params.shape, seed=2, lo=-1, hi=1))
    batch = 2000
    x = rand(batch, 2, seed=3).requires_grad_()
    ids = rand_ids(batch, n) if n > 1 else torch.zeros(batch, dtype=torch.int32, device=DEV)
    y = enc(x, ids if n > 1 else None)
    dy = rand(batch, enc.n_output_dims, seed=4, lo=-1, hi=1)
    y.backward(dy)

    x64 = leaf64(x)
    p64 = leaf64(enc.params) if enc.params is not None else None
    y64 = ref_encoding(enc, x64, p64, ids.cpu())
    y64.backward(dy.cpu().double())
    assert y.dtype == torch.float32 and y.shape == (batch, enc.n_output_dims)
    assert rel_err(y.detach().cpu(), y64.detach()) < TOL
    assert rel_err(x.grad.cpu(), x64.grad) < TOL
    if p64 is not None:
        assert rel_err(enc.params.grad.cpu(), p64.grad) < TOL
        assert torch.all(enc.params.grad[n // 2] == 0)  # the network without samples

    # Second order (the backward is itself a Function): gradient of an eikonal-style term on dy/dx.
    if name == "identity":
        return
    x2 = x.detach().clone().requires_grad_()
    g, = torch.autograd.grad((enc(x2, ids if n > 1 else None) * dy).sum(), x2, create_graph=True)
    (g.square().sum()).backward()
    x3 = leaf64(x)
    p3 = leaf64(enc.params) if enc.params is not None else None
    g3, = torch.autograd.grad((ref_encoding(enc, x3, p3, ids.cpu()) * dy.cpu().double()).sum(), x3,
                              create_graph=True)
    (g3.square().sum()).backward()
    assert rel_err(g.detach().cpu(), g3.detach()) < TOL
    if name == "frequency":  # d2/dx2 of sin(2^k pi x): the Hessian term
        assert rel_err(x2.grad.cpu(), x3.grad) < TOL
    else:  # multilinear: the table gets a gradient through dy/dx
        assert rel_err(enc.params.grad.cpu(), p3.grad) < TOL


@pytest.mark.parametrize("n", [1, 5], ids=["network", "array"])
def test_network_gradients_match_float64_reference(n):
    net = tcnn.Network(24, 3, NET, seed=2) if n == 1 else tcnn.NetworkArray(24, 3, NET, n_networks=n, seed=2)
    batch = 1500
    x = rand(batch, 24, seed=5, lo=-1, hi=1).requires_grad_()
    ids = rand_ids(batch, n) if n > 1 else torch.zeros(batch, dtype=torch.int32, device=DEV)
    y = net(x, ids) if n > 1 else net(x)
    dy = rand(batch, 3, seed=6, lo=-1, hi=1)
    y.backward(dy)

    x64, p64 = leaf64(x), leaf64(net.params)
    y64 = ref_network(net, p64, x64, ids)
    y64.backward(dy.cpu().double())
    assert rel_err(y.detach().cpu(), y64.detach()) < TOL
    assert rel_err(x.grad.cpu(), x64.grad) < TOL
    assert rel_err(net.params.grad.cpu(), p64.grad) < TOL
    if n > 1:
        assert torch.all(net.params.grad[n // 2] == 0)
    with torch.no_grad():  # the inference kernel path gives the same numbers
        assert torch.equal(net(x.detach(), ids if n > 1 else None), y.detach())


MODEL_CASES = [("frequency", FREQ)] + ([("hashgrid", GRID)] if HAS_GRID else [])


@pytest.mark.parametrize("name,cfg", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_network_with_input_encoding_gradients_match_float64_reference(name, cfg):
    n, batch = 4, 2000
    model = tcnn.NetworkWithInputEncoding(2, 3, cfg, NET, n_networks=n, seed=11)
    if model.encoding.params is not None:
        with torch.no_grad():
            model.encoding.params.copy_(rand(*model.encoding.params.shape, seed=7, lo=-1, hi=1))
    x = rand(batch, 2, seed=8).requires_grad_()
    ids = rand_ids(batch, n, seed=9)
    y = model(x, ids)
    dy = rand(batch, 3, seed=10, lo=-1, hi=1)
    y.backward(dy)

    x64, pn = leaf64(x), leaf64(model.network.params)
    pe = leaf64(model.encoding.params) if model.encoding.params is not None else None
    y64 = ref_network(model.network, pn, ref_encoding(model.encoding, x64, pe, ids.cpu()), ids)
    y64.backward(dy.cpu().double())
    assert rel_err(y.detach().cpu(), y64.detach()) < TOL
    assert rel_err(x.grad.cpu(), x64.grad) < TOL
    assert rel_err(model.network.params.grad.cpu(), pn.grad) < TOL
    if pe is not None:
        assert rel_err(model.encoding.params.grad.cpu(), pe.grad) < TOL


# ---------------------------------------------------------------------------------------------------------
# Zero-copy
# ---------------------------------------------------------------------------------------------------------
def _record(monkeypatch, module, name, log):
    original = getattr(module, name)

    def spy(*args):
        log.setdefault(name, []).append([a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args])
        return original(*args)

    monkeypatch.setattr(module, name, spy)


def test_zero_copy_inputs_outputs_params_and_gradients(monkeypatch, tuned):
    from tinn.kernels import mlp_array as mlp_array_kernels

    log = {}
    for name in ("forward", "backward_deltas", "reduce_tiles"):
        _record(monkeypatch, mlp_array_kernels, name, log)
    tuned(kernels="unfused")  # these kernels (the fused CUDA ones take the same tensors)
    net = tcnn.NetworkArray(32, 16, NET, n_networks=3, seed=1)  # 32 in, 16 out: aligned, tcnn pads nothing
    x = rand(512, 32, seed=1, lo=-1, hi=1).requires_grad_()
    ids = rand_ids(512, 3)
    y = net(x, ids)
    # forward(x, net_ids, order, params, acts, pre, out, ...): the caller's input, the module's parameter
    # storage, and the returned tensor is the very buffer the kernel wrote.
    f = log["forward"][-1]
    assert f[0] == x.data_ptr() and f[1] == ids.data_ptr()
    assert f[3] == net.params.data_ptr() and f[6] == y.data_ptr()
    written = {}
    for name, slot in (("backward_deltas", 9), ("reduce_tiles", 2)):  # keep the buffers the kernels write
        monkeypatch.setattr(mlp_array_kernels, name,
                            (lambda k, n, i: lambda *a: (written.__setitem__(n, a[i]), k(*a))[1])(
            getattr(mlp_array_kernels, name), name, slot))
    y.backward(torch.ones_like(y))
    # backward_deltas(dy, ..., dx, ...) wrote dL/dx, reduce_tiles(partial, tile_net, grad) dL/dparams, and
    # those buffers are the gradients autograd received. Autograd itself may copy a buffer into `.grad`
    # rather than adopt it (it copies when it sees other references: it did on CUDA and in some test
    # orders on the CPU), so the check is on the values.
    assert torch.equal(written["backward_deltas"], x.grad) and x.grad.abs().max() > 0
    assert torch.equal(written["reduce_tiles"], net.params.grad) and net.params.grad.abs().max() > 0

    # In-place changes through torch are seen by the next launch, without any re-upload: doubling every
    # weight of a 2-layer ReLU/None MLP multiplies the output by exactly 4.
    ptr = net.params.data_ptr()
    with torch.no_grad():
        y1 = net(x, ids)
        net.params.mul_(2.0)
        y2 = net(x, ids)
    assert torch.equal(y2, 4 * y1) and y1.abs().max() > 0
    # torch.optim updates in place; the kernels keep reading the same storage and see the new values.
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    net(x, ids).square().mean().backward()
    opt.step()
    assert net.params.data_ptr() == ptr
    with torch.no_grad():
        y3 = net(x, ids)
    assert log["forward"][-1][3] == ptr
    assert rel_err(y3.cpu(), ref_network(net, net.params.detach().cpu().double(), x.detach().cpu().double(), ids)) < TOL
    assert not torch.equal(y3, y2)


@needs_grid
def test_zero_copy_grid_table(monkeypatch, grid_path):
    # The lookup's kernel, on either launch path (Taichi's, or Triton's: CUDA's default), reads the parameter
    # and input tensors' own storage.
    if grid_path == "triton":
        from tinn.kernels import grid_triton as module
    else:
        from tinn.kernels import grid_encoding as module

    log = {}
    name = "grid_forward"
    _record(monkeypatch, module, name, log)
    enc = tcnn.Encoding(2, GRID, n_networks=2)
    x, ids = rand(256, 2, seed=2), rand_ids(256, 2)
    with torch.no_grad():
        enc.params.copy_(rand(*enc.params.shape, seed=3, lo=-1, hi=1))
        y1 = enc(x, ids)
        assert enc.params.data_ptr() in log[name][-1] and x.data_ptr() in log[name][-1]
        enc.params.mul_(2.0)  # the output is linear in the table: exactly doubles
        assert torch.equal(enc(x, ids), 2 * y1)


# ---------------------------------------------------------------------------------------------------------
# Validation: clear errors; non-contiguous inputs are made contiguous
# ---------------------------------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    model = tcnn.NetworkWithInputEncoding(2, 3, FREQ, NET, n_networks=3)
    x, ids = rand(64, 2), rand_ids(64, 3)
    other = torch.device("meta")  # (a CPU tensor given to a CUDA module moves, as in tcnn: test_tcnn_function.py)
    with pytest.raises(InputError, match=f"input is on {other.type}.*expects tensors on {DEV.type}"):
        model(x.to(other), ids)
    with pytest.raises(InputError, match="net_ids is on"):
        model(x, ids.to(other))
    core = tinn.NetworkWithInputEncoding(2, 3, FREQ, NET, n_networks=3)  # tcnn's names cast, tinn's refuse
    with pytest.raises(InputError, match=r"dtype torch\.float64; allowed: torch\.float32"):
        core(x.double(), ids)
    with pytest.raises(InputError, match=r"dtype torch\.float16"):
        core(x.half(), ids)
    with pytest.raises(InputError, match="last dimension 3; expected 2"):
        model(rand(64, 3), ids)
    with pytest.raises(InputError, match=r"shape \(batch, 2\)"):
        model(x.reshape(-1), ids)
    with pytest.raises(InputError, match="net_ids is required"):
        model(x)
    with pytest.raises(InputError, match=r"net_ids contains 3; allowed: 0 <= id < n_networks=3"):
        model(x, torch.full((64,), 3, dtype=torch.int32, device=DEV))
    with pytest.raises(InputError, match="net_ids contains -1"):
        model(x, torch.full((64,), -1, dtype=torch.int32, device=DEV))
    with pytest.raises(InputError, match=r"net_ids must have shape \(64,\)"):
        model(x, ids[:10])
    with pytest.raises(InputError, match="net_ids has dtype torch.float32"):
        model(x, ids.float())
    net = tcnn.Network(24, 3, NET)
    with pytest.raises(InputError, match="last dimension 2; expected 24"):
        net(x)
    # A module converted away from float32 is caught before any kernel reads the table.
    net.double()
    with pytest.raises(InputError, match="float32 parameters"):
        net(rand(8, 24))
    if HAS_GRID:
        enc = tcnn.Encoding(2, GRID).half()
        with pytest.raises(InputError, match="float32 parameters"):
            enc(x)


def test_non_contiguous_inputs_are_made_contiguous():
    model = tcnn.NetworkWithInputEncoding(2, 3, FREQ, NET, n_networks=3)
    wide = rand(500, 4, seed=4).requires_grad_()
    ids_wide = rand_ids(1000, 3, seed=5)
    x, ids = wide[:, ::2], ids_wide[::2]  # strided views
    assert not x.is_contiguous() and not ids.is_contiguous()
    y = model(x, ids)
    y.backward(torch.ones_like(y))
    xc = x.detach().clone().requires_grad_()
    yc = model(xc, ids.clone())
    yc.backward(torch.ones_like(yc))
    assert torch.equal(y, yc)
    assert torch.equal(wide.grad[:, ::2], xc.grad) and torch.all(wide.grad[:, 1::2] == 0)
    # A transposed (column-major) input too.
    xt = x.detach().t().contiguous().t()
    assert not xt.is_contiguous() and torch.equal(model(xt, ids), y)
    # int64 ids are accepted (converted to int32).
    assert torch.equal(model(xc, ids.long()), y)


# ---------------------------------------------------------------------------------------------------------
# Composition with torch layers and torch.optim
# ---------------------------------------------------------------------------------------------------------
class Hybrid(torch.nn.Module):
    """torch.nn.Linear -> sigmoid -> tinn array (net picked by the sign of the first input) -> torch head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pre = torch.nn.Linear(4, 2).to(DEV)
        self.tinn = tcnn.NetworkWithInputEncoding(2, 3, FREQ, NET, n_networks=2, seed=21)
        self.head = torch.nn.Linear(3, 1).to(DEV)

    def forward(self, x):
        ids = (x[:, 0] > 0).to(torch.int32)
        return self.head(self.tinn(torch.sigmoid(self.pre(x)), ids)), ids

    def reference(self, x, ids, p):
        """float64 re-implementation with the parameters `p` (name -> tensor)."""
        h = torch.sigmoid(x @ p["pre.weight"].t() + p["pre.bias"])
        enc = ref_frequency(h, FREQ["n_frequencies"])
        out = ref_network(self.tinn.network, p["tinn.network.params"], enc, ids)
        return out @ p["head.weight"].t() + p["head.bias"]


def test_torch_layers_before_and_after_train_with_torch_optim():
    model = Hybrid()
    x = rand(2048, 4, seed=12, lo=-1, hi=1)
    target = (torch.sin(3 * x[:, :1]) * x[:, 1:2] + 0.5 * x[:, 2:3] * x[:, 3:4]).detach()

    # One step's gradients of the torch layers on both sides match a float64 re-implementation.
    out, ids = model(x)
    (out - target).square().mean().backward()
    ref = {n: p.detach().cpu().double().requires_grad_() for n, p in model.named_parameters()}
    (model.reference(x.cpu().double(), ids.cpu(), ref) - target.cpu().double()).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name
        assert rel_err(p.grad.cpu(), ref[name].grad) < TOL, name

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(150):
        opt.zero_grad()
        out, _ = model(x)
        loss = (out - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])
    for name, p in model.named_parameters():  # every part trained, the torch layer in front included
        assert not torch.equal(p.detach(), before[name]), name


# ---------------------------------------------------------------------------------------------------------
# state_dict
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,cfg", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_state_dict_round_trip(name, cfg):
    n = 3
    src = tcnn.NetworkWithInputEncoding(2, 3, cfg, NET, n_networks=n, seed=1)
    with torch.no_grad():  # make the state differ from any fresh init
        for p in src.parameters():
            p.add_(rand(*p.shape, seed=13, lo=-0.1, hi=0.1))
    expected_keys = {"network.params"} | ({"encoding.params"} if src.encoding.params is not None else set())
    assert set(src.state_dict()) == expected_keys
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, map_location=DEV)

    dst = tcnn.NetworkWithInputEncoding(2, 3, cfg, NET, n_networks=n, seed=2)
    x, ids = rand(400, 2, seed=14), rand_ids(400, n)
    with torch.no_grad():
        assert not torch.equal(dst(x, ids), src(x, ids))
        ptrs = [p.data_ptr() for p in dst.parameters()]
        dst.load_state_dict(state)
        assert [p.data_ptr() for p in dst.parameters()] == ptrs  # loaded in place: kernels read the same storage
        assert torch.equal(dst(x, ids), src(x, ids))
    # assign=True swaps in new Parameter objects: the modules follow them.
    third = tcnn.NetworkWithInputEncoding(2, 3, cfg, NET, n_networks=n, seed=3)
    third.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
    with torch.no_grad():
        assert torch.equal(third(x, ids), src(x, ids))
    # Shape mismatches are refused by torch.
    with pytest.raises(RuntimeError, match="size mismatch"):
        tcnn.NetworkWithInputEncoding(2, 3, cfg, NET, n_networks=n + 1).load_state_dict(state)


def test_network_state_dict_key_is_tcnns():
    a, b = tcnn.Network(24, 3, NET, seed=1), tcnn.Network(24, 3, NET, seed=2)
    assert list(a.state_dict()) == ["params"]
    b.load_state_dict(a.state_dict())
    x = rand(32, 24, seed=15)
    assert torch.equal(a(x), b(x))


# ---------------------------------------------------------------------------------------------------------
# CUDA streams (GPU only: on the CPU backend there are no streams to order)
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(DEV.type != "cuda", reason="stream ordering only exists on CUDA")
def test_foreign_stream_is_seen():
    from tinn.runtime import foreign_stream  # stream ordering lives in the runtime
    assert foreign_stream() is None
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert foreign_stream() == side
    with torch.cuda.stream(torch.cuda.default_stream(DEV)):
        assert foreign_stream() is None


@pytest.mark.skipif(DEV.type != "cuda", reason="stream ordering only exists on CUDA")
def test_side_stream_gives_the_default_stream_results():
    model = tcnn.NetworkWithInputEncoding(2, 3, FREQ, NET, n_networks=4, seed=5)
    batch = 1 << 18
    src, ids = rand(batch, 2, seed=16), rand_ids(batch, 4)
    dy = rand(batch, 3, seed=17, lo=-1, hi=1)
    x_ref = src.clone().requires_grad_()
    y_ref = model(x_ref, ids)
    y_ref.backward(dy)
    g_ref = model.network.params.grad.clone()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        # Slow work on the side stream produces the input: a launch that did not wait would read garbage.
        a = torch.randn(4096, 4096, device=DEV)
        for _ in range(8):
            a = torch.tanh(a @ a)
        x = torch.empty_like(src)
        x.copy_(src + 0.0 * a[:1, :1].clamp(0, 0))
        x.requires_grad_()
        y = model(x, ids)
        y2 = y * 1.0  # a torch op on the side stream right after: must see the kernel's output
        y.backward(dy)
        grad = model.network.params.grad * 1.0
    torch.cuda.synchronize()
    assert torch.equal(y2, y_ref.detach())
    assert rel_err(grad, g_ref) < 1e-5 and rel_err(x.grad, x_ref.grad) < 1e-5


# ---------------------------------------------------------------------------------------------------------
# The ported tcnn sample
# ---------------------------------------------------------------------------------------------------------
@needs_grid
def test_pytorch_demo_reaches_psnr(tmp_path):
    import mlp_learning_an_image_pytorch as demo

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"encoding": GRID | {"log2_hashmap_size": 12, "base_resolution": 4,
                                                      "per_level_scale": 1.4},
                                  "network": NET}))
    out = tmp_path / "run"
    summary = demo.run(["--config", str(config), "--size", "64", "--tiles", "2", "--steps", "150", "--batch", "4096",
                        "--log-every", "50", "--out", str(out)])
    assert summary["n_networks"] == 4 and summary["steps"] == 150
    psnrs = [h["psnr"] for h in summary["history"]]
    assert summary["final_psnr"] > 24.0, summary["history"]
    assert psnrs[0] < psnrs[-1] and summary["history"][-1]["loss"] < summary["history"][0]["loss"]
    for name in ("reference.png", "step_000150.png", "result.png", "summary.json"):
        assert (out / name).exists(), name
    # tcnn's "equivalent, but slower" Sequential(Encoding, Network) variant runs too.
    seq = demo.run(["--config", str(config), "--size", "32", "--sequential", "--steps", "10", "--batch", "1024",
                    "--out", str(tmp_path / "seq")])
    assert seq["sequential"] and math.isfinite(seq["final_psnr"]) and seq["final_psnr"] > 5.0
