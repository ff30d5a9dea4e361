"""Tables past Taichi's 32-bit index limit: kernels run on row-chunk views (tinn/chunks.py).

A tiny `table_chunk_elements` makes small arrays cross chunk boundaries, so the launch logic that real
tables past 2^31 floats take is exercised here at CI sizes: outputs must equal the one-launch path
exactly, gradients must match float64 references, training, optimizer steps and checkpoints must
agree with the unchunked run. The memory checks refuse what cannot fit before allocating it.
"""
import pytest
import torch

import tinn
from reference import mlp_array, mlp_array_float64, rel_err
from test_encodings_grid import assert_close, inputs, make, ref_grid
from tinn import chunks
from tinn.encodings import GridEncoding
from tinn.errors import ConfigError, DeviceMemoryError, InputError
from tinn.models import NetworkWithInputEncoding
from tinn.networks import NetworkArray
from tinn.optimizers import create_optimizer
from tinn.settings import Tuning
from tinn.trainer import Trainer

NET = {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "ReLU",
       "output_activation": "None"}
N = 5
DEV = tinn.runtime.device()


def ragged_ids(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    """Skewed counts, one network left without samples, shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.tensor([8.0, 1.0, 0.0, 3.0, 0.5] + [1.0] * (n - 5))
    return torch.multinomial(w, batch, replacement=True, generator=gen).to(torch.int32).to(DEV)


def test_row_spans_cover_the_table_within_the_limit(tuned):
    tuned(table_chunk_elements=100)
    assert chunks.row_spans(7, 30) == ((0, 3), (3, 6), (6, 7))
    assert chunks.row_spans(3, 250) == ((0, 1), (1, 2), (2, 3))   # a row over the limit: one row per launch
    assert chunks.row_spans(4, 25) == ((0, 4),)
    tuned(table_chunk_elements=chunks.LOOP_LIMIT)
    # tcnn's default 3D hash grid (16 levels, 2^19 entries, 2 features): 149 grids fit one launch, 150 not.
    p = GridEncoding(3, n_levels=16, log2_hashmap_size=19, n_networks=1).n_params_per_network()
    assert 149 * p <= chunks.LOOP_LIMIT < 150 * p
    assert chunks.row_spans(149, p) == ((0, 149),) and chunks.row_spans(150, p) == ((0, 149), (149, 150))
    tuned(table_chunk_elements=Tuning().table_chunk_elements)
    assert chunks.row_spans(151, p) == ((0, 75), (75, 150), (150, 151))   # the default: 2^30 per launch
    with pytest.raises(ConfigError, match=r"one row of the grid table holds 2147483648 elements"):
        chunks.row_spans(2, 1 << 31, "the grid table")
    with pytest.raises(ConfigError, match=r"table_chunk_elements=0 must be in \[1, 2\^31 - 2\^24\]"):
        Tuning(table_chunk_elements=0)


@pytest.mark.parametrize("acts", [("ReLU", "None"), ("SiLU", "Sigmoid")], ids=["relu", "silu-keeps-pre"])
def test_mlp_array_chunks_equal_one_launch_and_reference(acts, tuned):
    cfg = dict(NET, activation=acts[0], output_activation=acts[1])
    # tile_size 16: networks span several tiles, so tile groups also split inside a network.
    net = NetworkArray(3, 2, cfg, n_networks=N, seed=4, tile_size=16)
    p = net.n_params_per_network()
    gen = torch.Generator().manual_seed(1)
    x = (torch.rand(300, 3, generator=gen) * 2 - 1).to(DEV)
    ids = ragged_ids(300, N)
    w = torch.randn(300, 2, generator=gen).to(DEV)

    def run():
        net.params.grad = None
        xg = x.clone().requires_grad_(True)
        y = net(xg, ids)
        (y * w).sum().backward()
        return y.detach(), net.params.grad.clone(), xg.grad.clone()

    y1, gp1, gx1 = run()
    tuned(table_chunk_elements=2 * p + 1)   # rows [0, 2), [2, 4), [4, 5); partials in groups of 2 tiles
    assert len(chunks.row_spans(N, p)) == 3
    y2, gp2, gx2 = run()
    assert torch.equal(y1, y2) and torch.equal(gx1, gx2)   # one thread per sample: same order of operations
    torch.testing.assert_close(gp2, gp1, rtol=1e-6, atol=1e-6 * float(gp1.abs().max()))  # atomics: any order

    pr = net.params.detach().double().requires_grad_(True)
    xr = x.double().requires_grad_(True)
    yr = mlp_array(net, pr, xr, ids, *acts)
    (yr * w.double()).sum().backward()
    torch.testing.assert_close(y2.double(), yr.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gp2.double(), pr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gx2.double(), xr.grad, rtol=1e-4, atol=1e-5)
    assert gp2[2].abs().max() == 0 and gp2[4].abs().max() > 0  # the network without samples gets nothing


def test_fused_launchers_cover_every_chunk_once(monkeypatch, tuned):
    """The fused CUDA kernels do not compile on the CPU; their launchers are checked by recording what
    each launch receives: the chunk view of the table and the chunk's first row."""
    from tinn.kernels import mlp_fused
    from tinn.kernels.mlp_array import MLPShape
    from tinn.routing import route_fused

    calls = {}
    for name, slot, lo_slot in (("forward", 5, -1), ("backward_deltas", 5, -5), ("weight_gradients", 8, -1)):
        monkeypatch.setattr(mlp_fused, name, (lambda n, s, l: lambda *a: calls.setdefault(n, []).append(
            (a[s].data_ptr(), a[s].shape[0], a[l])))(name, slot, lo_slot))
    params = torch.zeros(7, 100, device=DEV)
    tuned(table_chunk_elements=250)
    ids = ragged_ids(64, 7)
    tiles = route_fused(ids, 7, (64,))[0]
    shape, geom = MLPShape(4, 16, 4, 2, 0, 0), mlp_fused.Geometry(64, 16, 32)
    b = torch.empty(1, 1, device=DEV)
    mlp_fused.run_forward(b, tiles, params, shape, geom, acts=b, out=b, keep_all=True, x_feature_major=False)
    mlp_fused.run_backward_deltas(b, tiles, params, shape, geom, acts=b, out=b, deltas=b, dout=b, dx=b, want_dx=False,
                                  x_feature_major=False)
    mlp_fused.run_weight_gradients(b, tiles, shape, geom, acts=b, deltas=b, dout=b, dparams=params,
                                   x_feature_major=False)
    expect = [(params[lo].data_ptr(), hi - lo, lo) for lo, hi in ((0, 2), (2, 4), (4, 6), (6, 7))]
    assert calls == {"forward": expect, "backward_deltas": expect, "weight_gradients": expect}
    calls.clear()
    tuned(table_chunk_elements=700)
    mlp_fused.run_forward(b, tiles, params, shape, geom, acts=b, out=b, keep_all=True, x_feature_major=False)
    assert calls["forward"] == [(params.data_ptr(), 7, 0)]  # one chunk: the table itself, no view


@pytest.mark.parametrize("lanes,triton", [(True, False), (False, False), (None, True)],
                         ids=["feature-lanes", "sample-threads", "triton"])
def test_grid_chunks_equal_one_launch_and_reference(lanes, triton, tuned):
    if triton:
        from tinn.kernels import triton_available
        if not triton_available():
            pytest.skip("Triton is not installed")
    tuned(feature_lanes=lanes, triton_grid_kernels=triton)
    enc = make(3, N, n_levels=4, n_features_per_level=2, log2_hashmap_size=8, base_resolution=4,
               per_level_scale=1.7)
    x = inputs(enc, 200)[0].to(DEV)
    ids = ragged_ids(200, N, seed=2)
    w = torch.randn(200, enc.n_output_dims, generator=torch.Generator().manual_seed(3)).to(DEV)

    def run(need_dx):
        enc.params.grad = None
        xg = x.clone().requires_grad_(need_dx)
        y = enc(xg, ids)
        (y * w).sum().backward()
        return y.detach(), enc.params.grad.clone(), (xg.grad.clone() if need_dx else None)

    one = [run(False), run(True)]
    tuned(feature_lanes=lanes, triton_grid_kernels=triton, table_chunk_elements=2 * enc.n_params_per_network())
    many = [run(False), run(True)]
    for (y1, g1, _), (y2, g2, _) in zip(one, many):
        assert torch.equal(y1, y2), (y1 - y2).abs().max()
        assert_close(g2, g1, rtol=1e-6, atol_frac=1e-6, what="d/dparams, chunked against one launch")
    # dx sums its levels with atomics, in whatever order the threads run: equal up to that order.
    assert_close(many[1][2], one[1][2], rtol=1e-6, atol_frac=1e-6, what="d/dx, chunked against one launch")

    xr = x.double().requires_grad_(True)
    pr = enc.params.detach().double().requires_grad_(True)
    (ref_grid(enc, xr, pr, ids) * w.double()).sum().backward()
    assert_close(many[1][1], pr.grad, what="d/dparams, chunked")
    assert_close(many[1][2], xr.grad, rtol=1e-4, atol_frac=1e-4, what="d/dx, chunked")
    assert many[1][1][ids.unique().long()].abs().amax(1).min() > 0  # every grid with samples was reached


def test_grid_second_order_in_chunks(tuned):
    tuned(table_chunk_elements=1)   # one grid per launch
    enc = make(2, 3, n_levels=3, n_features_per_level=2, log2_hashmap_size=6, base_resolution=3,
               per_level_scale=1.6)
    x, ids = (t.to(DEV) for t in inputs(enc, 40))

    def loss(encode, x_):
        gx, = torch.autograd.grad(encode(x_).sin().sum(), x_, create_graph=True)
        return gx.square().sum()

    x1 = x.clone().requires_grad_(True)
    loss(lambda x_: enc(x_, ids), x1).backward()
    xr = x.double().requires_grad_(True)
    pr = enc.params.detach().double().requires_grad_(True)
    loss(lambda x_: ref_grid(enc, x_, pr, ids), xr).backward()
    assert_close(enc.params.grad, pr.grad, rtol=1e-4, atol_frac=1e-4, what="d2/dparams, chunked")
    assert_close(x1.grad, xr.grad, rtol=1e-3, atol_frac=1e-4, what="d2/dx, chunked")


def _model(seed=3):
    enc = {"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 7,
           "base_resolution": 4, "per_level_scale": 1.5}
    return NetworkWithInputEncoding(2, 3, enc, NET, n_networks=N, seed=seed)


def _batch(seed=5, batch=256):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, 2, generator=gen).to(DEV), torch.rand(batch, 3, generator=gen).to(DEV),
            ragged_ids(batch, N, seed))


def _train(steps, limit, tuned, optimizer=None):
    tuned(table_chunk_elements=limit)
    trainer = Trainer(_model(), {"otype": "L2"}, optimizer or {"otype": "Adam", "learning_rate": 1e-2})
    x, t, ids = _batch()
    losses = [float(trainer.training_step(x, t, ids)) for _ in range(steps)]
    return trainer, losses


def test_training_in_chunks_follows_the_one_launch_run(tuned):
    ref, ref_losses = _train(4, chunks.LOOP_LIMIT, tuned)
    enc_p = ref.model.encoding.n_params_per_network()
    got, losses = _train(4, enc_p, tuned)   # grid: one network per launch; MLP rows likewise
    assert len(chunks.row_spans(N, enc_p)) == N
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for (name, a), (_, b) in zip(got.model.named_parameters(), ref.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("otype, triton", [("Adam", False), ("Adam", True), ("SGD", False), ("Novograd", False),
                                           ("EMA", False)])
def test_optimizer_step_over_chunks_equals_one_launch(otype, triton, tuned):
    """Chunked steps equal one launch bit for bit; Adam on both launch paths (`tuning.triton_step_kernels`)."""
    if triton:
        from tinn.kernels import triton_available
        if not triton_available():
            pytest.skip("Triton is not installed")
    gen = torch.Generator().manual_seed(9)
    values = [torch.randn(7, 33, generator=gen).to(DEV), torch.randn(5, 12, generator=gen).to(DEV)]
    grads = [torch.randn(v.shape, generator=gen).to(DEV) for v in values]
    grads[1][1, :4] = 0.0   # skipped elements (Adam's non-matrix rule) in a chunk of their own
    config = {"otype": otype, "learning_rate": 1e-2}
    if otype == "EMA":
        config = {"otype": "EMA", "decay": 0.9, "nested": {"otype": "Adam", "learning_rate": 1e-2}}

    def steps(limit):
        tuned(table_chunk_elements=limit, triton_step_kernels=triton)
        params = [torch.nn.Parameter(v.clone()) for v in values]
        opt = create_optimizer(config, [("network.params", params[0]), ("encoding.params", params[1])])
        opt.set_lr_scale("network.params", torch.linspace(0.5, 2.0, 7, device=DEV))
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
        return [p.detach() for p in params], opt.state_dict()

    (a, sa), (b, sb) = steps(chunks.LOOP_LIMIT), steps(40)   # 40: one row per launch for both tables
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert sa.keys() == sb.keys()
    for k in sa:
        assert (torch.equal(sa[k], sb[k]) if isinstance(sa[k], torch.Tensor) else sa[k] == sb[k]), k
    assert not torch.equal(a[0], values[0])


def test_checkpoint_of_chunked_arrays_reloads_bit_exact(tmp_path, tuned):
    trainer, _ = _train(2, 64, tuned)
    path = tmp_path / "big.tinn"
    trainer.save_checkpoint(path)
    fresh = Trainer(_model(seed=11), {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    fresh.load_checkpoint(path, strict_config=False)
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), fresh.model.named_parameters()):
        assert torch.equal(a, b), name
    sa, sb = trainer.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert sa.keys() == sb.keys() and any(isinstance(v, torch.Tensor) and v.abs().max() > 0 for v in sa.values())
    for k in sa:
        assert (torch.equal(sa[k], sb[k]) if isinstance(sa[k], torch.Tensor) else sa[k] == sb[k]), k
    x, t, ids = _batch(seed=6)
    # The loss comes from the forward (one thread per sample): bit-equal. The update after it sums
    # gradients with atomics, whose order may differ between runs.
    assert torch.equal(trainer.training_step(x, t, ids), fresh.training_step(x, t, ids))
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), fresh.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_tables_that_cannot_fit_are_refused_before_allocation(monkeypatch):
    # ~412 GB of parameters: more than this machine's MemAvailable. Allocating it first would take
    # minutes (or the machine); the error comes from the size alone.
    big = {"otype": "CutlassMLP", "n_neurons": 128, "n_hidden_layers": 5}
    with pytest.raises(DeviceMemoryError, match=r"NetworkArray\(n_networks=1048576, 98304 parameters each\) needs "
                                                r"768\.00 GiB \(824633720832 bytes: parameters 384\.00 GiB, "
                                                r"gradients 384\.00 GiB\) but the c(pu|uda) device has .* GiB \(\d+ bytes\) "
                                                r"free \(Adam's state would add another 1152\.00 GiB\)"):
        NetworkArray(128, 128, big, n_networks=1 << 20)
    with pytest.raises(DeviceMemoryError, match=r"GridEncoding\(n_networks=100000, 14229504 parameters each\)"):
        GridEncoding(3, n_levels=16, log2_hashmap_size=19, n_networks=100000)
    # Optimizer state is checked as it is created: with 1 KB "free", Adam's first moment is refused.
    net = NetworkArray(2, 2, NET, n_networks=4)
    monkeypatch.setattr(tinn.memory, "free_bytes", lambda device: 1000)
    with pytest.raises(DeviceMemoryError, match=r"optimizer state m\.params \(4 x 320 torch\.float32\) needs "
                                                r"0\.00 GiB \(5120 bytes"):
        create_optimizer({"otype": "Adam"}, list(net.named_parameters()))
    with pytest.raises(DeviceMemoryError, match=r"NetworkArray\(n_networks=4, 320 parameters each\)"):
        NetworkArray(2, 2, NET, n_networks=4)
    assert issubclass(DeviceMemoryError, MemoryError)


def test_batches_past_the_index_limit_are_refused_with_the_largest_batch():
    net = NetworkArray(1, 1, {"otype": "CutlassMLP", "n_neurons": 128, "n_hidden_layers": 5}, kernels="unfused")
    batch = chunks.LOOP_LIMIT // 640 + 1   # activations and deltas: 5 hidden layers x 128 rows per sample
    x, ids = torch.zeros(batch, 1, device=DEV), torch.zeros(batch, dtype=torch.int32, device=DEV)
    with pytest.raises(InputError, match=rf"NetworkArray: a batch of {batch} samples needs {batch * 640} elements "
                                         r"of activations and deltas \(5, 128, batch\), more than a kernel can index "
                                         rf"\(2\^31 - 2\^24\); split it into batches of at most {batch - 1} samples"):
        net.forward_with_context(x, ids, train=True)
    net.forward_with_context(x[:1000], ids[:1000], train=True)  # (a batch below the limit runs)
    enc = GridEncoding(2, n_levels=128, n_features_per_level=8, log2_hashmap_size=2, base_resolution=2,
                       per_level_scale=1.0)
    batch = chunks.LOOP_LIMIT // 1024 + 1
    with pytest.raises(InputError, match=rf"GridEncoding: a batch of {batch} samples .* at most {batch - 1} samples"):
        enc.forward_with_context(torch.zeros(batch, 2, device=DEV), torch.zeros(batch, dtype=torch.int32, device=DEV),
                                 train=False)


def test_dense_single_network_batches_pass_the_kernels_index_limit(monkeypatch, tuned):
    """A single network as dense GEMMs keeps its activations and deltas in torch alone (64-bit indexing): a batch
    whose scratch buffers pass the kernels' limit (lowered here) trains, with float64's results; its inputs and
    outputs, which other parts' kernels read, keep the limit, and so do the scratch buffers once Taichi's kernel
    computes the weight gradients from them."""
    tuned(dense_single_network=True)
    monkeypatch.setattr(chunks, "LOOP_LIMIT", 20000)
    cfg = {"otype": "CutlassMLP", "n_neurons": 32, "n_hidden_layers": 3, "activation": "Tanh"}
    net = NetworkArray(5, 2, cfg, seed=4)
    assert net.dense
    gen = torch.Generator().manual_seed(8)
    x = (torch.rand(3000, 5, generator=gen) * 2 - 1).to(DEV)   # activations and deltas: 3 x 32 x 3000 elements
    dy = torch.randn(3000, 2, generator=gen).to(DEV)
    x_req = x.clone().requires_grad_()
    y = net(x_req, None)
    y.backward(dy)
    want = mlp_array_float64(net, x, torch.zeros(3000, dtype=torch.int32, device=DEV), dy, "Tanh", "None")
    for got, ref in zip((y, x_req.grad, net.params.grad), want):
        assert rel_err(got, ref) < 1e-5
    with pytest.raises(InputError, match=r"NetworkArray: a batch of 5000 samples needs 25000 elements of inputs"):
        net(torch.zeros(5000, 5, device=DEV), None)
    tuned(dense_single_network=True, vendor_weight_gradients=False)
    kernel_grads = NetworkArray(5, 2, cfg, seed=4)
    assert kernel_grads.dense
    with pytest.raises(InputError, match=r"needs 288000 elements of activations and deltas \(3, 32, batch\)"):
        kernel_grads(x, None)


def test_tensor_core_steps_that_keep_no_activations_pass_the_kernels_index_limit(monkeypatch, tuned):
    """The tensor-core kernels switch to 64-bit offsets where an operand needs them, and their recomputing training
    step and their inference keep no per-sample buffer of their own: a batch whose activations would pass the
    Taichi kernels' limit (lowered here) runs, with the results it gives under the usual limit; the inputs and
    outputs, which other parts' kernels read, keep the limit, and so does a training forward that saves its
    pre-activations (the backward not recomputing). Under Triton's interpreter on the CPU."""
    from tinn.losses import Loss

    tuned(precision="float32", kernels="tensor_cores")
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 2, "activation": "ReLU",
           "output_activation": "None"}
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(1000, 4, generator=gen).to(DEV)          # activations: 2 x 16 x 1000 elements, inputs 4 x 1000
    target = torch.rand(1000, 2, generator=gen).to(DEV)
    ids = torch.randint(0, 3, (1000,), generator=gen, dtype=torch.int32).to(DEV)
    net = NetworkArray(4, 2, cfg, n_networks=3, seed=9)
    assert net.tensor_cores is not None and net.tensor_cores.recomputes()
    want_grads, want_loss = net.gradients_from_loss(x, ids, Loss("L2"), target, need_dx=False)[1:]
    want_y = net(x, ids)
    monkeypatch.setattr(chunks, "LOOP_LIMIT", 20000)
    got_grads, got_loss = net.gradients_from_loss(x, ids, Loss("L2"), target, need_dx=False)[1:]
    assert torch.equal(got_grads[0], want_grads[0]) and torch.equal(got_loss, want_loss)
    assert float(want_grads[0].abs().max()) > 0
    assert torch.equal(net(x, ids), want_y)
    with pytest.raises(InputError, match=r"NetworkArray: a batch of 6000 samples needs 24000 elements of inputs"):
        net.gradients_from_loss(torch.zeros(6000, 4, device=DEV), torch.zeros(6000, dtype=torch.int32, device=DEV),
                                Loss("L2"), torch.zeros(6000, 2, device=DEV), need_dx=False)
    tuned(precision="float32", kernels="tensor_cores", tensor_core_recompute=False)
    assert not net.tensor_cores.recomputes()
    with pytest.raises(InputError, match=r"needs 32000 elements of activations and deltas \(2, 16, batch\)"):
        net.forward_with_context(x, ids, train=True)


@pytest.mark.skipif(tinn.runtime.arch() != "cuda", reason="2^24 samples: a GPU's size")
def test_a_tensor_core_batch_past_the_activation_limit_trains_like_its_halves(tuned):
    """2^24 samples through the MLP-only array of benchmarks/bench_sharded.py (32 in, two hidden layers of 64, 16 out,
    float16 on the tensor cores): its activations and deltas would need 2^31 elements, past the Taichi kernels'
    limit, and the recomputing step keeps none. Its loss and weight gradients equal those of its two halves, each
    averaged over the whole batch and summed."""
    from tinn.losses import Loss

    tuned(precision="float16", kernels="tensor_cores")
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2, "activation": "ReLU",
           "output_activation": "None"}
    net = NetworkArray(32, 16, cfg, n_networks=64, seed=2)
    batch = 1 << 24
    gen = torch.Generator(device=DEV).manual_seed(6)
    x = torch.rand(batch, 32, device=DEV, generator=gen)
    target = torch.rand(batch, 16, device=DEV, generator=gen)
    ids = torch.randint(0, 64, (batch,), device=DEV, dtype=torch.int32, generator=gen)
    whole = Loss("L2")
    (grads,), loss = net.gradients_from_loss(x, ids, whole, target, need_dx=False)[1:]
    halves = [net.gradients_from_loss(x[s], ids[s], whole.averaged_over(batch * 16), target[s], need_dx=False)[1:]
              for s in (slice(0, batch // 2), slice(batch // 2, batch))]
    want = halves[0][0][0] + halves[1][0][0]
    assert float(want.abs().max()) > 0
    assert rel_err(grads, want) < 1e-3
    assert abs(float(loss) - float(halves[0][1] + halves[1][1])) < 1e-4 * float(loss)


def test_octree_big_tables_run_their_grid_table_in_chunks(tmp_path, tuned):
    """Tables past 2^31 values at CPU size: a 16-level compact (bfloat16) hash grid per node, as a thousand-node
    tree with tcnn's grid holds, with a chunk limit of about two nodes' grids, so the demo's training, rendering
    and evaluation all cross chunk boundaries; the same run with one launch per kernel must train to the same
    held-out PSNR."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import octree_lod

    argv = ["--small", "--res", "16", "--views", "6", "--test-views", "1", "--steps", "30",
            "--pyramid-levels", "1", "--samples", "16", "--batch", "256", "--max-depth", "2", "--grid-levels", "16",
            "--base-resolution", "16", "--per-level-scale", "1.5", "--log2-hashmap", "12", "--table-dtype", "bfloat16"]
    one = octree_lod.run(argv + ["--out", str(tmp_path / "one")])
    per_node = one["grid_table_floats"] // one["nodes"]
    assert per_node * one["nodes"] == one["grid_table_floats"] and per_node > one["params_per_node"] // 2
    tuned(table_chunk_elements=2 * per_node)
    many = octree_lod.run(argv + ["--out", str(tmp_path / "many")])
    assert one["grid_table_launches"] == 1 and many["grid_table_launches"] == (many["nodes"] + 1) // 2 > 1
    assert many["nodes"] == one["nodes"] > 1
    assert abs(many["psnr"] - one["psnr"]) < 0.05 and many["psnr"] > many["background_psnr"] + 3


# ---- gradient buffers through autograd: adopted, never copied ----------------------------------------------
def _backward_worker(n_networks: int) -> dict:
    """tests/backward_memory_worker.py in a fresh process (its first backward is the one that differs)."""
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, os.path.join(here, "backward_memory_worker.py"), str(n_networks)],
                          capture_output=True, text=True, timeout=900, env=dict(os.environ, TINN_ARCH="cpu"))
    assert done.returncode == 0, f"worker exited with {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_two_tables_at_peak(n_networks: int) -> dict:
    """Parameters and one gradient buffer at the peak: autograd adopts tinn's buffer on the first backward as
    on later ones (a copy would be a third table)."""
    base = _backward_worker(1)["peak_bytes"]   # interpreter, torch and Taichi without a table
    run = _backward_worker(n_networks)
    assert run["adopted"] == [True, True]
    tables = (run["peak_bytes"] - base) / run["table_bytes"]
    assert tables < 2.25, f"peak {run['peak_bytes']} bytes = base {base} + {tables:.2f} tables of {run['table_bytes']}"
    return run


def test_first_backward_adopts_the_gradient_buffer_and_peaks_at_two_tables():
    if DEV.type != "cpu":
        pytest.skip("peak resident memory is the CPU's measure")
    _assert_two_tables_at_peak(14600)   # 2^26 parameters: 256 MiB per table


@pytest.mark.slow
def test_past_2_31_parameters_autograd_peaks_at_two_tables():
    """2^31 + 4608 parameters (8 GiB a table) through autograd on the CPU: with a copy of the gradient on the
    first backward the peak was three tables, and the process was killed on a 24 GiB machine."""
    if DEV.type != "cpu":
        pytest.skip("peak resident memory is the CPU's measure")
    free = tinn.memory.free_bytes(DEV)
    if free is not None and free < 20 << 30:
        pytest.skip(f"needs 20 GiB free memory, {free >> 30} GiB available")
    run = _assert_two_tables_at_peak(466034)
    assert run["n_params"] > 1 << 31


def test_table_fits_counts_the_first_backward_copy_where_the_backend_makes_one(monkeypatch):
    """On Quadrants autograd copies a part's gradient on its first backward: the check counts a third table."""
    from tinn import memory
    seen = []
    monkeypatch.setattr(memory, "check_fits", lambda what, needs, device, note="": seen.append(needs))
    for copies, expected in ((False, 2), (True, 3)):
        monkeypatch.setattr(memory, "first_backward_copies", lambda copies=copies: copies)
        memory.table_fits("t", 10, 100, torch.device("cpu"))
        assert sum(seen[-1].values()) == expected * 4 * 10 * 100
