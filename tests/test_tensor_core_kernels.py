"""Tensor-core (Triton) MLP-array kernels under Triton's CPU interpreter, against the float64 reference.

The interpreter runs the kernels' Python with numpy, so toy sizes and BM=16. It does not reproduce GPU
compilation (benchmarks/tools/tensor_core_check.py checks the same paths on a GPU).
"""
import os

import pytest
import torch

from tinn.activations import ACTIVATIONS
from tinn.kernels.mlp_array import MLPShape
from tinn.networks import NetworkArray
from tinn.routing import route_fused

# Triton reads TRITON_INTERPRET as it decorates kernels (its own library's too, on its import), so the whole
# process runs Triton interpreted from here: only where no GPU would run Triton's compiled kernels.
if torch.cuda.is_available():
    pytest.skip("a GPU is present: these are the CPU interpreter's tests (on a GPU: "
                "benchmarks/tools/tensor_core_check.py)", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
from tinn.kernels import tensor_cores as tc  # noqa: E402
from tinn.kernels.tensor_cores import launch  # noqa: E402

if not launch._interpreting():
    pytest.skip("Triton was imported uninterpreted earlier in this process", allow_module_level=True)

from reference import mlp_array_float64, rel_err  # noqa: E402
from tensor_core_reference import emulated  # noqa: E402

BM = 16
# Relative error (norm) allowed against the float64 model of the kernels' rounding (tensor_core_reference): the
# kernels accumulate in float32 (TF32 is exact float32 under the interpreter). Against exact float64 the 16-bit
# precisions differ by their rounding, which a ReLU network amplifies in dx and dparams (a pre-activation rounded
# across zero flips a mask): only a loose bound there.
TOL = {"float32": 1e-5, "tf32": 1e-5, "float16": 1e-4, "bfloat16": 1e-4}
TOL_EXACT = {"float32": 1e-5, "tf32": 1e-5, "float16": 5e-2, "bfloat16": 1.5e-1}
ACTS = list(ACTIVATIONS)


def test_kernels_run_interpreted():
    from triton.runtime.interpreter import InterpretedFunction
    from tinn.kernels.tensor_cores import mlp
    assert isinstance(mlp.forward_kernel, InterpretedFunction) and isinstance(mlp.backward_kernel, InterpretedFunction)
    assert tc.available() == (True, "")


def test_batch_dependent_strides_take_the_variant_that_does_not_specialise_on_them():
    """A feature-major input's stride is the batch size; batch sizes that vary per step must reuse one compiled
    kernel, so those calls go to the variant without divisibility specialisation on the stride arguments, and
    sample-major calls keep the specialised one."""
    from tinn.kernels.tensor_cores import launch, mlp
    for kernel, any_batch in ((mlp.forward_kernel, mlp.forward_kernel_any_batch),
                              (mlp.backward_kernel, mlp.backward_kernel_any_batch)):
        dropped = set(any_batch.kwargs["do_not_specialize_on_alignment"])
        assert dropped <= set(mlp.BATCH_STRIDES + mlp.SCALAR_POINTERS) and dropped <= set(any_batch.arg_names)
        assert {"s_x_sample", "s_x_feature"} <= dropped
        # the tile lists' pointers in both variants (the lists are slices at batch-dependent offsets)
        assert set(kernel.kwargs["do_not_specialize_on_alignment"]) == dropped & set(mlp.SCALAR_POINTERS) != set()
    aligned, any_batch = mlp.forward_kernel, mlp.forward_kernel_any_batch
    feature_major = torch.empty(5, 1000).t()  # (1000 samples, 5 features): strides (1, 1000)
    assert launch._kernel_for(aligned, any_batch, 1000, *feature_major.stride()) is any_batch
    assert launch._kernel_for(aligned, any_batch, 1000, *torch.empty(1000, 5).stride()) is aligned
    assert launch._kernel_for(aligned, any_batch, 1000, 16, 1, 0) is aligned  # a broadcast dy (stride 0)
    from tinn.kernels.tensor_cores import tiles
    assert all(tiles.slots(batch, 7, 64) % 4 == 0 for batch in range(0, 700, 13))  # 16-byte aligned lists


def make_ids(kind, batch, n_networks, gen):
    if kind == "even":
        return (torch.arange(batch) % n_networks).to(torch.int32)
    if kind == "sorted":
        return (torch.arange(batch) * n_networks // max(batch, 1)).to(torch.int32)
    # ragged: uneven counts in shuffled order, network 1 empty
    weights = torch.rand(n_networks, generator=gen) ** 2 + 0.05
    weights[1 % n_networks] = 0.0
    return torch.multinomial(weights, batch, replacement=True, generator=gen).to(torch.int32)


RECOMPUTE = False


@pytest.fixture(autouse=True, params=[False, True], ids=["saved", "recomputed"])
def backward_kind(request):
    """Every case twice: a training forward that saves the pre-activations for the layer-by-layer backward, and
    one that saves nothing, its forward recomputed by the backward (up to RECOMPUTE_MAX_LAYERS layers)."""
    global RECOMPUTE
    RECOMPUTE = request.param
    yield
    RECOMPUTE = False


def run(n_in=5, n_out=3, width=24, hidden_layers=2, hidden="ReLU", output="None", n_networks=3, batch=70,
        precision="float32", ids="ragged", feature_major=False, input_padding=None, output_padding=0,
        chunk=48, want_dx=True, want_params=True, dy_scale=1.0, gradient_scale=None, seed=0, check=True,
        pad_output_to_hidden=True):
    """Forward (training and inference) and backward of a NetworkArray's parameters through the kernels; checks
    them against float64 and returns (out, dx, dparams, reference triple, net, ids)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = {"otype": "CutlassMLP", "n_neurons": width, "n_hidden_layers": hidden_layers, "activation": hidden,
           "output_activation": output}
    net = NetworkArray(n_in, n_out, cfg, n_networks=n_networks, seed=seed, kernels="unfused",
                       input_padding=input_padding, output_padding=output_padding)
    x = torch.rand(batch, n_in, generator=gen) * 2 - 1
    net_ids = make_ids(ids, batch, n_networks, gen)
    dy = torch.randn(batch, n_out, generator=gen) * dy_scale
    ref = mlp_array_float64(net, x, net_ids, dy, hidden, output)
    tiles, chunks = route_fused(net_ids, n_networks, (BM, chunk))
    packed = tc.pack_weights(net.params.detach(), net.shape, precision, pad_output_to_hidden)
    x_in = x.t().contiguous() if feature_major else x
    pad = net.input_padding
    recompute = RECOMPUTE and tc.recomputes(net.shape)
    out, saved = tc.forward(x_in, feature_major, tiles, packed, net.shape, save=True, input_padding=pad, block_m=BM,
                            recompute=recompute)
    assert (saved.pre is None) == (recompute or hidden_layers == 0) and saved.recompute == recompute
    dx, dparams = tc.backward(dy, saved, chunks, want_dx=want_dx, want_params=want_params,
                              gradient_scale=gradient_scale, block_m=BM)
    if feature_major and dx is not None:
        assert dx.shape == x_in.shape
        dx = dx.t()
    if check:
        scale = tc.DEFAULT_GRADIENT_SCALES[precision] if gradient_scale is None else gradient_scale
        model = emulated(net, x, net_ids, dy, hidden, output, tc.COMPUTE_DTYPES[precision], scale)
        assert out.dtype == torch.float32 and out.shape == (batch, n_out)
        for mine, exact, rounded, wanted in zip((out, dx, dparams), ref, model, (True, want_dx, want_params)):
            if wanted:
                assert mine.dtype == torch.float32 and mine.shape == exact.shape
                assert rel_err(mine, rounded) < TOL[precision]
                assert rel_err(mine, exact) < TOL_EXACT[precision]
            else:
                assert mine is None
        if want_params:
            empty = torch.bincount(net_ids.long(), minlength=n_networks) == 0
            assert torch.all(dparams[empty] == 0)
        else:
            assert dparams is None
        # Inference: the same kernel without saving, the same numbers; also through tiles of several blocks
        # each (as inference routes them), which the programs walk block by block.
        inferred, none = tc.forward(x_in, feature_major, tiles, packed, net.shape, input_padding=pad, block_m=BM)
        assert none is None and torch.equal(inferred, out)
        (long_tiles,) = route_fused(net_ids, n_networks, (3 * BM,))
        inferred, _ = tc.forward(x_in, feature_major, long_tiles, packed, net.shape, input_padding=pad, block_m=BM)
        assert torch.equal(inferred, out)
    return out, dx, dparams, ref, net, net_ids


# Every activation as a hidden and as an output activation (paired so that each appears in both roles).
@pytest.mark.parametrize("hidden,output", [(a, ACTS[(i + 3) % len(ACTS)]) for i, a in enumerate(ACTS)])
def test_activations(hidden, output):
    run(hidden=hidden, output=output, width=16)


@pytest.mark.parametrize("width", [1, 7, 16, 24, 48, 64, 128])
def test_widths(width):
    run(width=width, hidden_layers=1, hidden="Tanh")


@pytest.mark.parametrize("hidden_layers,output", [(0, "None"), (0, "Sine"), (1, "Sigmoid"), (3, "Softplus"),
                                                  (4, "None")])
def test_depths(hidden_layers, output):
    run(hidden_layers=hidden_layers, output=output, width=16, hidden="SiLU")


@pytest.mark.parametrize("n_in,n_out", [(1, 16), (3, 3), (17, 1)])
def test_input_and_output_counts(n_in, n_out):
    run(n_in=n_in, n_out=n_out, width=16)


@pytest.mark.parametrize("n_out,output", [(3, "Tanh"), (16, "None")])
def test_narrow_output_block(n_out, output):
    """The last layer's block as wide as its outputs, not the hidden width (pack_weights' option)."""
    assert tc.Geometry.of(MLPShape(5, 64, n_out, 3, 1, 0), pad_output_to_hidden=False).o == 16
    run(width=64, n_out=n_out, output=output, pad_output_to_hidden=False)


def test_wide_offsets(monkeypatch):
    """The int64 offsets that batches past int32's element offsets take (forced here by a tiny bound)."""
    assert not launch._wide_offsets(70, ((5, 1), 16))
    monkeypatch.setattr(launch, "_INT32_OFFSETS", 64)
    assert launch._wide_offsets(70, ((5, 1), 16))
    run(feature_major=True, hidden="SiLU")


def test_tcnn_padding():
    """tcnn's constant input columns (appended by the kernels) and padded output rows (zero gradient)."""
    _, _, dparams, _, net, _ = run(n_in=5, n_out=3, input_padding=(3, 1.0), output_padding=13, hidden="Sigmoid")
    fan_out, fan_in = net.layer_shapes()[-1]
    assert fan_out == 16
    last = dparams[:, -fan_out * fan_in:].view(-1, fan_out, fan_in)
    assert torch.all(last[:, 3:] == 0) and torch.any(last[:, :3] != 0)


@pytest.mark.parametrize("ids", ["even", "sorted", "ragged"])
def test_routings(ids):
    run(ids=ids, n_networks=4, batch=90)


def test_feature_major():
    run(feature_major=True, input_padding=(2, 0.5), hidden="LeakyReLU")


@pytest.mark.parametrize("chunk", [BM, 4 * BM, 256])
def test_chunk_sizes(chunk):
    """The backward's chunks: one block each, several, or a whole network (any size in one sort order)."""
    run(chunk=chunk, batch=150, n_networks=2)


@pytest.mark.parametrize("precision", ["float32", "tf32", "float16", "bfloat16"])
def test_precisions(precision):
    run(precision=precision, hidden="Tanh", output="Sigmoid")


def test_compute_dtype_input():
    """x handed in the compute dtype (as an encoding in float16 writes it) works like float32 x."""
    gen = torch.Generator().manual_seed(3)
    net = NetworkArray(4, 2, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=2,
                       kernels="unfused")
    x = (torch.rand(40, 4, generator=gen) - 0.5).half()
    ids = make_ids("ragged", 40, 2, gen)
    tiles, = route_fused(ids, 2, (BM,))
    packed = tc.pack_weights(net.params.detach(), net.shape, "float16")
    out_half, _ = tc.forward(x, False, tiles, packed, net.shape, block_m=BM)
    out_float, _ = tc.forward(x.float(), False, tiles, packed, net.shape, block_m=BM)
    assert torch.equal(out_half, out_float)


def test_float16_gradient_scale():
    """A tiny dy underflows in float16 without a scale; the scale keeps the gradients (and divides out)."""
    common = dict(precision="float16", dy_scale=1e-7, hidden="Tanh", check=False)
    _, dx1, dp1, (_, dx64, dp64), _, _ = run(gradient_scale=1.0, **common)
    _, dx2, dp2, _, _, _ = run(gradient_scale=65536.0, **common)
    assert rel_err(dp1, dp64) > 0.2 and rel_err(dx1, dx64) > 0.2
    assert rel_err(dp2, dp64) < 1e-2 and rel_err(dx2, dx64) < 1e-2


def test_want_dx_and_params():
    """Each result alone equals its value from the combined backward."""
    both = run(want_dx=True, want_params=True, check=False)
    only_dx = run(want_dx=True, want_params=False)
    only_params = run(want_dx=False, want_params=True)
    assert torch.equal(only_dx[1], both[1]) and torch.equal(only_params[2], both[2])


def test_a_backward_cut_by_network_hands_each_range_over_final():
    """With a request for pieces (tinn/gradient_pieces.py) the backward is launched once per range of networks:
    at each hand-over the range's rows already hold their final gradients (the interpreter runs launches as they
    are issued) and later ranges' rows are still zero; dx, the gradients and the fused loss equal the uncut
    backward's, for the layer-by-layer and the recomputing backward."""
    from tinn.gradient_pieces import GradientPieces

    out, dx, dparams, _, net, ids = run(n_networks=7, batch=90, chunk=16, check=False)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(90, 5, generator=gen) * 2 - 1
    tiles, chunks = route_fused(ids, 7, (BM, 16))
    packed = tc.pack_weights(net.params.detach(), net.shape, "float32")
    target = torch.randn(90, 3, generator=gen)
    for recompute in (False, True):
        for loss in (False, True):
            _, saved = tc.forward(x, False, tiles, packed, net.shape, save=True, block_m=BM, recompute=recompute)
            seen = []

            def ready(gradient, lo, hi):
                seen.append((lo, hi, gradient[lo:hi].clone(), bool((gradient[hi:] == 0).all())))
            pieces = GradientPieces(3, ready)
            dy = torch.randn(90, 3, generator=torch.Generator().manual_seed(1))

            def backward(**kw):
                if loss:
                    return tc.backward_from_loss(0, target, saved, chunks, block_m=BM, **kw)
                return tc.backward(dy, saved, chunks, block_m=BM, **kw)
            whole, cut = backward(), backward(pieces=pieces)
            assert [(lo, hi) for lo, hi, _, _ in seen] == [(0, 2), (2, 4), (4, 7)]
            assert pieces.was_handed(cut[1]) and all(later_zero for *_, later_zero in seen[:-1])
            for lo, hi, rows, _ in seen:
                assert torch.equal(rows, whole[1][lo:hi]) and rows.abs().max() > 0
            for mine, reference in zip(cut, whole):
                assert torch.equal(mine, reference)
            # A second gradient offered to the same request is computed whole and not handed over.
            again = backward(pieces=pieces)
            assert len(seen) == 3 and not pieces.was_handed(again[1]) and torch.equal(again[1], whole[1])


def test_empty_batch():
    net = NetworkArray(3, 2, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=2,
                       kernels="unfused")
    ids = torch.zeros(0, dtype=torch.int32)
    tiles, = route_fused(ids, 2, (BM,))
    packed = tc.pack_weights(net.params.detach(), net.shape, "float16")
    out, saved = tc.forward(torch.zeros(0, 3), False, tiles, packed, net.shape, save=True, block_m=BM)
    assert out.shape == (0, 2)
    dx, dparams = tc.backward(torch.zeros(0, 2), saved, block_m=BM)
    assert dx.shape == (0, 3) and torch.equal(dparams, torch.zeros_like(net.params))


def test_supported_shapes_and_errors():
    assert tc.supported(MLPShape(3, 128, 3, 3, 1, 0)) and tc.supported(MLPShape(128, 300, 3, 1, 0, 0))
    assert not tc.supported(MLPShape(3, 129, 3, 3, 1, 0)) and not tc.supported(MLPShape(129, 16, 3, 2, 1, 0))
    params = torch.zeros(1, 3 * 16 + 16 * 3)
    with pytest.raises(ValueError, match="precision"):
        tc.pack_weights(params, MLPShape(3, 16, 3, 2, 1, 0), "float64")
    with pytest.raises(ValueError, match="not supported"):
        tc.pack_weights(params, MLPShape(3, 129, 3, 2, 1, 0), "float16")


def test_without_triton():
    """Where Triton does not import, the package still imports (no Triton at import time) and says why."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['triton'] = None\n"
            "from tinn.kernels import tensor_cores as tc\n"
            "from tinn.kernels.mlp_array import MLPShape\n"
            "ok, why = tc.available()\n"
            "assert not ok and 'triton' in why, why\n"
            "assert tc.supported(MLPShape(3, 64, 3, 3, 1, 0))\n"
            "print('fine')")
    env = dict(os.environ, TINN_ARCH="cpu")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and "fine" in done.stdout, done.stderr


@pytest.mark.parametrize("precision", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shape,pad_output", [(MLPShape(5, 24, 3, 3, 1, 0), True), (MLPShape(5, 24, 3, 3, 1, 0), False),
                                              (MLPShape(17, 16, 40, 1, 0, 0), True), (MLPShape(3, 33, 3, 2, 1, 0), True)])
def test_packed_weights_are_each_layer_transposed_and_zero_padded(shape, pad_output, precision):
    """pack_weights' one gather kernel against the layout spelled out per layer: block l holds W_l^T rounded to
    the compute dtype (round to nearest even, as torch casts), zeros elsewhere; a parameter row with tcnn's
    padded output rows and a strided (non-contiguous) row alike."""
    n = 3
    fans = launch.Geometry.of(shape, pad_output).fans
    row = sum(o * i for o, i in fans) + 7          # trailing columns the packing must not read
    wide = torch.randn(n, row * 2, generator=torch.Generator().manual_seed(4))
    params = wide[:, ::2]                           # column stride 2
    packed = tc.pack_weights(params, shape, precision, pad_output)
    g = packed.geometry
    expected = torch.zeros(n, g.packed_size, dtype=launch.COMPUTE_DTYPES[precision])
    for (fan_out, fan_in), p_off, (kin, kout), w_off in zip(g.fans, g.param_offsets, g.blocks, g.packed_offsets):
        w = params[:, p_off:p_off + fan_out * fan_in].reshape(n, fan_out, fan_in).transpose(1, 2)
        expected[:, w_off:w_off + kin * kout].view(n, kin, kout)[:, :fan_in, :fan_out] = w.to(expected.dtype)
    assert packed.weights.dtype == expected.dtype and packed.row_length == row
    assert torch.equal(packed.weights, expected)


@pytest.mark.parametrize("n_networks,batch,sizes", [(5, 300, (16, 64)), (1, 200, (16,)), (40, 30, (16, 32)),
                                                    (7, 0, (16,)), (3, 2100, (16, 1024))])
def test_tile_lists_hold_the_tiles_of_the_torch_routing(n_networks, batch, sizes):
    """The one-kernel tile lists against tinn.routing's: the same tiles (network, first sorted position, count)
    over the same sort, the other slots empty, every sample in exactly one tile per size; empty networks and
    more networks than samples included."""
    from tinn.kernels.tensor_cores import tiles
    from tinn.routing import sorted_bounds
    gen = torch.Generator().manual_seed(batch + n_networks)
    ids = torch.randint(0, n_networks, (batch,), generator=gen, dtype=torch.int32)
    if n_networks > 4:
        ids[ids == 2] = 3                                   # network 2 left empty
    order, bounds = sorted_bounds(ids, n_networks)
    mine = tiles.tile_lists(order, bounds, batch, sizes, interpreted=True)
    theirs = route_fused(ids, n_networks, sizes)
    for size, a, b in zip(sizes, mine, theirs):
        assert torch.equal(a.order, b.order)
        assert a.tile_net.shape[0] == tiles.slots(batch, n_networks, size)
        real = lambda r: sorted(zip(*(t[r.tile_count > 0].tolist() for t in (r.tile_net, r.tile_start,  # noqa: E731
                                                                               r.tile_count))))
        assert real(a) == real(b)
        covered = torch.zeros(batch, dtype=torch.int64)
        for net, start, count in real(a):
            assert 0 < count <= size and (ids[a.order[start:start + count].long()] == net).all()
            covered[start:start + count] += 1
        assert (covered == 1).all()


def test_the_backward_recomputes_up_to_four_layers():
    assert [tc.recomputes(MLPShape(5, 16, 3, n, 1, 0)) for n in (1, 4, 5)] == [True, True, False]
    net = NetworkArray(5, 3, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 4}, n_networks=1,
                       kernels="unfused")
    (tiles,) = route_fused(torch.zeros(4, dtype=torch.int32), 1, (BM,))
    packed = tc.pack_weights(net.params.detach(), net.shape, "float32")
    with pytest.raises(ValueError, match="recomputes at most 4 layers"):
        tc.forward(torch.zeros(4, 5), False, tiles, packed, net.shape, save=True, recompute=True)


def test_inference_tiles_keep_the_gpu_busy_then_grow_to_the_longest():
    """An inference program walks a tile block by block: tiles are whole blocks, as long as the batch still makes
    INFERENCE_PROGRAMS of them, at most MAX_INFERENCE_TILE samples, and never shorter than one block."""
    from tinn.networks.tensor_cores import INFERENCE_PROGRAMS, MAX_INFERENCE_TILE, inference_tile
    for block in (16, 64, 128):
        for batch in (0, 1, 100, 2**16, 2**19, 2**20 + 7, 2**22, 3 * 10**6, 2**27):
            tile = inference_tile(batch, block)
            assert tile % block == 0 and block <= tile <= max(block, MAX_INFERENCE_TILE)
            if tile > block:
                assert batch // tile >= INFERENCE_PROGRAMS
            if tile + block <= MAX_INFERENCE_TILE:
                assert batch // (tile + block) < INFERENCE_PROGRAMS
    assert [inference_tile(1 << k, 128) for k in (18, 20, 21, 22, 24)] == [128, 256, 512, 1024, 1024]


@pytest.mark.parametrize("batch,sms", [(1 << 18, 132), (1 << 18, 114), (1 << 20, 132), (1 << 22, 132), (5000, 132)])
def test_a_single_networks_backward_chunks_fill_the_gpu_twice(batch, sms):
    """One network's backward chunks all add into the same weights: about two per SM (a power of two of samples,
    a multiple of the tile), never fewer samples than an array's smallest chunk; arrays keep their rule."""
    from tinn.networks import tensor_cores as path
    chunk = path.chunk_size(batch, BM, 1, sms)
    assert chunk % BM == 0 and chunk >= path.MIN_CHUNK and chunk <= path.MAX_SINGLE_CHUNK
    if batch >= 2 * sms * path.MIN_CHUNK:
        programs = batch / chunk
        assert sms <= programs <= 4 * sms, (chunk, programs)
    assert path.chunk_size(batch, BM, 4, sms) == max(BM, min(path.MAX_CHUNK, max(path.MIN_CHUNK, batch // 1024))
                                                     // BM * BM)
