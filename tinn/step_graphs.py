"""A `Trainer`'s regression step captured once per batch shape as one CUDA graph, then replayed.

A short step (tcnn's image task: 2^18 samples, about half a millisecond of GPU work) is bound by the host, which
issues a few dozen launches and torch ops per step. Where every launch of the step is a Triton kernel or a torch
operation, and nothing in it reads the device on the host, CUDA can replay the whole step from one graph launch:
the host then copies the batch into the graph's input buffers and launches it.

What a replay must reproduce, and how:
- **Inputs.** The graph reads fixed buffers: each step's inputs, targets and ids are copied into them.
- **Host state that moves every step.** The optimizer's step counts: the capture records how they moved
  (`Optimizer.host_counts` before and after), each replay moves them the same way, and Adam reads the counts it
  passes its kernel from device copies filled before each replay (`Optimizer.load_graph_counts`). The trainer's
  own step count goes up by one.
- **Host values a step only reads.** The learning rate and the other hyperparameters, the correction table, the
  parameters' storage, which tables train, the settings: they form the key of a capture (`_key`); a step whose key
  differs captures anew (a changed learning rate, say). A trainer whose key keeps changing (a schedule on the host)
  stops capturing and steps eagerly.
- **Outputs.** The loss is cloned out of the graph (callers keep losses across steps); the parameters' `.grad` are
  the graph's gradient buffers, as after an eager step.

A step is captured at its shape's second call: the first runs eagerly, so every kernel is compiled and every cache
the step fills (routing, constants) is filled outside the graph. A step that issues a Taichi launch (Taichi
launches on its own stream, outside the graph) is refused during the capture: Taichi's launch paths raise while a
capture runs, the host counts are put back, and that trainer then steps eagerly (`StepGraphs.status` says why).
So are steps that read the device on the host (CUDA refuses the capture). CUDA only.

On by default on CUDA (`tuning.step_graphs`), and taken only on the path measured and tested: a tinn loss that the
model's backward takes itself, on one process's part (no collectives) or, opted in (`tuning.replicated_step_graphs`),
on a `Replicated` part over NCCL, whose collectives the graph holds (each rank's trial decides for itself: a replay
issues the same collectives as a step op by op), with Adam on its Triton kernel (`Trainer._graphs_apply`,
`Optimizer.graph_key`). A capture is its thread's alone: other threads (a viewer rendering beside the trainer)
launch and cache as usual (design notes, "A training step replayed as one CUDA graph").

Kept where it measures faster: after a shape's first capture, a few steps op by op and a few replays are timed
(`_Trial`), and a shape whose steps ran faster op by op releases its graph and steps op by op from then on (a step
bound by the device, where copying the batch into the graph's buffers costs more than the host time saved).
"""
from __future__ import annotations

import contextlib
import threading
import time

import torch

from . import runtime

CAPTURE_AT = 2        # a batch shape is captured at its second step
TRIAL_STEPS = 4       # then this many steps op by op and as many replayed (each after one untimed), timed, decide
EAGER_MARGIN = 0.03   # op by op is kept only where it measured this much faster (a graph also frees the host)
MAX_SHAPES = 2        # captured shapes kept at once (training and a second batch size)
RECAPTURE_WINDOW = 64  # steps: a trainer that captures this often again ...
MAX_RECAPTURES = 4     # ... this many times in a row (a key that changes every step) steps eagerly from then on


# One capture at a time in a process: the refusal of Taichi launches patches their classes, which two overlapping
# captures in two threads would restore out of order.
_CAPTURE_LOCK = threading.Lock()


class NotCapturable(RuntimeError):
    """A launch that a CUDA graph cannot hold was issued while a step was captured."""


@contextlib.contextmanager
def refusing_taichi_launches():
    """Taichi launches from this thread raise NotCapturable inside the block, through the lean path
    (tinn/kernels/launch.py) and the backend's own; other threads' launches (a viewer rendering beside a trainer's
    thread) go on."""
    from .backend import ti
    from .kernels.launch import FastKernel

    capturing_thread = threading.get_ident()
    patched = [(FastKernel, FastKernel.__call__)]
    kernel_cls = getattr(getattr(getattr(ti, "lang", None), "kernel_impl", None), "Kernel", None)
    if kernel_cls is not None:
        patched.append((kernel_cls, kernel_cls.__call__))

    def refusing(original):
        def call(self, *args, **kwargs):
            if threading.get_ident() == capturing_thread:
                raise NotCapturable(f"the step launches the Taichi kernel "
                                    f"{getattr(self, '__name__', type(self).__name__)}, which a CUDA graph cannot "
                                    "capture")
            return original(self, *args, **kwargs)
        return call

    for owner, original in patched:
        owner.__call__ = refusing(original)
    try:
        yield
    finally:
        for owner, original in patched:
            owner.__call__ = original


def refuse_in_callers_capture(what: str, instead: str) -> None:
    """Raise NotCapturable where `what` is called inside a caller's CUDA graph capture: it reads host values that
    change every call (step counts), which a replay would repeat, so the replayed training would be silently
    wrong. `instead` says what to use there."""
    if runtime.callers_capture():
        raise NotCapturable(f"{what} cannot run inside a CUDA graph capture of your own (torch.cuda.graph): its "
                            f"host step counts would be replayed unchanged; {instead}")


@contextlib.contextmanager
def inside_callers_capture():
    """A part's forward or backward while the caller captures a CUDA graph of their own (`torch.cuda.graph` around
    a loop of tinn modules, torch's losses and a `capturable` torch optimizer) runs as inside tinn's own captures:
    the capturing stream stays current, no cache keeps a tensor made in the graph, the checks that read the device
    are skipped, and a Taichi launch raises NotCapturable naming its kernel (CUDA would otherwise invalidate the
    whole capture). Nothing changes outside such a capture."""
    if not runtime.callers_capture():
        yield
        return
    with _CAPTURE_LOCK, refusing_taichi_launches(), runtime.capturing_step():
        yield


_PLAIN = (bool, int, float, str)
_PLAIN_KIND, _TUPLE_KIND, _TENSOR_KIND, _OTHER_KIND = range(4)
# Each attribute value's kind by its type, decided once per type: the key is built every step, and a module's
# attributes are mostly containers and hooks that are never plain.
_KINDS: dict[type, int] = {}


def _kind(t: type) -> int:
    kind = _KINDS.get(t)
    if kind is None:
        kind = _KINDS[t] = (_TENSOR_KIND if issubclass(t, torch.Tensor) else
                            _PLAIN_KIND if t is type(None) or issubclass(t, _PLAIN) else
                            _TUPLE_KIND if issubclass(t, tuple) else _OTHER_KIND)
    return kind


def _plain_values(obj) -> tuple:
    """An object's attributes that are plain host values (numbers, strings, None, tuples of them), by name, and
    its tensors (a module's buffers included) by storage: a replay reads the storage the capture saw, so a tensor
    replaced by another must capture again (one changed in place is read as it is now)."""
    items = list(vars(obj).items())
    if isinstance(obj, torch.nn.Module):
        items += [(f"buffer {k}", v) for k, v in obj._buffers.items()]
    out = []
    for k, v in items:
        kind = _kind(type(v))
        if kind == _TENSOR_KIND:
            out.append((k, (v.data_ptr(), v.shape, v.dtype)))
        elif kind == _PLAIN_KIND or (kind == _TUPLE_KIND and all(x is None or isinstance(x, _PLAIN) for x in v)):
            out.append((k, v))
    return tuple(out)


def _model_values(model) -> tuple:
    """The plain host values and tensors of every module of the model: a part whose launches take one as an argument
    (a frequency mask's progress, a user part's schedule) is replayed only while it keeps its value."""
    modules = model.modules() if isinstance(model, torch.nn.Module) else (model,)
    return tuple(_plain_values(m) for m in modules)


class _Captured:
    """One batch shape's graph, its input buffers, the loss and gradient buffers it writes, and what it moves."""

    def __init__(self, graph, inputs, loss, grads, count_steps, key):
        self.graph, self.inputs, self.loss, self.grads = graph, inputs, loss, grads
        self.count_steps = count_steps  # {(optimizer, key): change per step}
        self.key = key


class _Trial:
    """Op by op or replayed, measured: after a shape's first capture, 1 + TRIAL_STEPS steps op by op and then
    1 + TRIAL_STEPS replays, each run's last TRIAL_STEPS timed between two synchronisations (a run's time is then
    its throughput, bound by the host or by the device, whichever is slower; its first step is left out, as the
    first step op by op after a capture allocates what the graph's own memory pool holds). A replay copies the batch
    into the graph's input buffers: for a step bound by the device (large batches: 2^22 samples of 48 floats take
    0.4 ms to copy on an H200) that copy can cost more than the host time the graph saves."""

    ORDER = ("eager", "graph")

    def __init__(self):
        self.done = dict.fromkeys(self.ORDER, 0)
        self.seconds = {}
        self.t0 = self.timing = None  # the timed run's start and way

    def next(self, device) -> str | None:
        """The way to take this step ("eager" or "graph"), or None once both runs are timed."""
        for way in self.ORDER:
            if self.done[way] <= TRIAL_STEPS:
                if self.done[way] == 0 and self.t0 is not None:
                    self._stop(device)  # the previous run ends where this one starts
                elif self.done[way] == 1:
                    torch.cuda.synchronize(device)
                    self.t0, self.timing = time.perf_counter(), way
                self.done[way] += 1
                return way
        self._stop(device)
        return None

    def _stop(self, device) -> None:
        torch.cuda.synchronize(device)
        self.seconds[self.timing] = (time.perf_counter() - self.t0) / TRIAL_STEPS
        self.t0 = None

    def eager_faster(self) -> bool:
        return self.seconds["eager"] < (1.0 - EAGER_MARGIN) * self.seconds["graph"]


class StepGraphs:
    """The captured steps of one trainer (`Trainer._step_graphs`)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.captured: dict[tuple, _Captured] = {}
        self.seen: dict[tuple, int] = {}
        self.status = "no step captured yet"
        self.disabled = False
        self.captures: list[int] = []  # the trainer's step at each capture
        self.replays = 0
        self.trials: dict[tuple, _Trial] = {}       # a shape's measurement, while it runs
        self._measured: set[tuple] = set()          # shapes measured (or being measured) once
        self.eager_shapes: dict[tuple, str] = {}    # shapes whose steps measured faster op by op: why

    @staticmethod
    def wanted(device: torch.device) -> bool:
        """Whether steps on `device` are to be captured (`tuning.step_graphs`, on CUDA by default)."""
        return device.type == "cuda" and bool(runtime.tuning().step_graphs)

    def _key(self, shape: tuple, device: torch.device):
        """Everything a captured step of batch `shape` (its inputs' shapes and dtypes) takes from the host besides
        the inputs' values; None where the step cannot be captured (the optimizer's own rule)."""
        trainer = self.trainer
        optimizer_key = trainer.optimizer.graph_key(device)
        if optimizer_key is None:
            return None
        tables = tuple((p.data_ptr(), p.requires_grad) for p in trainer.model.parameter_tables() if p is not None)
        # The host values of the loss, of the gradient scalers (a loss weight, a growth interval) and of the
        # model's modules, which their launches may take as arguments.
        host_values = (tuple(_plain_values(o) for o in (trainer.loss, *trainer.gradient_scalers)),
                       _model_values(trainer.model))
        # Objects, not their ids (an id is reused once its object is gone); the same object compares equal
        # without calling its __eq__, and settings compare by value.
        return shape + (tables, optimizer_key, trainer.loss, trainer.model, runtime.settings(), runtime.tuning(),
                        tuple(trainer.gradient_scalers), host_values)

    def step(self, x: torch.Tensor, t: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor | None:
        """The step replayed (capturing it first where due): the loss, or None where this step is to run eagerly."""
        if self.disabled:
            return None
        shape = (x.shape, x.dtype, t.shape, t.dtype, None if ids is None else (ids.shape, ids.dtype))
        if shape in self.eager_shapes:  # before the key: a step bound by its host pays no more host time here
            return None
        key = self._key(shape, x.device)
        if key is None:
            self.status = "the optimizer's step cannot be captured"
            return None
        captured = self.captured.get(shape)
        if captured is not None and captured.key == key:
            trial = self.trials.get(shape)
            if trial is not None:
                way = trial.next(x.device)
                if way is None:
                    self._decide(shape, trial)
                    if shape in self.eager_shapes:
                        return None
                elif way == "eager":
                    return None
            return self._replay(captured, x, t, ids)
        seen = self.seen[shape] = self.seen.get(shape, 0) + 1
        if seen < CAPTURE_AT:
            return None
        if not self._may_capture():
            return None
        return self._capture(shape, key, x, t, ids)

    def _decide(self, shape, trial: _Trial) -> None:
        """Keep the graph of `shape`, or step it op by op from now on (its graph and memory pool released)."""
        del self.trials[shape]
        graph_ms, eager_ms = (1e3 * trial.seconds[k] for k in ("graph", "eager"))
        if trial.eager_faster():
            self.captured.pop(shape, None)
            self.eager_shapes[shape] = (f"steps issued op by op for batch shape {tuple(shape[0])}: faster than their "
                                        f"graph's replays ({eager_ms:.3f} against {graph_ms:.3f} ms a step)")
            self.status = self.eager_shapes[shape]
        else:
            self.status = f"captured {len(self.captures)} time(s) (replays {graph_ms:.3f} ms a step, op by op " \
                          f"{eager_ms:.3f})"

    def _may_capture(self) -> bool:
        recent = [s for s in self.captures if self.trainer.step - s < RECAPTURE_WINDOW]
        if len(recent) >= MAX_RECAPTURES:
            self.disabled = True
            self.status = (f"{len(recent)} captures within {RECAPTURE_WINDOW} steps (a learning rate or another "
                           "host value that changes every step): eager steps from now on")
            self.captured.clear()
            return False
        return True

    def _replay(self, captured: _Captured, x, t, ids) -> torch.Tensor:
        trainer = self.trainer
        cx, ct, cids = captured.inputs
        cx.copy_(x)
        ct.copy_(t)
        if cids is not None:
            cids.copy_(ids)
        for (owner, key), change in captured.count_steps.items():
            owner.scalars[key] += change
        trainer.optimizer.load_graph_counts()
        captured.graph.replay()
        for table, grad in captured.grads:
            table.grad = grad
        trainer.step += 1
        self.replays += 1
        return captured.loss.clone()

    def _capture(self, shape, key, x, t, ids) -> torch.Tensor | None:
        trainer = self.trainer
        optimizer = trainer.optimizer
        if len(self.captured) >= MAX_SHAPES and shape not in self.captured:
            self.captured.pop(next(iter(self.captured)))
        self.captured.pop(shape, None)
        inputs = (x.clone(), t.clone(), None if ids is None else ids.clone())
        before, step_before = optimizer.host_counts(), trainer.step
        graph = torch.cuda.CUDAGraph()
        optimizer.begin_capture(x.device)
        try:
            with _CAPTURE_LOCK, refusing_taichi_launches(), runtime.capturing_step():
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    loss = trainer._regression_step(*inputs)
        except Exception as error:  # a launch or a host read the graph cannot hold: this trainer steps eagerly
            optimizer.set_host_counts(before)
            trainer.step = step_before
            optimizer.zero_grad()
            self.disabled = True
            self.status = f"not captured: {type(error).__name__}: {error}"
            torch.cuda.synchronize(x.device)
            return None
        finally:
            optimizer.end_capture()
        after = optimizer.host_counts()
        moved = {k: after[k] - before[k] for k in after if after[k] != before.get(k)}
        if any(isinstance(d, float) for d in moved.values()):  # only counts may move with a step
            optimizer.set_host_counts(before)
            trainer.step = step_before
            self.disabled = True
            changed = sorted(k for _, k in moved)
            self.status = f"not captured: the step changes host values other than counts ({changed})"
            return None
        grads = [(p, p.grad) for p in trainer.model.parameter_tables() if p is not None and p.grad is not None]
        captured = _Captured(graph, inputs, loss, grads, moved, key)
        self.captured[shape] = captured
        self.captures.append(trainer.step)
        self.status = f"captured {len(self.captures)} time(s)"
        # A shape's first capture is measured against op by op; a capture again during that measurement (a new
        # learning rate) starts it over, as the capture's own step would count in the graph's run.
        if shape in self.trials or shape not in self._measured:
            self._measured.add(shape)
            self.trials[shape] = _Trial()
        # The capture ran the step's host side once (counts moved) and no GPU work: the first replay is this step.
        optimizer.load_graph_counts()
        graph.replay()
        self.replays += 1
        return loss.clone()
