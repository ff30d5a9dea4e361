"""Row chunks of per-network tables, so that no kernel launch indexes past Taichi's 32-bit limit.

Taichi 1.7.4 linearises ndarray indices in 32 bits: a `(n_networks, P)` table of more than 2^31
elements is read and written at wrapped addresses. The table stays one torch tensor (torch indexes
in 64 bits); kernels run on *chunk views* `table[lo:hi]`, each contiguous with its own data pointer
and at most `tuning.table_chunk_elements` elements, and take `lo` as an argument: a sample or tile
of network n is handled by the launch whose chunk holds row n, the others skip it. Routing and tile
arrays stay whole, so chunking costs no host sync; a table that fits takes one launch with `lo = 0`.
"""
from __future__ import annotations

from . import runtime
from .errors import ConfigError, InputError

INDEX_LIMIT = (1 << 31) - 1  # largest element count a 32-bit linear index reaches
# Taichi's GPU range-for is a grid-stride loop whose 32-bit counter has the stride (at most a few million
# threads) added past its last element: a loop within one stride of 2^31 iterations wraps negative and
# writes out of bounds. Tables and per-sample buffers therefore stay below this, not INDEX_LIMIT.
LOOP_LIMIT = (1 << 31) - (1 << 24)

_spans: dict[tuple[int, int, int], tuple[tuple[int, int], ...]] = {}


def row_spans(n_rows: int, row_elements: int, what: str = "table") -> tuple[tuple[int, int], ...]:
    """[lo, hi) row ranges covering `n_rows` rows of `row_elements` elements each, every range holding
    at most the tuning's `table_chunk_elements` elements (or one row, when a single row holds more)."""
    limit = runtime.tuning().table_chunk_elements
    key = (n_rows, row_elements, limit)
    spans = _spans.get(key)
    if spans is None:
        if row_elements > LOOP_LIMIT:
            raise ConfigError(f"one row of {what} holds {row_elements} elements, more than a kernel can index "
                              f"(2^31 - 2^24); a row cannot be split across launches")
        per = max(1, limit // max(row_elements, 1))
        spans = tuple((lo, min(lo + per, n_rows)) for lo in range(0, max(n_rows, 1), per))
        if len(_spans) > 256:
            _spans.clear()
        _spans[key] = spans
    return spans


def single(table) -> bool:
    """Whether `table` (rows, ...) is indexed by one launch."""
    rows = table.shape[0]
    return len(row_spans(rows, table.numel() // rows if rows else 0)) == 1


def launch_by_rows(kernel, n_rows: int, row_elements: int, args: tuple, sliced: tuple[int, ...]) -> None:
    """`kernel(*args)`, or one launch per row chunk with the arguments at positions `sliced` (tensors whose
    first dimension is the table's rows) cut to the chunk. For element-wise kernels (optimizer steps)
    that need no row offset: each chunk is a table of its own."""
    spans = row_spans(n_rows, row_elements)
    if len(spans) == 1:
        kernel(*args)
        return
    for lo, hi in spans:
        kernel(*(a[lo:hi] if i in sliced else a for i, a in enumerate(args)))


def check_batch(what: str, batch: int, per_sample: int, buffer: str) -> None:
    """Per-sample scratch buffers (activations, deltas, features) are indexed by one launch too: refuse a
    batch whose largest buffer, `per_sample` elements per sample, passes the 32-bit index limit."""
    if batch * per_sample > LOOP_LIMIT:
        raise InputError(f"{what}: a batch of {batch} samples needs {batch * per_sample} elements of {buffer}, "
                         f"more than a kernel can index (2^31 - 2^24); split it into batches of at most "
                         f"{LOOP_LIMIT // per_sample} samples")
