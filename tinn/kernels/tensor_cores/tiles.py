"""The tensor-core kernels' tile lists, built by one Triton kernel per tile size from the sorted ids' bounds.

A tile is a run of at most `size` consecutive sorted samples of one network (tinn.routing.TileRouting). The
lists are sized without a host sync by giving network n the slots from `bounds[n] // size + n` on: network n
needs ceil(c_n / size) slots, and the next network's first slot is at least that many further on, because
floor(b / s) - floor(a / s) + 1 >= ceil((b - a) / s). So every network writes its tiles with no prefix sum
over the networks' tile counts, and at most batch // size + n_networks + 1 slots are used; the ones between
networks keep count 0, which the kernels skip. Against building the same lists with torch ops (about twenty
small launches, tinn.routing), this is a memset and one launch per size.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...routing import TileRouting

# Tiles one program writes per loop step (a single network can own many: 2^22 samples are 32768 tiles of 128).
BLOCK = 1024


@triton.jit
def tiles_kernel(bounds_ptr, net_ptr, start_ptr, count_ptr, size, INTERPRETED: tl.constexpr,
                 BLOCK: tl.constexpr):
    """Network `program_id(0)`'s tiles of `size` samples, from slot bounds[n] // size + n on."""
    n = tl.program_id(0)
    first = tl.load(bounds_ptr + n)
    end = tl.load(bounds_ptr + n + 1)
    n_tiles = (end - first + size - 1) // size
    slot0 = first // size + n
    # (Triton's CPU interpreter cannot take a loaded scalar as a range bound: a while loop there.)
    if INTERPRETED:
        base = 0
        while base < n_tiles:
            _write_tiles(base, n, first, end, n_tiles, slot0, size, net_ptr, start_ptr, count_ptr, BLOCK)
            base += BLOCK
    else:
        for base in range(0, n_tiles, BLOCK):
            _write_tiles(base, n, first, end, n_tiles, slot0, size, net_ptr, start_ptr, count_ptr, BLOCK)


@triton.jit
def _write_tiles(base, n, first, end, n_tiles, slot0, size, net_ptr, start_ptr, count_ptr, BLOCK: tl.constexpr):
    t = base + tl.arange(0, BLOCK)
    inside = t < n_tiles
    start = first + t * size
    slot = slot0 + t
    tl.store(net_ptr + slot, tl.zeros_like(t) + n, mask=inside)
    tl.store(start_ptr + slot, start.to(tl.int32), mask=inside)
    tl.store(count_ptr + slot, tl.minimum(end - start, size).to(tl.int32), mask=inside)


def slots(batch: int, n_networks: int, size: int) -> int:
    """The tile list's length for one size: every slot a network can reach, and one more, rounded up to 4
    entries so that every list of a shared table starts 16-byte aligned (Triton compiles a kernel once per
    alignment of its pointer arguments)."""
    return (batch // size + n_networks + 1 + 3) // 4 * 4


def tile_lists(order: torch.Tensor, bounds: torch.Tensor, batch: int, tile_sizes: tuple[int, ...],
               interpreted: bool, in_order: bool = False) -> tuple[TileRouting, ...]:
    """One TileRouting per size over the sort (order, bounds) of tinn.routing.sorted_bounds: int32 arrays, the
    unused slots with network 0, start 0 and count 0. in_order: `order` is the identity (TileRouting.in_order)."""
    n_networks = bounds.shape[0] - 1
    lengths = [slots(batch, n_networks, size) for size in tile_sizes]
    table = torch.zeros(3, sum(lengths), dtype=torch.int32, device=order.device)
    result, offset = [], 0
    for size, length in zip(tile_sizes, lengths):
        net, start, count = (table[i, offset:offset + length] for i in range(3))
        if n_networks and batch:
            tiles_kernel[(n_networks,)](bounds, net, start, count, size, INTERPRETED=interpreted, BLOCK=BLOCK)
        result.append(TileRouting(order, net, start, count, in_order))
        offset += length
    return tuple(result)
