"""Where a sharded step's time goes: phases timed on the compute stream.

    timer = PhaseTimer()
    model.profiler = timer           # a ShardedPart (or Replicated) marks its phases while set
    timer.start()
    ... steps ...
    timer.mark("other")              # the tail of the last step (loss, optimizer) counts as "other"
    per_step = timer.collect(steps)  # seconds per step in each of PHASES

`mark(phase)` says that the time since the previous mark went to `phase`. On CUDA a mark records an event
on the current stream (the stream Taichi and Triton kernels run on, inside tinn's stream guard), so a
phase is the span of the compute stream's timeline between two marks: time the stream waited for a
collective counts as that collective's phase. On the CPU a mark reads the host clock. The phases:

    exchange:  bucketing, packing, unpacking, the samples' all_to_alls the stream waits for, the gathers
    compute:   the local part's forward and backward
    reduce:    the all-reduce of replicated tables the stream waits for; with a split optimizer
               (tinn/distributed/optimizer_split.py) the gradients' reduce-scatter and the parameters' all-gather
    idle:      the header all_to_all and the host's wait for it (the stream has nothing queued meanwhile)
    optimizer: the optimizer's update, where marked (the split optimizer marks its own; a caller can mark any
               optimizer's step, as benchmarks/bench_sharded.py does)
    other:     everything else between the part's calls (loss, scaler updates)
"""
from __future__ import annotations

import time

import torch

PHASES = ("exchange", "compute", "reduce", "idle", "optimizer", "other")


class PhaseTimer:
    """Accumulates phase times from marks; `collect` waits for the device once and sums them."""

    def __init__(self, cuda: bool | None = None):
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized() if cuda is None else cuda
        self._marks: list[tuple[str, object]] = []
        self._last = None

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        """Begin (or restart) timing: earlier marks are dropped."""
        self._marks = []
        self._last = self._now()

    def mark(self, phase: str) -> None:
        """The time since the previous mark went to `phase` (ignored before `start`)."""
        if self._last is None:
            return
        now = self._now()
        self._marks.append((phase, self._last, now))
        self._last = now

    def collect(self, steps: int = 1) -> dict[str, float]:
        """Seconds per phase (divided by `steps`), every phase of PHASES present."""
        if self.cuda:
            torch.cuda.synchronize()
        out = dict.fromkeys(PHASES, 0.0)
        for phase, a, b in self._marks:
            out[phase] = out.get(phase, 0.0) + (a.elapsed_time(b) / 1e3 if self.cuda else b - a)
        return {k: v / max(steps, 1) for k, v in out.items()}


def mark(part, phase: str) -> None:
    """`part.profiler.mark(phase)` when the part has a profiler (a no-op attribute read otherwise)."""
    timer = getattr(part, "profiler", None)
    if timer is not None:
        timer.mark(phase)
