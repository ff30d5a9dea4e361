"""Tile routing: every sample lands in exactly one tile of its own network."""
import pytest
import torch

import tinn
from tinn import routing
from tinn.routing import route, route_bounded

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
    from tinn.kernels import mlp_fused as FK
    from tinn.networks import NetworkArray

    net = NetworkArray(4, 3, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=6)
    ids = torch.randint(0, 6, (5000,), dtype=torch.int32, device=tinn.runtime.device())
    for backward_tile, n_sizes in ((64, 2), (32, 3)):
        calls = []
        real = routing.route_fused
        monkeypatch.setattr("tinn.networks.route_fused", lambda i, n, sizes: calls.append(sizes) or real(i, n, sizes))
        net.fused_geometry = FK.Geometry(64, 16, backward_tile)
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
    from tinn.kernels import mlp_fused as FK
    from tinn.networks import NetworkArray

    net = NetworkArray(4, 3, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=6)
    net.fused, net.fused_geometry = True, FK.Geometry(64, 16, 32, 16, 8)
    seen = {}
    monkeypatch.setattr(FK, "forward", lambda *a: seen.setdefault("forward", a))
    monkeypatch.setattr(FK, "backward_deltas", lambda *a: seen.setdefault("deltas", a))
    monkeypatch.setattr(FK, "weight_gradients", lambda *a: seen.setdefault("wgrad", a))
    dev = tinn.runtime.device()
    ids = torch.randint(0, 6, (3000,), dtype=torch.int32, device=dev)
    x = torch.rand(3000, 4, device=dev)
    params = net.params.detach()
    out, acts, pre, fused_routing = net._forward_train(x, ids, params, False)
    net._backward(torch.ones_like(out), x, ids, params, acts, pre, out, fused_routing, True, True, False)
    fwd_counts, deltas_counts, chunk_counts = seen["forward"][4], seen["deltas"][4], seen["wgrad"][4]
    # (..., TS, F, x_fm, freq, KC, RW, pad, group, net_lo) and (..., TS, F, x_fm, KC, RW, group, net_lo, target,
    # loss_parts, inv_n, LOSS): tile sizes, staged weight rows, no resident weights and so one tile per block,
    # dy given (no loss)
    assert int(fwd_counts.max()) == 64 and seen["forward"][-9] == 64 and seen["forward"][-5] == 16
    assert seen["forward"][-4] == 0 and seen["forward"][-2] == 1
    assert int(deltas_counts.max()) == 32 and seen["deltas"][-11] == 32 and seen["deltas"][-8] == 8
    assert seen["deltas"][-7] == 0 and seen["deltas"][-6] == 1 and seen["deltas"][-1] == -1
    assert int(chunk_counts.max()) == FK.grad_chunk(3000)
    for counts in (fwd_counts, deltas_counts, chunk_counts):
        assert int(counts.sum()) == 3000


@pytest.mark.parametrize("n_in,width,n_out,tile,backward_tile", [
    (32, 64, 3, 64, 32),    # tcnn's image network: deltas on tiles of 32 (measured faster at width 64)
    (3, 16, 4, 64, 32),
    (32, 128, 16, 64, 64),  # width 128: not measured at 32, keeps the forward's tiles
])
def test_fused_tile_sizes_by_width(n_in, width, n_out, tile, backward_tile):
    from tinn.kernels import mlp_fused as FK
    g = FK.geometry(n_in, width, n_out, 3, tinn.Settings())
    assert (g.tile, g.backward_tile) == (tile, backward_tile)
    assert FK.geometry(n_in, width, n_out, 3, tinn.Settings(fused_backward_tile=48)).backward_tile == 48


@pytest.mark.parametrize("n_in,width,n_out,staged", [
    (32, 64, 3, True),     # tcnn's image network
    (3, 16, 4, True),
    (32, 128, 16, False),  # a 128 x 128 matrix does not fit next to 64 samples' activations: read through L1
    (128, 16, 16, False),
])
def test_staged_weights_fit_in_shared_memory(n_in, width, n_out, staged):
    from tinn.kernels import mlp_fused as FK
    g = FK.geometry(n_in, width, n_out, 3, tinn.Settings(fused_staged_weights="both", fused_resident_weights="none"))
    for tile, kc in ((g.tile, g.weight_rows), (g.backward_tile, g.backward_weight_rows)):
        assert kc == (g.features if staged else 0)
        # the kernels' shared array: activations, then every row of the widest matrix with an odd stride
        assert g.features * (tile + 1) + kc * (g.features + 1) <= FK.SHARED_FLOATS
    if not staged:
        return
    by_setting = {s: FK.geometry(n_in, width, n_out, 3, tinn.Settings(fused_staged_weights=s, fused_resident_weights="none"),
                                 n_networks=64)
                  for s in ("none", "forward", "backward", "both", "auto")}
    assert [(b.weight_rows > 0, b.backward_weight_rows > 0) for b in by_setting.values()] == [
        (False, False), (True, False), (False, True), (True, True), (False, True)]
    assert tinn.Settings().fused_staged_weights == "auto"
    # measured on the H100: the forward is faster staged with one network (the image step), through L1 with 4096
    for n_networks, forward_staged in ((1, True), (2, False), (4096, False)):
        g = FK.geometry(n_in, width, n_out, 3, tinn.Settings(fused_resident_weights="none"), n_networks=n_networks)
        assert (g.weight_rows > 0, g.backward_weight_rows > 0) == (forward_staged, True)
    with pytest.raises(tinn.ConfigError, match="fused_staged_weights.*allowed"):
        tinn.Settings(fused_staged_weights="yes")
    assert FK.weight_stride(64) == 65 and FK.weight_stride(3) == 3


@pytest.mark.parametrize("n_in,width,n_out,n_layers,fits", [
    (32, 64, 16, 3, True),    # the target shape: 7328 floats of weights next to 64 samples' activations
    (32, 64, 3, 3, True),     # tcnn's image network
    (3, 16, 4, 5, True),
    (32, 64, 16, 4, False),   # a third 64 x 64 matrix does not fit
    (32, 128, 16, 3, False),
])
def test_resident_weights_fit_next_to_the_tile(n_in, width, n_out, n_layers, fits):
    from tinn.kernels import mlp_fused as FK
    g = FK.geometry(n_in, width, n_out, n_layers, tinn.Settings(fused_resident_weights="both"), n_networks=64)
    bases, total = FK.resident_layout(n_in, width, n_out, n_layers, False)
    shapes = FK.layer_shapes(n_in, width, n_out, n_layers)
    # each layer's M = W^T (fan_in rows, odd stride over fan_out columns), one after the other
    assert total == sum(i * FK.weight_stride(o) for o, i in shapes) and bases[0] == 0
    assert all(b1 - b0 == i * FK.weight_stride(o) for b0, b1, (o, i) in zip(bases, bases[1:], shapes))
    assert (g.resident == total) == fits and (g.resident == 0) == (not fits)
    assert g.features * (g.tile + 1) + g.resident <= FK.SHARED_FLOATS
    if fits:
        assert g.weight_rows == 0  # resident replaces the per-layer staging
        t_total = FK.resident_layout(n_in, width, n_out, n_layers, True)[1]
        assert g.backward_resident == (t_total if g.features * (g.backward_tile + 1) + t_total <= FK.SHARED_FLOATS else 0)
    # "auto": the forward of arrays of several networks only (measured on the H100)
    for n_networks, forward in ((1, False), (2, fits), (4096, fits)):
        a = FK.geometry(n_in, width, n_out, n_layers, tinn.Settings(), n_networks=n_networks)
        assert (a.resident > 0, a.backward_resident > 0) == (forward, False)
    with pytest.raises(tinn.ConfigError, match="fused_resident_weights.*allowed"):
        tinn.Settings(fused_resident_weights="always")


def test_tiles_per_block(tuned):
    from tinn.kernels import mlp_fused as FK
    sms = FK._sm_count()
    assert FK.tiles_per_block(10 ** 6, 0) == 1  # nothing shared between tiles without resident weights
    assert FK.tiles_per_block(sms * 8 * 5, 100) == 5 and FK.tiles_per_block(10 ** 6, 100) == 16
    assert FK.tiles_per_block(3, 100) == 1
    tuned(fused_tiles_per_block=7)
    assert FK.tiles_per_block(3, 100) == 7 and FK.tiles_per_block(10 ** 6, 0) == 1
    with pytest.raises(tinn.ConfigError, match="fused_tiles_per_block"):
        tinn.Settings(fused_tiles_per_block=-1)


@pytest.mark.parametrize("n_in,width,n_out,step_of_32", [
    (32, 64, 16, 32),    # measured: weight-gradient kernel 9.29 -> 6.05 ms on the H100 (steps of 32)
    (3, 16, 1, 32),
    (32, 128, 16, 16),   # width 128: half the samples per step keep the prefetch's registers
    (128, 64, 16, 16),   # a 128-wide input needs the same
])
def test_weight_gradient_prefetch_by_features(n_in, width, n_out, step_of_32, tuned):
    from tinn.kernels import mlp_fused as FK
    f = FK.features(n_in, width, n_out)
    assert FK.grad_prefetch(f) and FK.grad_step(f) == 16  # the default step fits every width up to 128
    tuned(fused_grad_step=32)
    step = FK.grad_step(f)
    assert FK.grad_prefetch(f) and step == step_of_32
    assert (FK.GRAD_ROWS + f) * step // FK.BLOCK <= FK.GRAD_PREFETCH_REGISTERS
    tuned(fused_grad_step=32, fused_grad_prefetch=False)
    assert not FK.grad_prefetch(f) and FK.grad_step(f) == 32  # the plain loop keeps the configured step


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
