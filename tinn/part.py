"""The differentiable contract every tinn part follows (encodings, networks, composed models).

In the spirit of tiny-cuda-nn's `DifferentiableObject`, a part is a pure function of its inputs and
its parameter tables, evaluated per sample for the network the sample's id names:

    y, ctx = part.forward_with_context(x, ids, train=True, x_layout=..., y_layout=...)
    dx, grads = part.backward(ctx, dy, need_dx=..., grads=...)
    dx, grads, value = part.backward_from_loss(ctx, y, loss, target, need_dx=...)   # seeded by a tinn loss
    d_dy, d_x, d_tables = part.backward_backward(ctx, dy, ddx, ...)   # optional (second order)

`x`, `dy` and `ids` reach these methods validated, contiguous and detached; `ids` is an int32 tensor
with one entry per sample (all zero for a single network). `parameter_tables()` lists the part's trainable
tensors in a fixed order; `backward` returns one gradient per table (None where not wanted), or adds
into the buffers given as `grads` (so a composed part or the Trainer can hand over `.grad` buffers).

Layouts: a (batch, dims) tensor is *sample-major*; its transpose, stored contiguous as (dims, batch),
is *feature-major*. A part lists the layouts it can read (`input_layouts`) and write
(`output_layouts`), preferred first; a composition hands tensors over in a layout both sides take,
with no transposes in between. `dx` is returned in the layout `x` came in, `dy` is read in the layout
`y` went out. Every subclass's `forward_with_context` is wrapped (at class creation) by a check that `x_layout`
and `y_layout` are among the layouts the instance declares, so a part never reads a tensor in a layout
it does not handle.

Users call a part like any torch module: `part(x, ids)` validates the inputs (shape, dtype, device,
id range and finite values, in one device sync) and runs the contract under one generic
`torch.autograd.Function`, so gradients reach the inputs and the tables, and `create_graph=True`
reaches `backward_backward` (parts without it raise `SecondOrderError` when a second derivative is
actually requested, never a silently wrong one). The Trainer drives the same methods directly.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from . import checks, runtime
from .config import count
from .errors import ConfigError, TinnError
from .step_graphs import inside_callers_capture

SAMPLE_MAJOR = "sample_major"
FEATURE_MAJOR = "feature_major"
LAYOUTS = (SAMPLE_MAJOR, FEATURE_MAJOR)


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def has_hooks(module: torch.nn.Module) -> bool:
    """Whether `module` itself has forward or backward hooks (which must see it called as a module)."""
    return any(getattr(module, name, None) for name in _MODULE_HOOKS)


class SecondOrderError(TinnError, NotImplementedError):
    """A second derivative was requested through a part that does not provide one."""


@dataclass
class NextBatch:
    """The batch of a training step's next step (validated by the caller), which a part whose
    `gradients_from_loss` takes `ahead=` prepares while the step computes (a sharded array routes it to its owners,
    tinn/distributed/route_ahead.py); `then`: whether that step will be handed its own next batch too (every rank
    announces it, so ranks that stop at different steps raise together)."""
    x: torch.Tensor
    ids: torch.Tensor
    target: torch.Tensor
    then: bool


class Context(SimpleNamespace):
    """What a part's forward keeps for its backward (attributes chosen by the part)."""


def to_layout(t: torch.Tensor, have: str, want: str) -> torch.Tensor:
    """`t` converted from layout `have` to `want` (one transpose copy when they differ)."""
    return t if have == want else t.t().contiguous()


def common_layout(producer: "Part", consumer: "Part") -> str:
    """The layout in which `producer`'s output is handed to `consumer`: the producer's preferred one
    that the consumer reads."""
    for layout in producer.output_layouts:
        if layout in consumer.input_layouts:
            return layout
    return SAMPLE_MAJOR


def _layout_error(part: "Part", argument: str, layout, allowed: tuple[str, ...]) -> ConfigError:
    what = "reads" if argument == "x_layout" else "writes"
    known = "" if layout in LAYOUTS else f" (not a layout at all; layouts are {list(LAYOUTS)})"
    return ConfigError(f"{type(part).__name__}.forward_with_context: {argument}={layout!r} is not a layout this part "
                       f"{what}{known}; allowed: {list(allowed)}")


def _checking_layouts(forward_with_context):
    """`forward_with_context` behind a check of its layout arguments against the part's declared layouts (read from
    the instance: some parts choose theirs when built). Two tuple lookups per call."""
    @functools.wraps(forward_with_context)
    def checked(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR, **extra):
        if x_layout not in self.input_layouts:
            raise _layout_error(self, "x_layout", x_layout, self.input_layouts)
        if y_layout not in self.output_layouts:
            raise _layout_error(self, "y_layout", y_layout, self.output_layouts)
        return forward_with_context(self, x, ids, train=train, x_layout=x_layout, y_layout=y_layout, **extra)

    checked.checks_layouts = True
    return checked


def _zeros_like_or_none(t):
    return None if t is None else torch.zeros_like(t)


def accumulate(into: torch.Tensor | None, grad: torch.Tensor | None) -> torch.Tensor | None:
    """`grad` added into `into` (or taken as it is when there is no buffer yet)."""
    if grad is None:
        return into
    if into is None:
        return grad
    into += grad
    return into


class Part(torch.nn.Module):
    """Base class of the contract. Subclasses set the dims and implement `forward_with_context` and `backward`."""

    dtype = torch.float32  # tcnn's attributes: tinn computes in float32 throughout; `dtype` is the outputs'
    loss_scale = 1.0
    jit_fusion = False
    input_layouts: tuple[str, ...] = (SAMPLE_MAJOR,)
    output_layouts: tuple[str, ...] = (SAMPLE_MAJOR,)
    #: False for parts that only make sense through autograd (the Trainer then uses autograd).
    direct_training = True
    #: False for parts whose function does not depend on the network id (they ignore `net_ids`).
    uses_ids = True
    #: tcnn's input handling: any float dtype is cast to float32, a CPU tensor moves to tinn's device
    #: with a warning. Off for tinn's own classes, which refuse both with an error naming the field.
    casts_inputs = False

    def __init__(self, n_input_dims: int, n_output_dims: int, n_networks: int = 1):
        super().__init__()
        runtime.ensure_init()
        self.n_input_dims = count("n_input_dims", n_input_dims)
        self.n_output_dims = count("n_output_dims", n_output_dims, lo=0)  # Empty has no outputs
        self.n_networks = count("n_networks", n_networks)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # A subclass that defines its own forward has behaviour the contract does not describe:
        # the Trainer then trains it through torch autograd.
        if "forward" in cls.__dict__:
            cls.direct_training = False
        own = cls.__dict__.get("forward_with_context")
        if own is not None and not getattr(own, "checks_layouts", False):
            cls.forward_with_context = _checking_layouts(own)

    # ---- the contract -------------------------------------------------------------------------------
    def parameter_tables(self) -> tuple[torch.Tensor | None, ...]:
        """The trainable tensors the contract differentiates, in a fixed order (may contain None)."""
        params = getattr(self, "params", None)
        return (params,) if isinstance(params, torch.Tensor) else ()

    def forward_with_context(self, x: torch.Tensor, ids: torch.Tensor, *, train: bool, x_layout: str = SAMPLE_MAJOR,
                             y_layout: str = SAMPLE_MAJOR) -> tuple[torch.Tensor, Context]:
        raise NotImplementedError

    def backward(self, ctx: Context, dy: torch.Tensor, *, need_dx: bool, need_grads: bool = True,
                 grads: tuple | None = None) -> tuple[torch.Tensor | None, tuple]:
        raise NotImplementedError

    def fuses_loss(self, need_dx: bool = False) -> bool:
        """Whether `backward_from_loss(..., need_dx=need_dx)` computes the loss inside the backward's kernels,
        and is faster for it (then the Trainer seeds the backward with the loss rather than its gradient)."""
        return False

    def backward_from_loss(self, ctx: Context, y: torch.Tensor, loss, target: torch.Tensor, *, need_dx: bool,
                           need_grads: bool = True) -> tuple[torch.Tensor | None, tuple, torch.Tensor]:
        """`backward` seeded by a loss of the output instead of its gradient: `loss` (a tinn `Loss`) of `y`, the
        output `forward_with_context` returned, against `target`, the mean over every element. Returns dx, the grads
        and the mean loss (0-d). Here the loss kernel runs first; a part whose kernels compute the loss's
        gradient where they first read the output (the fused MLP) overrides it and saves that pass."""
        result = loss.evaluate(y, target)
        dx, grads = self.backward(ctx, result.grad, need_dx=need_dx, need_grads=need_grads)
        return dx, grads, result.value

    def gradients_from_loss(self, x: torch.Tensor, ids: torch.Tensor, loss, target: torch.Tensor, *,
                            need_dx: bool, need_grads: bool = True,
                            x_layout: str = SAMPLE_MAJOR) -> tuple[torch.Tensor | None, tuple, torch.Tensor]:
        """A training forward of x (in `x_layout`), then `backward_from_loss`, for a caller that needs only the
        gradients and the mean loss (the Trainer's step), not the output. Returns dx (in x's layout), the grads
        and the mean loss (0-d). A part whose backward recomputes the forward from x (the tensor-core MLP)
        overrides it and runs no forward."""
        y, ctx = self.forward_with_context(x, ids, train=True, x_layout=x_layout)
        return self.backward_from_loss(ctx, y, loss, target, need_dx=need_dx, need_grads=need_grads)

    def backward_backward(self, ctx: Context, dy: torch.Tensor, ddx: torch.Tensor | None, *, need_ddy: bool,
                          need_dx: bool, need_dtables: bool) -> tuple[torch.Tensor | None, torch.Tensor | None,
                                                                     tuple]:
        """Derivatives of `<ddx, dx(x, dy, tables)>` with respect to dy, x and the tables."""
        raise SecondOrderError(f"second-order gradients through {type(self).__name__} are not supported; "
                               "differentiate a first-order loss or use a part that implements backward_backward")

    def backward_backward_tables(self, ctx: Context, dy: torch.Tensor, g_tables: tuple, *, need_ddy: bool,
                                 need_dx: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple]:
        """Derivatives of `<g_tables, table gradients(x, dy)>` with respect to dy and x (a loss on the
        parameter gradients themselves)."""
        raise SecondOrderError(f"differentiating the parameter gradients of {type(self).__name__} is not "
                               "supported; differentiate the input gradient instead")

    # ---- torch module face ------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        if torch.jit.is_tracing():
            raise TinnError(f"{type(self).__name__} cannot be traced by torch.jit.trace: its Taichi kernels run "
                            "outside TorchScript, so a trace would record none of the computation; call the "
                            "module directly")
        if self.casts_inputs:
            x, net_ids = checks.cast_like_tcnn(type(self).__name__, x, net_ids)
        if not self.uses_ids:
            net_ids = None
        x, ids = checks.part_inputs(type(self).__name__, x, net_ids, self.n_input_dims,
                                    self.n_networks if self.uses_ids else 1)
        self.check_parameter_tables()
        y = self.run_checked(x, ids)
        return y if self.dtype == torch.float32 else y.to(self.dtype)

    def run_checked(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The forward on validated inputs (a composition may call its parts as modules instead)."""
        return run(self, x, ids)

    def check_parameter_tables(self) -> None:
        """The tables the kernels are about to read must still be what they were built as (a module
        converted with .double(), or a table replaced by one of another shape, is an error, not a crash)."""
        params = getattr(self, "params", None)
        if isinstance(params, torch.Tensor):
            checks.table("params", params, (params.shape[0], self.n_params_per_network()),
                         getattr(self, "table_dtype", torch.float32))

    def inference(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(x, net_ids)

    def n_params_per_network(self) -> int:
        return sum(t[0].numel() for t in self.parameter_tables() if t is not None and t.dim() > 1)

    def n_params(self) -> int:
        """Number of trainable floats (all networks of an array together), as tcnn counts them."""
        return sum(p.numel() for p in self.parameters())

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parameter_tables() if t is not None)


def run(part: Part, x: torch.Tensor, ids: torch.Tensor, function=None) -> torch.Tensor:
    """`part` on validated inputs: through autograd when a gradient is wanted (the contract's generic
    Function, or `function` for parts that need their own), else a plain forward."""
    tables = part.parameter_tables()
    with inside_callers_capture(), runtime.stream_guard():
        if torch.is_grad_enabled() and (x.requires_grad or any(t is not None and t.requires_grad for t in tables)):
            return (function or _PartFunction).apply(part, x, ids, *tables)
        y, _ = part.forward_with_context(x.detach(), ids, train=False)
        return y


class _PartFunction(torch.autograd.Function):
    """One autograd node per part call, driving the contract."""

    @staticmethod
    def forward(ctx, part, x, ids, *tables):
        y, pctx = part.forward_with_context(x.detach(), ids, train=True)
        ctx.part, ctx.pctx = part, pctx
        # The originals, not detached copies: a create_graph backward must stay connected to them.
        ctx.save_for_backward(x, *tables)
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, dy):
        with inside_callers_capture():
            return _PartFunction._backward(ctx, dy)

    @staticmethod
    def _backward(ctx, dy):
        x, *tables = ctx.saved_tensors
        need_dx = ctx.needs_input_grad[1]
        need_tables = ctx.needs_input_grad[3:]
        if dy is None or not (need_dx or any(need_tables)):
            return (None, None, None) + (None,) * len(tables)
        if torch.is_grad_enabled():  # create_graph: the backward itself must be differentiable
            outs = _PartBackward.apply(ctx.part, ctx.pctx, need_dx, tuple(need_tables), dy.contiguous(), x, *tables)
            dx, grads = outs[0], outs[1:]
        else:
            dx, grads = ctx.part.backward(ctx.pctx, dy.detach().contiguous(), need_dx=need_dx,
                                          need_grads=any(need_tables))
        grads = tuple(g if want else None for g, want in zip(grads, need_tables))
        return (None, dx if need_dx else None, None) + grads


class _PartBackward(torch.autograd.Function):
    """(dx, table gradients) as a function of (dy, x, tables), differentiable through `backward_backward`."""

    @staticmethod
    def forward(ctx, part, pctx, need_dx, need_tables, dy, x, *tables):
        dx, grads = part.backward(pctx, dy.detach(), need_dx=need_dx, need_grads=any(need_tables))
        ctx.part, ctx.pctx = part, pctx
        ctx.need_dx, ctx.need_tables = need_dx, need_tables
        ctx.save_for_backward(dy, x, *tables)
        ctx.set_materialize_grads(False)
        # Outputs of a Function must be tensors: unwanted ones are small fresh zeros.
        dx = dx if dx is not None else x.new_zeros(())
        grads = tuple(g if g is not None else x.new_zeros(()) for g in grads)
        return (dx,) + grads

    @staticmethod
    def backward(ctx, g_dx, *g_tables):
        dy, x, *tables = (None if t is None else t.detach() for t in ctx.saved_tensors)
        need_ddy, need_x = ctx.needs_input_grad[4], ctx.needs_input_grad[5]
        need_dtables = any(ctx.needs_input_grad[6:])
        if any(g is not None and want for g, want in zip(g_tables, ctx.need_tables)):
            gt = tuple(g if want else None for g, want in zip(g_tables, ctx.need_tables))
            d_dy, d_x, d_tables = ctx.part.backward_backward_tables(ctx.pctx, dy, gt, need_ddy=need_ddy,
                                                                    need_dx=need_x)
        else:
            d_dy, d_x, d_tables = None, None, (None,) * len(tables)
        if g_dx is not None and ctx.need_dx and (need_ddy or need_x or need_dtables):
            a, b, c = ctx.part.backward_backward(ctx.pctx, dy, g_dx.contiguous(), need_ddy=need_ddy, need_dx=need_x,
                                                 need_dtables=need_dtables)
            d_dy, d_x = accumulate(d_dy, a), accumulate(d_x, b)
            d_tables = tuple(accumulate(u, v) for u, v in zip(d_tables, c)) if c else d_tables
        d_tables = tuple(d if want else None for d, want in zip(d_tables, ctx.needs_input_grad[6:]))
        return (None, None, None, None, d_dy if need_ddy else None, d_x if need_x else None) + d_tables
