"""Tile routing: every sample lands in exactly one tile of its own network."""
import pytest
import torch

import tinn
from tinn import routing
from tinn.routing import route, route_bounded
from tinn.settings import Tuning

DEV = tinn.runtime.device()


def covered_samples(r, ids):
    seen = torch.zeros(ids.shape[0], dtype=torch.int64, device=ids.device)
    for net, start, count in zip(r.tile_net.tolist(), r.tile_start.tolist(), r.tile_count.tolist()):
        members = r.order[start:start + count].long()
        assert torch.all(ids[members] == net)  # a tile holds one network's samples
        seen[members] += 1
    return seen


@pytest.mark.parametrize("n_networks,batch,tile", [(1, 1000, 128), (7, 1000, 64), (64, 300, 128), (500, 3000, 128)])
def test_bounded_tiles_cover_each_sample_once(n_networks, batch, tile):
    gen = torch.Generator().manual_seed(n_networks)
    w = torch.rand(n_networks, generator=gen) ** 3
    w[::5] = 0.0 if n_networks > 1 else 1.0
    ids = torch.multinomial(w, batch, replacement=True, generator=gen).to(DEV, torch.int32)
    r = route_bounded(ids, n_networks, tile)
    assert torch.all(covered_samples(r, ids) == 1)
    assert int(r.tile_count.max()) <= tile
    # As few real tiles as the counts allow; the rest are padding (count 0).
    counts = torch.bincount(ids.long(), minlength=n_networks)
    assert int((r.tile_count > 0).sum()) == int(((counts + tile - 1) // tile).sum())
    assert r.tile_net.shape[0] >= int(((counts + tile - 1) // tile).sum())


@pytest.mark.parametrize("n_networks,key_dtype", [(2, torch.uint8), (255, torch.uint8), (256, torch.int16),
                                                    (32767, torch.int16), (32768, torch.int32), (100000, torch.int32)])
def test_sort_keys_narrow_without_changing_the_order(n_networks, key_dtype):
    """The sort runs on the narrowest key type that holds the ids and the bound n_networks; order (stable)
    and counts equal those of a stable sort of the int32 ids, the extreme ids included."""
    gen = torch.Generator().manual_seed(n_networks)
    ids = torch.randint(0, n_networks, (20000,), generator=gen, dtype=torch.int32)
    ids[:3] = torch.tensor([n_networks - 1, 0, n_networks - 1], dtype=torch.int32)
    ids = ids.to(DEV)
    assert routing.sort_keys(ids, n_networks).dtype == key_dtype
    order, counts = routing.sort_by_network(ids, n_networks)
    assert order.dtype == torch.int32 and counts.dtype == torch.int64
    assert torch.equal(order.long().cpu(), torch.sort(ids.cpu().long(), stable=True).indices)
    assert torch.equal(counts.cpu(), torch.bincount(ids.cpu().long(), minlength=n_networks))


def test_bounded_tiles_agree_with_synced_routing():
    ids = torch.tensor([3, 1, 1, 0, 3, 3, 3, 2, 1], dtype=torch.int32, device=DEV)
    a, b = route(ids, 4, tile_size=2), route_bounded(ids, 4, 2)
    real = b.tile_count > 0
    assert torch.equal(a.order, b.order)
    assert torch.equal(a.tile_net, b.tile_net[real])
    assert torch.equal(a.tile_start, b.tile_start[real])
    assert torch.equal(a.tile_end - a.tile_start, b.tile_count[real])


def test_empty_batch_has_only_padding():
    r = route_bounded(torch.zeros(0, dtype=torch.int32, device=DEV), 16, 128)
    assert int(r.tile_count.sum()) == 0


def test_fused_tiles_share_one_sort_and_reuse_equal_sizes(monkeypatch):
    """The fused path's routing: forward tiles, weight-gradient chunks and backward-deltas tiles come from
    one sort; with equal forward/backward tile sizes the backward reuses the forward's tiles."""
    from tinn.kernels import mlp_fused
    from tinn.networks import NetworkArray

    net = NetworkArray(4, 3, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=6)
    ids = torch.randint(0, 6, (5000,), dtype=torch.int32, device=tinn.runtime.device())
    for backward_tile, n_sizes in ((64, 2), (32, 3)):
        calls = []
        real = routing.route_fused
        monkeypatch.setattr("tinn.networks.array.route_fused", lambda i, n, sizes: calls.append(sizes) or real(i, n, sizes))
        net.fused_geometry = mlp_fused.Geometry(64, 16, backward_tile)
        fwd, chunks, bwd = net._fused_tiles(ids, train=True)
        assert len(calls) == 1 and len(calls[0]) == n_sizes  # one sort, one call
        assert (bwd is fwd) == (backward_tile == 64)
        for t, size in ((fwd, 64), (bwd, backward_tile)):
            counts = t.tile_count.long()
            assert int(counts.max()) <= size and int(counts.sum()) == ids.shape[0]
            assert torch.equal(t.order, chunks.order)
        assert len(net._fused_tiles(ids, train=False)) == 1


def test_fused_path_hands_each_kernel_its_tiles(monkeypatch):
    """Plumbing of the fused training path, kernels stubbed (they run on CUDA only): the forward gets the
    forward tiles and size, the deltas kernel the backward tiles and size, the weight gradients the chunks."""
    from tinn.kernels import mlp_fused
    from tinn.networks import NetworkArray

    net = NetworkArray(4, 3, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=6)
    net.fused, net.fused_geometry = True, mlp_fused.Geometry(64, 16, 32, 16, 8)
    seen = {}
    monkeypatch.setattr(mlp_fused, "forward", lambda *a: seen.setdefault("forward", a))
    monkeypatch.setattr(mlp_fused, "backward_deltas", lambda *a: seen.setdefault("deltas", a))
    monkeypatch.setattr(mlp_fused, "weight_gradients", lambda *a: seen.setdefault("wgrad", a))
    dev = tinn.runtime.device()
    ids = torch.randint(0, 6, (3000,), dtype=torch.int32, device=dev)
    x = torch.rand(3000, 4, device=dev)
    params = net.params.detach()
    out, acts, pre, fused_routing = net._forward_train(x, ids, params, False)
    net._backward(torch.ones_like(out), x, ids, params, acts, pre, out, fused_routing, True, True, False)
    fwd_counts, deltas_counts, chunk_counts = seen["forward"][4], seen["deltas"][4], seen["wgrad"][4]
    # (..., TS, F, x_feature_major, freq, KC, pad, net_lo) and
    # (..., TS, F, x_feature_major, KC, net_lo, target, loss_parts, inv_n, LOSS):
    # tile sizes and staged weight rows; dy given (no loss inside the deltas kernel)
    assert int(fwd_counts.max()) == 64 and seen["forward"][-7] == 64 and seen["forward"][-3] == 16
    assert int(deltas_counts.max()) == 32 and seen["deltas"][-9] == 32 and seen["deltas"][-6] == 8
    assert seen["deltas"][-1] == -1
    assert int(chunk_counts.max()) == mlp_fused.grad_chunk(3000)
    for counts in (fwd_counts, deltas_counts, chunk_counts):
        assert int(counts.sum()) == 3000


@pytest.mark.parametrize("n_in,width,n_out,tile,backward_tile", [
    (32, 64, 3, 64, 32),    # tcnn's image network: deltas on tiles of 32 (measured faster at width 64)
    (3, 16, 4, 64, 32),
    (32, 128, 16, 64, 64),  # width 128: not measured at 32, keeps the forward's tiles
])
def test_fused_tile_sizes_by_width(n_in, width, n_out, tile, backward_tile):
    from tinn.kernels import mlp_fused
    g = mlp_fused.geometry(n_in, width, n_out, 3, Tuning())
    assert (g.tile, g.backward_tile) == (tile, backward_tile)
    assert mlp_fused.geometry(n_in, width, n_out, 3, Tuning(fused_backward_tile=48)).backward_tile == 48


@pytest.mark.parametrize("n_in,width,n_out,staged", [
    (32, 64, 3, True),     # tcnn's image network
    (3, 16, 4, True),
    (32, 128, 16, False),  # a 128 x 128 matrix does not fit next to 64 samples' activations: read through L1
    (128, 16, 16, False),
])
def test_staged_weights_fit_in_shared_memory(n_in, width, n_out, staged):
    from tinn.kernels import mlp_fused
    g = mlp_fused.geometry(n_in, width, n_out, 3, Tuning(fused_staged_weights="both"))
    for tile, kc in ((g.tile, g.weight_rows), (g.backward_tile, g.backward_weight_rows)):
        assert kc == (g.features if staged else 0)
        # the kernels' shared array: activations, then every row of the widest matrix with an odd stride
        assert g.features * (tile + 1) + kc * (g.features + 1) <= mlp_fused.SHARED_FLOATS
    if not staged:
        return
    by_setting = {s: mlp_fused.geometry(n_in, width, n_out, 3, Tuning(fused_staged_weights=s), n_networks=64)
                  for s in ("none", "forward", "backward", "both", "auto")}
    assert [(b.weight_rows > 0, b.backward_weight_rows > 0) for b in by_setting.values()] == [
        (False, False), (True, False), (False, True), (True, True), (False, True)]
    assert Tuning().fused_staged_weights == "auto"
    # measured on the H100: the forward is faster staged with one network (the image step), through L1 with 4096
    for n_networks, forward_staged in ((1, True), (2, False), (4096, False)):
        g = mlp_fused.geometry(n_in, width, n_out, 3, Tuning(), n_networks=n_networks)
        assert (g.weight_rows > 0, g.backward_weight_rows > 0) == (forward_staged, True)
    with pytest.raises(tinn.ConfigError, match="fused_staged_weights.*allowed"):
        Tuning(fused_staged_weights="yes")
    assert mlp_fused.weight_stride(64) == 65 and mlp_fused.weight_stride(3) == 3


@pytest.mark.parametrize("n_in,width,n_out,step_of_32", [
    (32, 64, 16, 32),    # measured: weight-gradient kernel 9.29 -> 6.05 ms on the H100 (steps of 32)
    (3, 16, 1, 32),
    (32, 128, 16, 16),   # width 128: half the samples per step keep the prefetch's registers
    (128, 64, 16, 16),   # a 128-wide input needs the same
])
def test_weight_gradient_prefetch_by_features(n_in, width, n_out, step_of_32, tuned):
    from tinn.kernels import mlp_fused
    f = mlp_fused.features(n_in, width, n_out)
    assert mlp_fused.grad_prefetch(f) and mlp_fused.grad_step(f) == 16  # the default step fits every width up to 128
    tuned(fused_grad_step=32)
    step = mlp_fused.grad_step(f)
    assert mlp_fused.grad_prefetch(f) and step == step_of_32
    assert (mlp_fused.GRAD_ROWS + f) * step // mlp_fused.BLOCK <= mlp_fused.GRAD_PREFETCH_REGISTERS
    tuned(fused_grad_step=32, fused_grad_prefetch=False)
    assert not mlp_fused.grad_prefetch(f) and mlp_fused.grad_step(f) == 32  # the plain loop keeps the configured step


@pytest.mark.parametrize("n_networks,batch", [(1, 3000), (7, 1000), (64, 300), (500, 3000), (16, 0), (3, 5)])
def test_fused_routing_equals_one_routing_per_size(n_networks, batch):
    """All sizes at once give what `route_bounded` gives size by size: same tiles, same padding, each
    size's arrays contiguous (the kernels' lean launch takes contiguous tensors only)."""
    gen = torch.Generator().manual_seed(n_networks + batch)
    w = torch.rand(n_networks, generator=gen) ** 3
    w[::3] = 0.0 if n_networks > 2 else 1.0
    ids = torch.multinomial(w, batch, replacement=True, generator=gen) if batch else torch.zeros(0, dtype=torch.long)
    ids = ids.to(DEV, torch.int32)
    sizes = (64, 2048, 32)
    fused = routing.route_fused(ids, n_networks, sizes)
    for size, r in zip(sizes, fused):
        one = route_bounded(ids, n_networks, size)
        for name in ("order", "tile_net", "tile_start", "tile_count"):
            a, b = getattr(r, name), getattr(one, name)
            assert a.dtype == b.dtype == torch.int32 and a.is_contiguous(), name
            assert torch.equal(a, b), (size, name)
