"""Parameter gradients handed over network range by network range, as a backward finishes them.

A data-parallel part (`tinn.distributed.Replicated`) reduces its tables' gradients over the ranks. Issued after
the whole backward, the reduction adds its link time to the step; issued for each range of networks as soon as
the backward has finished that range, it runs on the communication stream while the backward computes the next
range, as DistributedDataParallel's buckets do. The consumer asks for pieces around the backward:

    with gradient_pieces.requested(GradientPieces(4, ready)):   # ready(gradient, lo, hi)
        dx, grads = part.backward(...)

and a producer that can cut its backward by network (the tensor-core MLP's: its weight-gradient programs each
add into one network's row, tinn/kernels/tensor_cores/launch.py) launches it in `n` ranges of networks, calling
`ready(gradient, lo, hi)` after each range's launch: rows [lo, hi) of the (n_networks, ...) gradient are then
final on the compute stream. A producer that cannot cut its backward hands nothing over; the consumer reduces
what was not handed over after the backward, as before.

The contract of a handed-over gradient: the producer returns the same tensor object in its gradients and does
not read or write it again in that backward (the consumer may reduce it in place on another stream), and the
consumer takes over what the producer would otherwise do with it after the backward (a float16 network's
overflow check, which the consumer runs on the reduced gradient).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable

import torch

_local = threading.local()


class GradientPieces:
    """A consumer's request for one gradient in at most `n` ranges of networks, `ready(gradient, lo, hi)` per
    range. The first gradient a producer offers is taken (`accepts`); a later, other one (a second backward
    through another array inside the same call) is computed whole and not handed over."""

    def __init__(self, n: int, ready: Callable[[torch.Tensor, int, int], None]):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n={n!r} must be an integer >= 1")
        self.n, self.ready = n, ready
        self.handed: torch.Tensor | None = None

    def accepts(self, gradient: torch.Tensor) -> bool:
        """Whether `gradient` may be handed over: the first one offered, or that one again."""
        return self.handed is None or self.handed is gradient

    def ranges(self, n_networks: int) -> list[tuple[int, int]]:
        """The ranges [lo, hi) a backward of `n_networks` networks is cut into: min(n, n_networks) of nearly
        equal size, in network order."""
        k = max(1, min(self.n, n_networks))
        bounds = [n_networks * i // k for i in range(k + 1)]
        return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]

    def hand_over(self, gradient: torch.Tensor, lo: int, hi: int) -> None:
        """Rows [lo, hi) of `gradient` (one `accepts` takes) are final: the consumer's `ready`."""
        if not self.accepts(gradient):
            raise ValueError("a second gradient handed over to one request; offer it through `accepts` first")
        self.handed = gradient
        self.ready(gradient, lo, hi)

    def was_handed(self, gradient) -> bool:
        return gradient is not None and self.handed is gradient


def current() -> GradientPieces | None:
    """The request of the innermost `requested` block of this thread, or None."""
    return getattr(_local, "pieces", None)


@contextlib.contextmanager
def requested(pieces: GradientPieces | None):
    """Within the block, producers on this thread hand their gradients over to `pieces` (None: nothing asked)."""
    before = current()
    _local.pieces = pieces
    try:
        yield pieces
    finally:
        _local.pieces = before
