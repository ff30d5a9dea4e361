"""Long-K GEMMs for weight gradients: a batch as one long reduction, cut into slices on CUDA."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import runtime

MIN_K_SLICE = 1024
# torch's batched GEMM of float16/bfloat16 operands into float32 (CUDA; newer torch releases).
_WIDENING_BMM = hasattr(torch.ops.aten.bmm, "dtype_out")


class GemmOperand(NamedTuple):
    """A GEMM operand, rows [offset row, + rows) of a (?, K) matrix, as storage coordinates: element (r, j) of the
    operand is base's storage at offset + r * row_stride + j * k_stride. Lets `mm_long_k` read a layer's rows out of a
    stacked buffer without a select or slice op per layer (each torch op costs host time)."""
    base: torch.Tensor
    offset: int
    rows: int
    row_stride: int
    k_stride: int
    k: int

    @staticmethod
    def of(t: torch.Tensor) -> "GemmOperand":
        """A 2-D tensor (any strides) as an operand."""
        return GemmOperand(t, t.storage_offset(), t.shape[0], t.stride(0), t.stride(1), t.shape[1])

    @staticmethod
    def transposed(t: torch.Tensor) -> "GemmOperand":
        """The rows of t^T for a 2-D (K, R) tensor t (any strides), without the transpose op."""
        return GemmOperand(t, t.storage_offset(), t.shape[1], t.stride(1), t.stride(0), t.shape[0])

    @staticmethod
    def stacked(t: torch.Tensor, index: int, rows: int | None = None) -> "GemmOperand":
        """The first `rows` rows (default all) of t[index] for a contiguous (n, R, K) t."""
        _, r, k = t.shape
        return GemmOperand(t, t.storage_offset() + index * r * k, r if rows is None else rows, k, 1, k)

    def matrix(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The operand (columns [start, stop) of K) as a strided view: one op."""
        stop = self.k if stop is None else stop
        return self.base.as_strided((self.rows, stop - start), (self.row_stride, self.k_stride),
                                    self.offset + start * self.k_stride)


def mm_long_k(products: list[tuple[torch.Tensor | GemmOperand, torch.Tensor | GemmOperand]], out: torch.Tensor,
              max_slices: int | None = None) -> None:
    """Consecutive blocks of the contiguous `out` receive a_i @ b_i^T, for (M_i, K) and (N_i, K)
    operands sharing K (the batch), K far larger than M_i and N_i (weight gradients). An operand is a 2-D
    tensor or `GemmOperand` of a larger buffer.

    On CUDA cuBLAS gives such a GEMM few blocks; cutting K into slices, one batched GEMM over them and
    a sum of the slice products keeps the GPU busy (docs/design-notes.md). Every product writes its
    slice products into one buffer, so a single sum reduces them all (each torch op costs host time).
    Elsewhere one plain GEMM per product. Operands of a lower precision than `out` (`settings.precision`)
    give slice products in out's precision where cuBLAS writes them so (a slice's sum of scaled float16 products
    can pass float16's range), else in theirs; without slices (the CPU, short K), GEMMs in out's precision.
    """
    products = [tuple(o if isinstance(o, GemmOperand) else GemmOperand.of(o) for o in pair) for pair in products]
    k = products[0][0].k
    if max_slices is None:
        max_slices = runtime.tuning().weight_gradient_slices if out.is_cuda else 1
    slices = min(max_slices, k // MIN_K_SLICE)

    def blocks():  # out's block of each product (built only when needed: views cost host time too)
        off = out.storage_offset()
        for a, b in products:
            yield out.as_strided((a.rows, b.rows), (b.rows, 1), off)
            off += a.rows * b.rows

    def wide(t: torch.Tensor) -> torch.Tensor:
        return t if t.dtype == out.dtype else t.to(out.dtype)

    if slices < 2:
        for (a, b), block in zip(products, blocks()):
            torch.mm(wide(a.matrix()), wide(b.matrix()).t(), out=block)
        return
    step = k // slices
    main = slices * step
    total = sum(a.rows * b.rows for a, b in products)
    narrow = products[0][0].base.dtype
    widened = narrow != out.dtype and _WIDENING_BMM
    partial = torch.empty(slices, total, dtype=out.dtype if widened else narrow, device=out.device)
    off = 0
    for a, b in products:
        m, n = a.rows, b.rows
        # Strided views, one op each: [s, m, j] = a[m, s*step + j] and [s, j, n] = b[n, s*step + j].
        a_slices = a.base.as_strided((slices, m, step), (step * a.k_stride, a.row_stride, a.k_stride), a.offset)
        b_slices = b.base.as_strided((slices, step, n), (step * b.k_stride, b.k_stride, b.row_stride), b.offset)
        into = partial.as_strided((slices, m, n), (total, n, 1), off)
        if widened:
            torch.ops.aten.bmm.dtype_out(a_slices, b_slices, out.dtype, out=into)
        else:
            torch.bmm(a_slices, b_slices, out=into)
        off += m * n
    torch.sum(partial, 0, dtype=out.dtype, out=out.as_strided((total,), (1,)))
    if main < k:
        for (a, b), block in zip(products, blocks()):
            block.addmm_(wide(a.matrix(main)), wide(b.matrix(main)).t())
