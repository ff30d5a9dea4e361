"""Rows gathered by index in one pass on the GPU (Triton): out[i] = src[index[i]] * scale, cast to the output's
dtype as it is written; and put back by a permutation, out[index[i]] = src[i]. Imported only where Triton runs
(CUDA, or its CPU interpreter in tests).

torch's row gather (`index_select`, advanced indexing) of narrow rows runs far below memory speed on the GPU:
a batch grouped by network moves inputs and targets of 3 to 16 floats a sample, and the sharded exchange moves
its rows back to the caller's order the same way (tinn/distributed/buckets.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# The sample count `n` changes from step to step in scenes; Triton would specialise on its divisibility by 16
# and compile a kernel again mid-training, so the kernel does not specialise on it.
MAX_BLOCK = 1024


@triton.jit
def store_rows(ptrs, v, mask, BF16: tl.constexpr):
    """Store float32 values in the element type of `ptrs`, rounded to nearest even. bfloat16 is rounded on its
    bits: Triton's interpreter (the CPU tests) truncates a float32 -> bfloat16 conversion."""
    if BF16:
        bits = v.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        tl.store(ptrs, (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(ptrs, v.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _block_of_rows(index_ptr, n, D, BLOCK: tl.constexpr, DP: tl.constexpr):
    """This program's rows (offs), the columns of its tile (cols), which of the tile's values exist (inside) and
    the rows' indices (int64)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    cols = tl.arange(0, DP)
    inside = mask[:, None] & (cols[None, :] < D)
    index = tl.load(index_ptr + offs, mask=mask, other=0).to(tl.int64)
    return offs, cols, inside, index


@triton.jit(do_not_specialize=["n"])
def gather_kernel(src_ptr, index_ptr, out_ptr, n, D, scale, BLOCK: tl.constexpr, DP: tl.constexpr,
                  BF16: tl.constexpr):
    offs, cols, inside, index = _block_of_rows(index_ptr, n, D, BLOCK, DP)
    rows = tl.load(src_ptr + index[:, None] * D + cols[None, :], mask=inside, other=0.0).to(tl.float32)
    store_rows(out_ptr + offs[:, None] * D + cols[None, :], rows * scale, inside, BF16)


@triton.jit(do_not_specialize=["n"])
def scatter_kernel(src_ptr, index_ptr, out_ptr, n, D, BLOCK: tl.constexpr, DP: tl.constexpr):
    offs, cols, inside, index = _block_of_rows(index_ptr, n, D, BLOCK, DP)
    rows = tl.load(src_ptr + offs[:, None] * D + cols[None, :], mask=inside, other=0.0)
    tl.store(out_ptr + index[:, None] * D + cols[None, :], rows, mask=inside)


def dims_block(d: int) -> int:
    """The row's columns rounded up to a power of two (a program's tile width)."""
    return max(2, 1 << (max(d, 1) - 1).bit_length())


def block_size(device: torch.device, dims: int) -> int:
    """Samples per program: up to MAX_BLOCK, fewer for wide rows (a tile of block x dims values lives in
    registers); 16 under Triton's interpreter (numpy: small blocks, quick tests)."""
    if device.type != "cuda":
        return 16
    return max(64, min(MAX_BLOCK, 8192 // dims))


def gather_rows(src: torch.Tensor, index: torch.Tensor, scale: float = 1.0,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[i] = src[index[i]] * scale, (len(index), d) in `dtype` (default src's): src rows of float32, float16 or
    bfloat16, the product taken in float32 and rounded once; index int32 or int64."""
    n, d = index.shape[0], src.shape[1]
    out = torch.empty(n, d, dtype=src.dtype if dtype is None else dtype, device=src.device)
    if n and d:
        dp = dims_block(d)
        block = block_size(src.device, dp)
        gather_kernel[((n + block - 1) // block,)](src.contiguous(), index, out, n, d, float(scale), BLOCK=block,
                                                   DP=dp, BF16=out.dtype == torch.bfloat16)
    return out


def scatter_rows(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[index[i]] = src[i] for a permutation `index` (int32 or int64) of src's rows: every row of out is
    written once (rows `index` misses are left uninitialised)."""
    n, d = src.shape
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    if n and d:
        dp = dims_block(d)
        block = block_size(src.device, dp)
        scatter_kernel[((n + block - 1) // block,)](src.contiguous(), index, out, n, d, BLOCK=block, DP=dp)
    return out
