"""A dense single network's training step replayed from fixed buffers: two CUDA graphs, forward and backward.

The dense path (`tinn/dense_mlp.py`) issues about twenty torch ops a step: conversions, GEMMs, activations, the
split-K weight gradients. Where a step's GPU work is short (the image step in float16) their host time
is the bound. A CUDA graph replays the same ops from one launch, but only on fixed buffers, so each batch shape
gets its own set: inputs are copied in (in the network's precision: the copy is the conversion the eager path
makes anyway), the output and the gradients are copied out (callers may keep them across steps), and the
activations stay in the set between the forward and its backward.

A set belongs to one forward at a time. The forward's context holds it until its first backward has
run (or the context is gone, when the caller drops the output unused); a forward that finds the set held runs
the eager path, so two forwards before their backwards stay correct. A later backward through the same forward
(`retain_graph`) after another forward took the set finds that forward's generation there instead of its own and
has the network recompute its forward eagerly. So results never depend on the order of calls, and a loop that
keeps the last step's loss alive into the next forward (as most do) still replays every step. On the CPU the
"graph" is the plain call on the same buffers (tests use it to check the bookkeeping).
"""
from __future__ import annotations

import math
import weakref
from typing import Callable

import torch

from . import dense_mlp

# Buffers of one batch shape held between steps. Graphs pay where a step is short and host-bound; a step whose
# buffers are larger is GPU-bound, and keeping them would only hold memory.
MAX_AUTO_BYTES = 1 << 29
# Batch shapes kept at once; the oldest one not in use gives way, up to MAX_EVICTIONS times: a caller cycling
# through more shapes than that would otherwise pay a capture (and its sync) every step, so later shapes run
# eagerly.
MAX_SHAPES = 2
MAX_EVICTIONS = 4
# A batch shape is captured at its second training step: a one-off shape (a last, partial batch) runs eagerly.
CAPTURE_AT = 2
MAX_SEEN = 64  # batch shapes counted towards their capture; the count starts over beyond that many


def replayable(body: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """`body` as a CUDA graph's replay on CUDA (captured here, after one warm-up run on a side stream, where cuBLAS
    picks its kernels and workspace), the plain call elsewhere. Either way the body has run once on return."""
    if device.type != "cuda":
        body()
        return body
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # Only this thread is held to the capture's rules (another thread's CUDA work, a viewer's, may go on).
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        body()
    return graph.replay


class _ShapeBuffers:
    """One batch shape's inputs, activations and gradients, and the graphs that run on them."""

    def __init__(self, net, batch: int, x_feature_major: bool):
        dev, dtype, f32 = net.params.device, net.compute_dtype, torch.float32
        # net: a weak proxy (StepGraphs'): the network holds these buffers.
        self.net, self.x_feature_major = net, x_feature_major
        self.x = torch.empty((net.kernel_inputs, batch) if x_feature_major else (batch, net.kernel_inputs), device=dev,
                             dtype=dtype)
        self.params = torch.empty(net.params.shape, device=dev, dtype=dtype)
        shapes = net.scratch_shapes(batch)
        self.acts, self.pre, self.deltas, self.dout = (torch.empty(shapes[name], device=dev, dtype=dtype)
                                                       for name in ("acts", "pre", "deltas", "dout"))
        self.out = torch.empty(batch, net.n_output_dims, device=dev, dtype=f32)
        self.dy = torch.empty(batch, net.n_output_dims, device=dev, dtype=f32)
        self.dx = torch.empty(self.x.shape, device=dev, dtype=f32)
        self.dparams = torch.zeros(net.params.shape, device=dev, dtype=f32)  # tcnn's padded rows stay zero
        self.forward_run = None
        self.backward_runs: dict[tuple[bool, bool], Callable[[], None]] = {}
        self.held = False
        self.generation = 0  # forwards replayed into these buffers

    def run_forward(self) -> None:
        net = self.net
        dense_mlp.forward(self.x, self.params, net.shape, acts=self.acts, pre=self.pre, out=self.out, keep_all=True,
                          keep_pre=net.keep_pre, x_feature_major=self.x_feature_major)

    def run_backward(self, want_dx: bool, want_params: bool) -> None:
        net = self.net
        dense_mlp.backward_deltas(self.dy, self.params, net.shape, acts=self.acts, pre=self.pre, out=self.out,
                                  deltas=self.deltas, dout=self.dout, dx=self.dx, keep_pre=net.keep_pre,
                                  want_dx=want_dx, x_feature_major=self.x_feature_major,
                                  gradient_scale=net.gradient_scale)
        if want_params:
            net._gemm_weight_gradients(self.x, self.x_feature_major, self.acts, self.deltas, self.dout, self.dparams)

    def release(self) -> None:
        self.held = False


class HeldBuffers:
    """A forward's hold on its batch shape's buffers, kept in the forward's context: until its first backward, or
    until the context is gone."""

    def __init__(self, buffers: _ShapeBuffers):
        self.buffers = buffers
        self.generation = buffers.generation
        buffers.held = True
        self._finalizer = weakref.finalize(self, buffers.release)

    def holds_activations(self) -> bool:
        return self.buffers.generation == self.generation

    def end(self) -> None:
        self._finalizer()  # runs once: a later forward may take the buffers


class StepGraphs:
    """The replayed training steps of one dense network (`NetworkArray`), per batch shape."""

    def __init__(self, net, any_size: bool):
        self.net = weakref.proxy(net)  # the network holds this object: no cycle back
        self.any_size = any_size  # False: only shapes whose buffers fit MAX_AUTO_BYTES
        self.shapes: dict[tuple[int, bool], _ShapeBuffers] = {}
        self.seen: dict[tuple[int, bool], int] = {}
        self.evictions = 0
        self.replayed_forwards = 0

    def _bytes(self, batch: int) -> int:
        """What `_ShapeBuffers` would hold for this batch: x, the scratch buffers (the network's precision), out,
        dy and dx (float32)."""
        net = self.net
        narrow = net.kernel_inputs * batch + sum(math.prod(s) for s in net.scratch_shapes(batch).values())
        wide = (2 * net.n_output_dims + net.kernel_inputs) * batch
        return narrow * net.compute_dtype.itemsize + wide * 4

    def _buffers_for(self, batch: int, x_feature_major: bool) -> _ShapeBuffers | None:
        key = (batch, x_feature_major)
        buffers = self.shapes.get(key)
        if buffers is not None:
            return buffers
        if len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] < CAPTURE_AT or not (self.any_size or self._bytes(batch) <= MAX_AUTO_BYTES):
            return None
        if len(self.shapes) >= MAX_SHAPES:
            free = next((k for k, b in self.shapes.items() if not b.held), None)
            if free is None or self.evictions >= MAX_EVICTIONS:
                return None
            del self.shapes[free]
            self.evictions += 1
        buffers = self.shapes[key] = _ShapeBuffers(self.net, batch, x_feature_major)
        return buffers

    def forward(self, x: torch.Tensor, params: torch.Tensor,
                x_feature_major: bool) -> tuple[torch.Tensor, HeldBuffers] | None:
        """The training forward from this shape's buffers: (a copy of the output, its hold on the buffers), or None
        where the eager path must run (first sight of the shape, too large, or its buffers held by another
        forward)."""
        batch = x.shape[1] if x_feature_major else x.shape[0]
        buffers = self._buffers_for(batch, x_feature_major)
        if buffers is None or buffers.held:
            return None
        buffers.x.copy_(x)
        buffers.params.copy_(params)
        buffers.generation += 1
        self.replayed_forwards += 1
        if buffers.forward_run is None:
            buffers.forward_run = replayable(buffers.run_forward, buffers.out.device)
        else:
            buffers.forward_run()
        return buffers.out.clone(), HeldBuffers(buffers)

    def backward(self, held_buffers: HeldBuffers, dy: torch.Tensor, want_dx: bool,
                 want_params: bool) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
        """(dx, dparams) of the forward whose hold is `held_buffers`, as copies; None where the buffers hold a later
        forward's activations (the caller recomputes)."""
        if not held_buffers.holds_activations():
            return None
        held_buffers.end()
        buffers = held_buffers.buffers
        buffers.dy.copy_(dy)
        key = (want_dx, want_params)
        run = buffers.backward_runs.get(key)
        if run is None:
            buffers.backward_runs[key] = replayable(lambda: buffers.run_backward(want_dx, want_params),
                                                    buffers.out.device)
        else:
            run()
        return (buffers.dx.clone() if want_dx else None), (buffers.dparams.clone() if want_params else None)
