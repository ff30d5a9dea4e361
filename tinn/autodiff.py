"""Parts and losses written as one forward Taichi function; Taichi's reverse mode derives the backward.

    @ti.func
    def fourier(x: ti.template(), p: ti.template(), b, net, y: ti.template()):
        for k in ti.static(range(8)):        # y[b, :] from x[b, :] and the network's row p[net, :]
            y[b, k] = ti.sin(p[net, k] * x[b, k % 2] + p[net, 8 + k])

    enc = tinn.autodiff.AutodiffPart(fourier, n_input_dims=2, n_output_dims=8, n_params=16, n_networks=64)
    y = enc(x, ids)                          # torch autograd, the Trainer, compositions: any tinn part

    @ti.func
    def charbonnier(pred: ti.template(), target: ti.template(), b, d, l: ti.template()):
        l[b, d] = ti.sqrt((pred[b, d] - target[b, d]) ** 2 + 1e-6)

    trainer = tinn.Trainer(model, tinn.autodiff.AutodiffLoss(charbonnier), {"otype": "Adam"})

A part's function reads sample `b`'s inputs `x[b, i]` and its network's parameters `p[net, j]` and
writes every output `y[b, k]`; a loss's function writes the loss of element (b, d), `l[b, d]`, from
`pred[b, :]` and `target[b, :]` (one thread per element; the loss is the mean over all elements, as tcnn's
losses are). tinn wraps the function
in a kernel over the samples (one thread each) and calls Taichi's `kernel.grad` for the backward: inputs
and parameters get their gradients, networks without samples get zero, ids may come in any order.

Taichi's reverse mode has rules that it does not enforce; tinn checks the function's source for them
when the part or loss is built (kernels/autodiff_source.py) and raises ConfigError naming the array or
loop and its line:
- **Global data access:** inputs (x, p; pred, target) are read-only; outputs (y; l) are written once per
  element and never read (no `y[...] += ...`). Breaking it gives silently wrong gradients.
  `check_function` also compares a part's gradients with float64 finite differences.
- **Dynamic loops** (a `range` that is not `ti.static`) keep one autodiff-stack entry per iteration;
  past the stack's size (`ad_stack_size`, 256 in tinn) Taichi crashes the process. tinn bounds every
  dynamic loop from the source (literals, Python ints of the function's scope, `.shape[1]` of the arrays)
  and refuses what it cannot bound or what would overflow, with the fix. Quadrants' reverse mode takes
  `ti.static` loops only (without its experimental stack), which tinn says at construction.
- **exp and tanh in dynamic loops:** Taichi 1.7.4's reverse mode takes their derivatives from their own
  result, which it stores once per loop (the last iteration's): silently wrong gradients. tinn rewrites a
  dynamic loop whose body calls exp, tanh or a helper function (which may hide one) as a `ti.static` loop
  and compiles the rewritten function; a loop it cannot unroll (break, continue) is refused with that
  cause. A part that keeps a dynamic loop or calls a helper is compared with finite differences along
  random directions at construction (`verify_gradients`), and refused with the cause the source shows.

**Buffers.** Taichi's torch interop takes a tensor's `.grad` as the kernel's gradient buffer; tinn hands
it detached aliases whose `.grad` are its own buffers, kept per part and zeroed per call (the copy of
`dy`, which the adjoint kernel consumes, and the replicated tables), so no call allocates `.grad`s.

**Parameter gradients** are float atomic adds, one per sample and parameter read. With R gradient
replicas sample b adds into copy b mod R of the table's gradient and one sum reduces the copies: fewer
threads collide on a network's row. `gradient_replicas=None` (default) picks R from the samples per
network and a memory budget (`replicas_for`); an explicit R is used as given.

**Second derivatives** (`create_graph=True`, eikonal losses): tinn derives the function's forward-mode
derivative by source transformation and lets Taichi's reverse mode differentiate it (forward over
reverse; Taichi 1.7.4 has no forward mode on ndarrays). Functions using a construct the transformation
does not know raise `SecondOrderError` naming it.
"""

import torch

from . import backend, checks, runtime
from .backend import ti
from .config import count
from .errors import ConfigError, InputError
from .kernels import autodiff_source as source
from .kernels.autodiff import loss_kernel, sample_kernel, tangent_kernel
from .kernels.launch import compile_from_stand_ins
from .losses import LossResult
from .part import SAMPLE_MAJOR, Context, Part, SecondOrderError

PART_ARGUMENTS = ("x", "p", "b", "net", "y")
LOSS_ARGUMENTS = ("pred", "target", "b", "d", "l")
#: Replica memory (table copy plus its gradient) tinn spends at most per part when it picks R itself.
REPLICA_BUDGET_BYTES = 64 << 20
#: Samples per network below which atomics on a row rarely collide, so replicas only cost copies.
REPLICA_MIN_SAMPLES = 256
#: On the CPU a few threads rarely meet on one address and the copies cost more than they save
#: (benchmarks/bench_autodiff.py, docs/design-notes.md); on a GPU thousands of threads do.
MAX_REPLICAS = {"cuda": 32, "cpu": 1}


def replicas_for(batch: int, n_networks: int, n_params: int, arch: str) -> int:
    """Gradient replicas for a batch: one per REPLICA_MIN_SAMPLES samples a network gets on average, at
    most MAX_REPLICAS[arch] and what fits REPLICA_BUDGET_BYTES (two copies of the table per replica)."""
    per_network = batch // max(n_networks, 1)
    budget = REPLICA_BUDGET_BYTES // max(1, 8 * n_networks * n_params)
    return max(1, min(MAX_REPLICAS.get(arch, 4), budget, per_network // REPLICA_MIN_SAMPLES))


def _stack_size() -> int:
    return int(ti.lang.impl.current_cfg().ad_stack_size)


def _check_source(func, kind, expected, inputs, outputs, shapes) -> source.Checked:
    return source.check(func, kind=kind, expected=expected, inputs=inputs, outputs=outputs, shapes=shapes,
                        ad_stack_size=_stack_size(), static_loops_only=backend.name() == "quadrants",
                        backend=backend.name(), unroll=True)


def _checked_function(func, checked: source.Checked):
    """The Taichi function to compile: `func` itself, or its rewrite where loops were unrolled."""
    return source.compile_function(func, checked, ti) if checked.unrolled else func


def _alias(t: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor:
    """A detached view of `t` that carries `grad` as its `.grad` (Taichi's gradient pointer for it)."""
    a = t.detach()
    if grad is not None:
        a.requires_grad_(True)
        a.grad = grad
    return a


class _Workspace:
    """Buffers a part reuses from call to call, by name; reallocated when the shape changes."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple, device) -> torch.Tensor:
        t = self.buffers.get(name)
        if t is None or tuple(t.shape) != tuple(shape) or t.device != device:
            t = self.buffers[name] = torch.empty(shape, dtype=torch.float32, device=device)
        return t


def _launch(kernel, args):
    # A new instance compiles from stand-ins: the compile context Taichi keeps would otherwise hold this
    # call's gradient buffer, and autograd would copy it instead of adopting it (kernels/launch.py).
    compile_from_stand_ins(kernel, args)
    return kernel(*args)


def _compile_guard(kind: str, func, signature: str, call):
    try:
        return call()
    except backend.compile_errors() as e:
        raise ConfigError(f"{kind}: the function {getattr(func, '__name__', func)!r} does not compile as "
                          f"{signature}: {str(e).strip().splitlines()[-1]}") from e


class AutodiffPart(Part):
    """A part from a per-sample forward `@ti.func` `func(x, p, b, net, y)`; see the module's notes.

    n_params: parameters per network (0 for a part without parameters). init: a callable
    `init(n_networks, n_params, generator) -> tensor` for the initial table (default uniform in [-1, 1]).
    gradient_replicas: copies of the parameter gradient the backward spreads samples over (None: chosen
    per batch by `replicas_for`).
    """

    def __init__(self, func, n_input_dims: int, n_output_dims: int, n_params: int, n_networks: int = 1, *,
                 init=None, seed: int = 1337, gradient_replicas: int | None = None):
        super().__init__(n_input_dims, n_output_dims, n_networks)
        if not callable(func):
            raise ConfigError(f"func must be a Taichi function (@ti.func), got {type(func).__name__}")
        self.func = func
        self.n_params = count("n_params", n_params, lo=0)
        self.gradient_replicas = None if gradient_replicas is None else count("gradient_replicas",
                                                                              gradient_replicas)
        self._checked = _check_source(func, "AutodiffPart", PART_ARGUMENTS, ("x", "p"), ("y",),
                                      {"x": {1: self.n_input_dims}, "p": {1: max(self.n_params, 1)},
                                       "y": {1: self.n_output_dims}})
        self._kernel = sample_kernel(_checked_function(func, self._checked))
        self._tangent = None  # (kernel, source) of the second-order path, built on first use
        self._work = _Workspace()
        self.seed = seed
        self._init = init
        self.params = torch.nn.Parameter(torch.empty(n_networks, max(self.n_params, 1), device=runtime.device()))
        self.params.requires_grad_(self.n_params > 0)
        self.reset_parameters(seed)
        if self._checked.dynamic_loops or self._checked.helper_calls:
            # What the source check cannot vouch for (a dynamic loop kept as such, a helper function's body)
            # is checked against finite differences once, before a wrong gradient can reach training.
            verify_gradients(self)

    def n_params_per_network(self) -> int:
        return max(self.n_params, 1)

    def parameter_tables(self):
        return (self.params,) if self.n_params else (None,)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        gen = torch.Generator().manual_seed(self.seed if seed is None else seed)
        if self._init is None:
            table = torch.rand(self.params.shape, generator=gen) * 2 - 1
        else:
            table = torch.as_tensor(self._init(self.n_networks, self.n_params, gen), dtype=torch.float32)
            if tuple(table.shape) != (self.n_networks, self.n_params):
                raise ConfigError(f"init returned shape {tuple(table.shape)}; expected "
                                  f"({self.n_networks}, {self.n_params}) (n_networks, n_params)")
            table = table if self.n_params else torch.zeros(self.params.shape)
        self.params.copy_(table)

    def replicas(self, batch: int) -> int:
        if self.gradient_replicas is not None:
            return self.gradient_replicas
        return replicas_for(batch, self.n_networks, self.n_params, runtime.arch())

    # ---- the contract --------------------------------------------------------------------------------
    def forward_with_context(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR):
        # Zeros: an output the function leaves unwritten reads 0, not uninitialised memory.
        y = torch.zeros(x.shape[0], self.n_output_dims, device=x.device)
        if x.shape[0]:
            self._call(self._kernel, x, ids, self.params.detach(), y, 1)
        return y, (Context(x=x, ids=ids) if train else None)

    def _tables_for(self, r: int, want: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(table the kernel reads, its gradient buffer): R stacked copies when r > 1 (workspace buffers),
        else the live table and a fresh zeroed gradient (returned to the caller)."""
        table = self.params.detach()
        if not want:
            return table, None
        if r == 1:
            return table, torch.zeros_like(table)
        shape = (r * self.n_networks, table.shape[1])
        copies = self._work.get("table", shape, table.device)
        copies.view(r, self.n_networks, -1).copy_(table.expand(r, -1, -1))
        grad = self._work.get("dtable", shape, table.device)
        grad.zero_()
        return copies, grad

    def _reduced(self, grad: torch.Tensor, r: int) -> torch.Tensor:
        return grad.view(r, self.n_networks, -1).sum(0) if r > 1 else grad

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        x, ids = ctx.x, ctx.ids
        want_params = need_grads and self.n_params > 0
        batch = x.shape[0]
        if not batch:
            return (torch.zeros_like(x) if need_dx else None), (
                torch.zeros_like(self.params) if want_params else None,)
        r = self.replicas(batch) if want_params else 1
        table, dtable = self._tables_for(r, want_params)
        dx = torch.zeros_like(x) if need_dx else None
        # The adjoint kernel consumes its output gradient (zeroes it) and never touches the primal output
        # (the function may not read y), so one workspace copy of dy serves as both.
        work_dy = self._work.get("dy", dy.shape, dy.device)
        work_dy.copy_(dy)
        with torch.no_grad():
            self._call(self._kernel.grad, _alias(x, dx), ids, _alias(table, dtable), _alias(work_dy, work_dy), r)
        return dx, ((self._reduced(dtable, r) if want_params else None),)

    def backward_backward(self, ctx, dy, ddx, *, need_ddy, need_dx, need_dtables):
        """Through the tangent function: d_dy = J ddx (its forward), d_x and d_p = the gradient of
        <dy, J(x, p) ddx> (Taichi's reverse mode over it)."""
        kernel = self._tangent_kernel()
        x, ids = ctx.x, ctx.ids
        batch = x.shape[0]
        want_params = need_dtables and self.n_params > 0
        d_x = torch.zeros_like(x) if need_dx else None
        if ddx is None:
            ddx = torch.zeros_like(x)
        d_dy = None
        if need_ddy:
            d_dy = torch.zeros(batch, self.n_output_dims, device=x.device)
            if batch:
                self._call(kernel, x, ids, self.params.detach(), d_dy, 1, tangent=ddx)
        d_p = None
        if (need_dx or want_params) and batch:
            r = self.replicas(batch) if want_params else 1
            table, d_table = self._tables_for(r, want_params)
            work_dy = self._work.get("dy", dy.shape, dy.device)
            work_dy.copy_(dy)
            with torch.no_grad():
                self._call(kernel.grad, _alias(x, d_x), ids, _alias(table, d_table), _alias(work_dy, work_dy), r,
                           tangent=ddx.contiguous())
            d_p = self._reduced(d_table, r) if want_params else None
        elif want_params:
            d_p = torch.zeros_like(self.params)
        return d_dy, d_x, (d_p,)

    def _tangent_kernel(self):
        if self._tangent is None:
            try:
                tangent, text = source.tangent_function(self.func, ti, self._checked)
            except source.Unsupported as exc:
                raise SecondOrderError(f"second derivatives through AutodiffPart {self.func.__name__!r} need its "
                                       f"forward-mode derivative, which tinn cannot derive: the function uses "
                                       f"{exc}") from exc
            self._tangent = (tangent_kernel(tangent), text)
        return self._tangent[0]

    def _call(self, kernel, x, ids, table, y, replicas: int, tangent=None):
        args = (x, ids, table, y, self.n_networks, replicas) if tangent is None else \
            (x, tangent, ids, table, y, self.n_networks, replicas)
        _compile_guard("AutodiffPart", self.func, "func(x, p, b, net, y)", lambda: _launch(kernel, args))

    def extra_repr(self) -> str:
        r = "auto" if self.gradient_replicas is None else self.gradient_replicas
        return (f"func={getattr(self.func, '__name__', '?')}, in={self.n_input_dims}, out={self.n_output_dims}, "
                f"n_params={self.n_params}, n_networks={self.n_networks}, replicas={r}")


class AutodiffLoss:
    """A loss from a per-element `@ti.func` `func(pred, target, b, d, l)` writing the loss `l[b, d]` of
    element (b, d) (it may read the whole row b); the value is the mean over all elements. Used like tinn's losses: by the Trainer
    (`evaluate`: value and gradient, per-network means) and as a differentiable torch op (`loss(pred,
    target)`, gradients to pred and, when it requires one, target)."""

    def __init__(self, func, name: str | None = None):
        if not callable(func):
            raise ConfigError(f"func must be a Taichi function (@ti.func), got {type(func).__name__}")
        runtime.ensure_init()
        self.func = func
        self.otype = name or getattr(func, "__name__", "AutodiffLoss")
        # Arguments and the access rule now; loop bounds per output width (they may read .shape[1]).
        source.check(func, kind="AutodiffLoss", expected=LOSS_ARGUMENTS, inputs=("pred", "target"), outputs=("l",),
                     shapes={}, ad_stack_size=_stack_size(), static_loops_only=False, backend=backend.name(),
                     check_loops=False)
        # One kernel per row width: loops over `.shape[1]` are bounded (and unrolled where needed) per width.
        self._kernels: dict[int, object] = {}
        self._work = _Workspace()

    def _inputs(self, pred, target, data_pdf):
        if data_pdf is not None:
            raise InputError(f"data_pdf is not supported by AutodiffLoss {self.otype!r}; weight the loss inside "
                             "its function instead")
        pred = checks.float_input("pred", pred.detach(), None)
        target = checks.float_input("target", target.detach(), pred.shape[1])
        if target.shape[0] != pred.shape[0]:
            raise InputError(f"target has batch size {target.shape[0]}; expected {pred.shape[0]} to match pred")
        dims = pred.shape[1]
        if dims not in self._kernels:
            checked = _check_source(self.func, "AutodiffLoss", LOSS_ARGUMENTS, ("pred", "target"), ("l",),
                                    {r: {1: dims} for r in ("pred", "target", "l")})
            self._kernels[dims] = loss_kernel(_checked_function(self.func, checked))
        return pred, target

    def _run(self, pred, target, need_pred: bool, need_target: bool, scale: float):
        """(per-element values, d(scale * sum)/d pred or None, d/d target or None)."""
        values = torch.zeros_like(pred)
        if not pred.numel():
            return values, (torch.zeros_like(pred) if need_pred else None), \
                (torch.zeros_like(target) if need_target else None)
        guard = lambda k, *a: _compile_guard("AutodiffLoss", self.func, "func(pred, target, b, d, l)",  # noqa: E731
                                             lambda: _launch(k, a))
        kernel = self._kernels[pred.shape[1]]
        guard(kernel, pred, target, values)
        d_pred = torch.zeros_like(pred) if need_pred else None
        d_target = torch.zeros_like(target) if need_target else None
        if need_pred or need_target:
            seed = self._work.get("seed", pred.shape, pred.device)
            seed.fill_(scale)  # consumed by the adjoint kernel, refilled per call
            with torch.no_grad():
                guard(kernel.grad, _alias(pred, d_pred), _alias(target, d_target), _alias(seed, seed))
        return values, d_pred, d_target

    def evaluate(self, pred: torch.Tensor, target: torch.Tensor, net_ids: torch.Tensor | None = None,
                 n_networks: int | None = None, data_pdf: torch.Tensor | None = None) -> LossResult:
        """Mean loss, its gradient w.r.t. `pred`, and per-network means if `n_networks` is given."""
        runtime.require_init()
        pred, target = self._inputs(pred, target, data_pdf)
        n_total = pred.numel()
        values, grad, _ = self._run(pred, target, True, False, 1.0 / max(n_total, 1))
        value = values.mean() if n_total else values.new_zeros(())
        per_network = None
        if n_networks is not None:
            from .losses import per_network_means
            per_network = per_network_means(values, net_ids, n_networks)
        return LossResult(value, grad, per_network)

    def __call__(self, pred: torch.Tensor, target: torch.Tensor, data_pdf: torch.Tensor | None = None) -> torch.Tensor:
        return _AutodiffLossFn.apply(self, pred, target, data_pdf)

    def hyperparams(self) -> dict:
        return {"otype": self.otype}

    def __repr__(self) -> str:
        return f"AutodiffLoss({self.otype!r})"


class _AutodiffLossFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss, pred, target, data_pdf):
        p, t = loss._inputs(pred, target, data_pdf)
        n = p.numel()
        values, d_pred, d_target = loss._run(p, t, ctx.needs_input_grad[1], ctx.needs_input_grad[2], 1.0 / max(n, 1))
        ctx.save_for_backward(d_pred, d_target)
        return values.mean() if n else values.new_zeros(())

    @staticmethod
    def backward(ctx, dvalue):
        d_pred, d_target = ctx.saved_tensors
        return (None, None if d_pred is None else d_pred * dvalue, None if d_target is None else d_target * dvalue,
                None)


def _mismatch_cause(part: AutodiffPart) -> str:
    """What a gradient that differs from finite differences points to, from what the source shows."""
    checked = part._checked
    causes = []
    if checked.dynamic_loops:
        causes.append(f"Taichi's reverse mode of the dynamic loop at {', '.join(checked.dynamic_loops)} gets "
                      "this derivative wrong (it takes a non-linear op's derivative from a result stored once, "
                      "not per iteration, as it does for exp and tanh); write the loop as ti.static(range(...))")
    if checked.helper_calls or not causes:
        where = f" or a function it calls ({', '.join(checked.helper_calls)})" if checked.helper_calls else ""
        causes.append(f"the function{where} may read its output y or write x or p (Taichi's global data access "
                      "rule)")
    return "; or ".join(causes)


def _probe_inputs(part: AutodiffPart, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    dev = runtime.device()
    x = (torch.rand(batch, part.n_input_dims, generator=gen) * 2 - 1).to(dev)
    ids = torch.randint(0, part.n_networks, (batch,), generator=gen, dtype=torch.int32).to(dev)
    w = torch.randn(batch, part.n_output_dims, generator=gen).to(dev)
    return gen, x, ids, w


def verify_gradients(part: AutodiffPart, batch: int = 8, directions: int = 3, seed: int = 0) -> None:
    """Compare the part's generated gradient with central finite differences along a few random directions
    of (x, p) (float32 forward as the part runs it, float64 sums); raise ConfigError with the cause the
    source points to where they differ at two step sizes (a kink between the probes moves with the step,
    a wrong gradient does not). Runs on a compact copy of the rows the probe samples use, so its cost is
    a few launches whatever the table's size; AutodiffPart calls it at construction where the source check
    cannot vouch for the function (a dynamic loop, a helper function)."""
    gen, x, ids, w = _probe_inputs(part, batch, seed)
    rows, inverse = torch.unique(ids, return_inverse=True)
    table = part.params.detach()[rows.long()].contiguous()
    local_ids = inverse.to(torch.int32).contiguous()

    def value(xv, tv) -> float:
        out = torch.zeros(batch, part.n_output_dims, device=x.device)
        part._call(part._kernel, xv.contiguous(), local_ids, tv.contiguous(), out, 1)
        return float((out.double() * w.double()).sum())

    dx, dt, seed_dy = torch.zeros_like(x), torch.zeros_like(table), w.clone()
    with torch.no_grad():
        part._call(part._kernel.grad, _alias(x, dx), local_ids, _alias(table, dt), _alias(seed_dy, seed_dy), 1)
    for _ in range(directions):
        vx = torch.randn(x.shape, generator=gen).to(x.device)
        vt = torch.randn(table.shape, generator=gen).to(x.device) * (1.0 if part.n_params else 0.0)
        terms = torch.cat([(dx.double() * vx.double()).flatten(), (dt.double() * vt.double()).flatten()])
        got, scale = float(terms.sum()), float(terms.abs().sum())
        misses = []
        for eps in (1e-3, 4e-3):
            fd = (value(x + eps * vx, table + eps * vt) - value(x - eps * vx, table - eps * vt)) / (2 * eps)
            misses.append(abs(got - fd) > 1e-2 * scale + 1e-3)
        if all(misses):
            raise ConfigError(f"AutodiffPart {getattr(part.func, '__name__', '?')}: its gradient along a random "
                              f"direction is {got:.6g} but finite differences give {fd:.6g}: "
                              f"{_mismatch_cause(part)}")


def check_function(part: AutodiffPart, batch: int = 16, eps: float = 1e-3, rtol: float = 2e-2, seed: int = 0) -> None:
    """Compare the part's generated gradients with central finite differences per coordinate (float32
    forward, float64 arithmetic on the differences) at random inputs; raise ConfigError naming the first
    derivative that differs and the cause the source points to (a dynamic loop Taichi's reverse mode gets
    wrong, or the global data access rule broken where the source check cannot see it, in a helper)."""
    _, x, ids, w = _probe_inputs(part, batch, seed)
    dev = x.device
    y, ctx = part.forward_with_context(x, ids, train=True)
    dx, (dp,) = part.backward(ctx, w, need_dx=True)

    def value(xv, table):
        out = torch.zeros(batch, part.n_output_dims, device=dev)
        part._call(part._kernel, xv.contiguous(), ids, table.contiguous(), out, 1)
        return float((out.double() * w.double()).sum())

    table = part.params.detach().clone()
    probes = [("x", (b, i)) for b in range(min(batch, 3)) for i in range(part.n_input_dims)]
    if part.n_params:
        used = sorted(set(ids.tolist()))[:2]
        probes += [("p", (n, j)) for n in used for j in range(part.n_params)]
    for name, (r, c) in probes:
        base = x if name == "x" else table
        hi, lo = base.clone(), base.clone()
        hi[r, c] += eps
        lo[r, c] -= eps
        fd = (value(hi, table) - value(lo, table)) / (2 * eps) if name == "x" else \
            (value(x, hi) - value(x, lo)) / (2 * eps)
        got = float((dx if name == "x" else dp)[r, c])
        if abs(got - fd) > rtol * max(abs(fd), 1.0) + 1e-3:
            raise ConfigError(f"AutodiffPart {getattr(part.func, '__name__', '?')}: d/d{name}[{r}, {c}] is {got:.6g} "
                              f"but finite differences give {fd:.6g}: {_mismatch_cause(part)}")


# ---- built-in functions on this path (checked alternatives to hand-written kernels) ----------------------
def frequency_encoding(n_input_dims: int, n_frequencies: int = 12) -> AutodiffPart:
    """tcnn's Frequency encoding (sin and cos of 2^k pi x per input dim, tcnn's feature order) written as
    one forward function: the same function as tinn's hand-written `Frequency`, with Taichi's backward
    and second derivatives (tests compare the two; benchmarks/bench_autodiff.py their cost)."""
    dims, freqs = count("n_input_dims", n_input_dims), count("n_frequencies", n_frequencies)

    @ti.func
    def frequency(x: ti.template(), p: ti.template(), b, net, y: ti.template()):
        for d in ti.static(range(dims)):
            for k in ti.static(range(freqs)):
                v = x[b, d] * (2.0 ** k) * 3.141592653589793
                y[b, (d * freqs + k) * 2] = ti.sin(v)
                y[b, (d * freqs + k) * 2 + 1] = ti.cos(v)

    return AutodiffPart(frequency, dims, 2 * dims * freqs, 0)


@ti.func
def _l2(pred: ti.template(), target: ti.template(), b, d, l: ti.template()):
    l[b, d] = (pred[b, d] - target[b, d]) ** 2


@ti.func
def _l1(pred: ti.template(), target: ti.template(), b, d, l: ti.template()):
    l[b, d] = ti.abs(pred[b, d] - target[b, d])


@ti.func
def _mape(pred: ti.template(), target: ti.template(), b, d, l: ti.template()):
    l[b, d] = ti.abs(pred[b, d] - target[b, d]) / (ti.abs(target[b, d]) + 0.01)


#: tcnn losses whose formula differentiates as tcnn's gradient does (no constant-in-the-gradient
#: denominators), written as forward functions: checked alternatives to tinn's hand-written loss kernel.
LOSS_FUNCTIONS = {"L2": _l2, "L1": _l1, "MAPE": _mape}


def builtin_loss(otype: str) -> AutodiffLoss:
    """The loss named `otype` in LOSS_FUNCTIONS ("L2", "L1", "MAPE") as an AutodiffLoss, differentiated by
    Taichi; `tinn.create_loss(config)` builds tinn's hand-written loss kernels from a tcnn loss config."""
    if otype not in LOSS_FUNCTIONS:
        raise ConfigError(f"autodiff loss {otype!r} is not built in; allowed: {list(LOSS_FUNCTIONS)}")
    return AutodiffLoss(LOSS_FUNCTIONS[otype], otype)
