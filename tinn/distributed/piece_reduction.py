"""A `Replicated` part's gradient all-reduce cut by network, overlapping its backward (tinn/gradient_pieces.py).

The tensor-core MLP's backward hands its gradient over one range of networks at a time; each range's all-reduce
is issued at once, so the communication stream reduces range k while the compute stream computes range k + 1,
and what is left after the backward is the last range's reduction (about 1 / n of the link time) instead of
all of it. The other tables go in one bucket after the backward, as before.

Every rank must issue the same collectives in the same order, also a rank whose backward hands nothing over (an
empty batch skips the inner backward, a path without tensor cores has nothing to hand over). So the plan is
fixed before the backward from the part alone: the one table whose producer can hand it over
(`hands_over_gradients`), cut into `tuning.reduce_pieces` ranges of rows in network order. Ranges handed over
were reduced during the backward; `finish` issues the plan's other ranges itself, in the same order, then the
bucket of the other tables. A part with no such table, or with several (their hand-over order would depend
on the backward's), is reduced in one bucket.
"""
from __future__ import annotations

import torch

from ..gradient_pieces import GradientPieces


def piece_table(part) -> torch.Tensor | None:
    """The one trainable table of `part` whose gradient a backward can hand over by network (a module with
    `hands_over_gradients()` true, owning it as `params`), or None where there is none or more than one."""
    modules = part.modules() if isinstance(part, torch.nn.Module) else (part,)
    found = [m.params for m in modules if getattr(m, "hands_over_gradients", None) is not None
             and m.hands_over_gradients() and m.params.requires_grad]
    return found[0] if len(found) == 1 else None


class PieceReduction:
    """One backward's reductions: `request` goes to `gradient_pieces.requested` around the inner backward;
    `finish(grads)` completes the plan and returns the gradients summed over the ranks, scaled."""

    def __init__(self, n_pieces: int, table_index: int, n_rows: int, reduce):
        """reduce(tensors) -> a pending reduction of those gradient tensors (its `result()` waits and scales,
        writing back into them)."""
        self.table_index, self.reduce = table_index, reduce
        self.pending: list = []
        self.reduced: list[tuple[int, int]] = []
        self.request = GradientPieces(n_pieces, self._ready)
        self.plan = self.request.ranges(n_rows)

    def _ready(self, gradient: torch.Tensor, lo: int, hi: int) -> None:
        if len(self.reduced) >= len(self.plan) or (lo, hi) != self.plan[len(self.reduced)]:
            raise RuntimeError(f"a gradient handed over out of plan: rows [{lo}, {hi}) after {self.reduced} of "
                               f"{self.plan} (one gradient, its ranges in order)")
        self.reduced.append((lo, hi))
        self.pending.append(self.reduce([gradient[lo:hi]]))

    def finish(self, grads: tuple, rest_reduce) -> tuple:
        """`grads` of the part's tables; the plan's table at `table_index`. rest_reduce(grads with None where a
        gradient is reduced by pieces) -> the others reduced (one bucket)."""
        grads = list(grads)
        mine = grads[self.table_index]
        handed = self.request.was_handed(mine)
        if not handed and self.reduced:
            raise RuntimeError("the backward handed over a gradient it did not return; a part that hands its "
                               "gradient over must return that tensor (tinn/gradient_pieces.py)")
        if mine is not None:
            for lo, hi in self.plan[len(self.reduced):]:  # what the backward did not hand over, in plan order
                self.pending.append(self.reduce([mine[lo:hi]]))
        others = rest_reduce([None if i == self.table_index else g for i, g in enumerate(grads)])
        for pending in self.pending:
            pending.result()
        return tuple(mine if i == self.table_index else g for i, g in enumerate(others))
