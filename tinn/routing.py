"""Grouping samples by network id: the sort order and the per-network tiles.

Computed with torch ops on the device (no host loop). A *tile* is a run of at
most `tile_size` consecutive samples (in sorted order) that share a network;
backward kernels reduce weight gradients per tile.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

# (ids, bounds) of a batch its caller has already grouped by network (`grouped`), or None.
_GROUPED: contextvars.ContextVar = contextvars.ContextVar("tinn_grouped_ids", default=None)


@contextlib.contextmanager
def grouped(net_ids: torch.Tensor, bounds: torch.Tensor):
    """Within the block, `sorted_bounds` of this very ids tensor returns the identity order and `bounds`
    without sorting: a caller that grouped a batch by network (an encoded array's `group_by_network`) hands
    its sort to the parts it runs, whose routing would otherwise sort the grouped ids again (a radix sort of
    several launches, host time that a step waiting on its host pays). The tensor is matched by identity, and
    its version: an in-place change to the ids voids the hint (an inference-mode tensor keeps no version; the
    identity alone holds there)."""
    token = _GROUPED.set((net_ids, _version(net_ids), bounds))
    try:
        yield
    finally:
        _GROUPED.reset(token)


@dataclass
class Routing:
    order: torch.Tensor        # int32 (batch,): sample indices sorted by network id
    tile_net: torch.Tensor     # int32 (n_tiles,)
    tile_start: torch.Tensor   # int32 (n_tiles,) positions into `order`
    tile_end: torch.Tensor     # int32 (n_tiles,)
    counts: torch.Tensor       # int64 (n_networks,) samples per network

    @property
    def n_tiles(self) -> int:
        return self.tile_net.shape[0]


def sort_by_network(net_ids: torch.Tensor, n_networks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts): int32 sample indices grouped by network id (stable), int64 samples per network."""
    order, bounds = sorted_bounds(net_ids, n_networks)
    return order, bounds[1:] - bounds[:-1]


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place version counter; -1 for an inference-mode tensor, which keeps none."""
    return -1 if t.is_inference() else t._version


def grouped_bounds(net_ids: torch.Tensor, n_networks: int) -> torch.Tensor | None:
    """The bounds a caller's `grouped` block gave for this very ids tensor (already grouped by network), or None."""
    hint = _GROUPED.get()
    if hint is not None and hint[0] is net_ids and hint[1] == _version(net_ids) and hint[2].shape[0] == n_networks + 1:
        return hint[2]
    return None


def sorts_to_identity(net_ids: torch.Tensor, n_networks: int) -> bool:
    """Whether `sorted_bounds` returns the identity order for these ids: one network, or ids a caller's `grouped`
    block declared grouped (TileRouting.in_order)."""
    return n_networks == 1 or grouped_bounds(net_ids, n_networks) is not None


def sorted_bounds(net_ids: torch.Tensor, n_networks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, bounds): int32 sample indices grouped by network id (stable), and int64 (n_networks + 1,) bounds:
    network n's samples are order[bounds[n]:bounds[n + 1]]."""
    batch = net_ids.shape[0]
    bounds = grouped_bounds(net_ids, n_networks)
    if bounds is not None:
        return torch.arange(batch, dtype=torch.int32, device=net_ids.device), bounds
    if n_networks == 1:
        # torch.full/zeros, not torch.tensor([0, batch], device=...): a tensor from host data is a blocking copy,
        # which waits for the GPU to finish the previous step before this one can be issued.
        bounds = torch.zeros(2, dtype=torch.int64, device=net_ids.device)
        bounds[1:] = batch
        return torch.arange(batch, dtype=torch.int32, device=net_ids.device), bounds
    # Bounds from the sorted ids (a binary search per network boundary) rather than a histogram: a histogram's
    # atomics serialise when many samples share a network, and the sort has the sorted ids anyway.
    ids, order = torch.sort(sort_keys(net_ids, n_networks), stable=True)
    bounds = torch.searchsorted(ids, torch.arange(n_networks + 1, dtype=ids.dtype, device=ids.device))
    return order.to(torch.int32), bounds


def sort_keys(net_ids: torch.Tensor, n_networks: int) -> torch.Tensor:
    """The ids in the narrowest integer type that holds every id and `n_networks` itself (the searchsorted
    bound): torch's GPU sort is a radix sort with one pass per key byte, so fewer bytes are fewer passes.
    The input checks (tinn.checks) keep ids in [0, n_networks), where the cast loses nothing."""
    if n_networks <= 255:
        return net_ids.to(torch.uint8)
    if n_networks <= 32767:
        return net_ids.to(torch.int16)
    return net_ids


def route(net_ids: torch.Tensor, n_networks: int, tile_size: int = 256, tiles: bool = True) -> Routing:
    """Sort order and tiles; `tiles=False` skips the tiles (inference only needs the order)."""
    dev = net_ids.device
    order, bounds = sorted_bounds(net_ids, n_networks)
    seg_start, seg_end = bounds[:-1], bounds[1:]
    counts = seg_end - seg_start
    if not tiles:
        empty = torch.empty(0, dtype=torch.int32, device=dev)
        return Routing(order, empty, empty, empty, counts)
    tiles_per_net = (counts + tile_size - 1) // tile_size
    n_tiles = int(tiles_per_net.sum())  # the one host sync: sizes the tile arrays
    tile_net = torch.repeat_interleave(torch.arange(n_networks, device=dev), tiles_per_net, output_size=n_tiles)
    first_tile = torch.cumsum(tiles_per_net, 0) - tiles_per_net
    k = torch.arange(n_tiles, device=dev) - first_tile[tile_net]
    tile_start = seg_start[tile_net] + k * tile_size
    tile_end = torch.minimum(tile_start + tile_size, seg_end[tile_net])
    i32 = torch.int32
    return Routing(order, tile_net.to(i32), tile_start.to(i32), tile_end.to(i32), counts)


@dataclass
class TileRouting:
    """Sort order plus tiles of at most `tile_size` samples of one network, sized without a host sync."""
    order: torch.Tensor        # int32 (batch,)
    tile_net: torch.Tensor     # int32 (n_max,)
    tile_start: torch.Tensor   # int32 (n_max,) positions into `order`
    tile_count: torch.Tensor   # int32 (n_max,); 0 marks a padding tile that kernels skip
    # The order is the identity (one network, or ids the caller grouped): kernels that know it read a sample's row
    # at its sorted position instead of gathering it through `order`.
    in_order: bool = False


def route_bounded(net_ids: torch.Tensor, n_networks: int, tile_size: int,
                  presorted: tuple[torch.Tensor, torch.Tensor] | None = None) -> TileRouting:
    """Tiles for one-block-per-tile kernels; `presorted` reuses a `sorted_bounds` result.

    Network n with c samples needs ceil(c / tile_size) tiles, so the total is at
    most batch // tile_size + (networks with samples) + 1: allocating that bound
    and marking the unused tail with count 0 keeps the whole routing on the
    device (no `int(...)` sync before the launch).
    """
    order, bounds = presorted if presorted is not None else sorted_bounds(net_ids, n_networks)
    return _tiles(order, bounds, net_ids.shape[0], n_networks, (tile_size,))[0]


def route_fused(net_ids: torch.Tensor, n_networks: int, tile_sizes: tuple[int, ...]) -> tuple[TileRouting, ...]:
    """One sort, tiles of each size: the forward's tiles and the backward's chunks line up by sorted position."""
    return _tiles(*sorted_bounds(net_ids, n_networks), net_ids.shape[0], n_networks, tile_sizes)


def _tiles(order: torch.Tensor, bounds: torch.Tensor, batch: int, n_networks: int,
           tile_sizes: tuple[int, ...]) -> tuple[TileRouting, ...]:
    """`route_bounded`'s tiles for every size at once, as (sizes, tiles) tensors whose rows are then each
    size's tiles (a row prefix, contiguous): a training step's sizes cost one batch of torch ops, and on a
    GPU every op is a launch the host pays for before the step's kernels can start."""
    dev = bounds.device
    i32 = torch.int32
    sizes = _sizes_column(tile_sizes, dev)                                              # (S, 1)
    n_max = [batch // size + min(n_networks, batch) + 1 for size in tile_sizes]
    seg_start, seg_end = bounds[:-1], bounds[1:]
    counts = seg_end - seg_start
    tiles_per_net = (counts + sizes - 1) // sizes                                      # (S, N)
    last_tile = torch.cumsum(tiles_per_net, 1)                                         # inclusive, per size
    t = torch.arange(max(n_max), device=dev).expand(len(tile_sizes), -1).contiguous()  # (S, M)
    net = torch.searchsorted(last_tile, t, right=True)  # == n_networks past a size's last real tile
    valid = net < n_networks
    net.clamp_(max=n_networks - 1)
    start = seg_start[net] + (t - (last_tile - tiles_per_net).gather(1, net)) * sizes
    count = torch.minimum(seg_end[net] - start, sizes).clamp_(min=0).masked_fill_(~valid, 0)
    net, start, count = net.to(i32), start.clamp_(0, max(batch - 1, 0)).to(i32), count.to(i32)
    return tuple(TileRouting(order, net[i, :m], start[i, :m], count[i, :m]) for i, m in enumerate(n_max))


_SIZES: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _sizes_column(tile_sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The tile sizes as an int64 (S, 1) tensor on `device`, made once per (sizes, device): building it from
    host data every step would be a blocking copy, a host sync in the middle of an otherwise asynchronous step.
    The one copy it takes when new is kept blocking on purpose: the column is then complete before any stream
    reads it. The sizes come from a small set (tiles up to 128 samples, weight-gradient chunks of 256-2048, a
    multiple of the step), so the cache stays small and is never evicted. Callers only read it."""
    key = (tuple(tile_sizes), device)
    column = _SIZES.get(key)
    if column is None:
        column = _SIZES[key] = torch.tensor(tile_sizes, dtype=torch.int64).to(device)[:, None]
    return column
