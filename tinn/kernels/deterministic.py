"""Fixed-order reductions for `Settings.deterministic`.

The fast kernels sum gradients with float atomics: tiles of one network into its weight gradient,
samples into the hash-grid entries they touch, levels into a sample's input gradient. Float addition
is not associative, so the result depends on the order threads reach the atomics, which changes run
to run. Here every sum is taken in an order fixed by the data alone:
- weight gradients: the per-tile partials of a network (its tiles are consecutive after routing) are
  summed tile by tile by one thread per (network, weight);
- grid tables: every (level, sample, corner, feature) term is written with its table position as key,
  the keys are sorted stably (ties keep their (level, sample, corner) order) and each run of equal keys
  is summed front to back by one thread;
- grid input gradients: one term per (level, sample), summed over levels in level order.
"""

import torch

from ..backend import ti
from .grid_encoding import NEAREST, table_2d, _corners, _entry, _input_gradient, _level_at, _smooth
from .launch import fast_kernel
from .rows import in_chunk

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)
i64_1d = ti.types.ndarray(dtype=ti.i64, ndim=1)
i64_3d = ti.types.ndarray(dtype=ti.i64, ndim=3)

# Terms of the grid's table gradient held at once (keys and values: 12 bytes each); larger batches
# go through in sample blocks, each summed in order and added in block order.
GRID_TERMS_PER_BLOCK = 1 << 24


@fast_kernel
@ti.kernel
def reduce_tiles_in_order(partial: f32_2d, tile_net: i32_1d, grad: f32_2d, net_lo: ti.i32):
    """grad[net - net_lo] += the net's tile partials summed in tile order (tiles sorted by network; networks
    outside the chunk view `grad` skipped)."""
    for t, k in partial:
        net = tile_net[t]
        first = t == 0
        if not first:
            first = tile_net[t - 1] != net
        if first and in_chunk(net - net_lo, grad):
            acc = 0.0
            u = t
            while u < partial.shape[0] and tile_net[u] == net:
                acc += partial[u, k]
                u += 1
            grad[net - net_lo, k] += acc


@fast_kernel
@ti.kernel
def grid_backward_terms(x: f32_2d, net_ids: i32_1d, params: table_2d, param_offset: ti.i32, meta: i32_2d,
                        dy_t: f32_2d, keys: i64_3d, terms: f32_3d, dx_terms: f32_3d, F: ti.template(), interp: ti.i32, grid_type: ti.i32, want_params: ti.i32, want_x: ti.i32,
                        D: ti.template(), net_lo: ti.i32, BF16: ti.template(), H: ti.template()):
    """The grid backward's terms without summing them: for (level, sample) the table terms w_c * dy_f at
    keys[level, b, c * F + f] = row * row_length + column (rows of the whole table), and the input gradient
    dx_terms[level, b, k]. Samples of rows outside the chunk view `params` are left alone (keys stay -1)."""
    for level, b in ti.ndrange(meta.shape[0] - 1, x.shape[0]):
        net = net_ids[b] - net_lo
        if in_chunk(net, params):
            scale, res, size, base, cell, frac = _level_at(x, b, level, meta, param_offset, F, D)
            col = level * F
            row = ti.cast(net_ids[b], ti.i64) * params.shape[1]
            if interp == NEAREST:
                if want_params:
                    e = base + _entry(cell, 0, res, size, grid_type, meta, D, H) * F
                    for f in ti.static(range(F)):
                        keys[level, b, f] = row + e + f
                        terms[level, b, f] = dy_t[col + f, b]
            else:
                s, ds, dds = _smooth(frac, interp, D)
                idx, w = _corners(cell, s, res, size, base, grid_type, meta, F, D, H)
                if want_params:
                    for c in ti.static(range(1 << D)):
                        for f in ti.static(range(F)):
                            keys[level, b, c * F + f] = row + idx[c] + f
                            terms[level, b, c * F + f] = w[c] * dy_t[col + f, b]
                if want_x:
                    g_x = _input_gradient(params, net, idx, s, ds, dy_t, col, b, scale, F, D, BF16)
                    for k in ti.static(range(D)):
                        dx_terms[level, b, k] = g_x[k]


@fast_kernel
@ti.kernel
def segment_sums(values: f32_1d, ends: i64_1d, out: f32_1d):
    """out[s] = values[ends[s - 1] : ends[s]] summed front to back (ends[-1] taken as 0)."""
    for s in range(out.shape[0]):
        start = ti.cast(0, ti.i64)
        if s > 0:
            start = ends[s - 1]
        acc = 0.0
        i = start
        while i < ends[s]:
            acc += values[i]
            i += 1
        out[s] = acc


def sum_terms_by_key(keys: torch.Tensor, terms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct keys in increasing order, the sum of each key's terms taken in their given order);
    keys < 0 are no terms."""
    keep = keys >= 0
    keys, terms = keys[keep], terms[keep]
    if not keys.numel():
        return keys, terms
    keys, order = torch.sort(keys, stable=True)
    terms = terms[order].contiguous()
    unique, counts = torch.unique_consecutive(keys, return_counts=True)
    sums = torch.empty(unique.shape[0], dtype=torch.float32, device=terms.device)
    segment_sums(terms, torch.cumsum(counts, 0), sums)
    return unique, sums


def add_sorted_terms(flat_table: torch.Tensor, keys: torch.Tensor, terms: torch.Tensor) -> None:
    """flat_table[keys] += terms, each key's terms summed in their given order (keys < 0 are no terms)."""
    unique, sums = sum_terms_by_key(keys, terms)
    if unique.numel():
        flat_table[unique] += sums   # unique positions: one add each, no order to depend on
