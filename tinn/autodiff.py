"""Parts written as one forward Taichi function; Taichi's reverse mode derives the backward.

    @ti.func
    def fourier(x: ti.template(), p: ti.template(), b, net, y: ti.template()):
        for k in ti.static(range(8)):        # y[b, :] from x[b, :] and the network's row p[net, :]
            y[b, k] = ti.sin(p[net, k] * x[b, k % 2] + p[net, 8 + k])

    enc = tinn.autodiff.AutodiffPart(fourier, n_input_dims=2, n_output_dims=8, n_params=16, n_networks=64)
    y = enc(x, ids)                          # torch autograd, the Trainer, compositions: any tinn part

The function reads sample `b`'s inputs `x[b, i]` and its network's parameters `p[net, j]` and writes every
output `y[b, k]`. tinn wraps it in a kernel over the samples (one thread each) and calls Taichi's
`kernel.grad` for the backward: inputs and parameters get their gradients, networks without samples get
zero, ids may come in any order (ragged routing).

Taichi's reverse mode has rules (docs.taichi-lang.org, "Differentiable programming"), which hold here:
- **Global data access:** the function may only *write* `y` (once per element), and it may not read `y`.
  A function that reads an output it wrote, or writes x or p, gets wrong gradients. `check_function` runs
  it against float64 finite differences and raises `ConfigError` naming the first wrong derivative.
- **Loops whose trip count is not known at compile time** keep their iterations on Taichi's autodiff stack:
  start tinn with a stack that holds them, `tinn.init(ad_stack_size=N)` (passed to `ti.init`);
  `ti.static` loops need none. Quadrants' reverse mode refuses such loops: there a `ConfigError` says so.

**Gradient buffers.** They are the torch tensors' own `.grad` (Taichi's torch interop), made once and
zeroed per call.

**Parameter gradients.** These are float atomic adds, one per sample and parameter used. With
`gradient_replicas=R` the samples spread over R copies of the table's gradient (sample b adds into copy
b mod R), which are summed after: fewer collisions on hot rows, R times the gradient memory.

Second derivatives are not derived: such a part raises `SecondOrderError` where one is asked for. The
hand-written parts of tinn are faster; `benchmarks/bench_autodiff.py` measures by how much.
"""
from __future__ import annotations

import torch

from . import backend, runtime
from .config import count
from .errors import ConfigError
from .kernels.autodiff import element_kernel, sample_kernel
from .part import SAMPLE_MAJOR, Context, Part

class AutodiffPart(Part):
    """A part from a per-sample forward `@ti.func` `func(x, p, b, net, y)`; see the module's notes.

    n_params: parameters per network (0 for a part without parameters). init: a callable
    `init(n_networks, n_params, generator) -> tensor` for the initial table (default uniform in [-1, 1]).
    """

    def __init__(self, func, n_input_dims: int, n_output_dims: int, n_params: int, n_networks: int = 1, *,
                 init=None, seed: int = 1337, gradient_replicas: int = 1):
        super().__init__(n_input_dims, n_output_dims, n_networks)
        if not callable(func):
            raise ConfigError(f"func must be a Taichi function (@ti.func), got {type(func).__name__}")
        self.func = func
        self.n_params = count("n_params", n_params, lo=0)
        self.gradient_replicas = count("gradient_replicas", gradient_replicas)
        self._kernel = sample_kernel(func)
        self._buffers: dict = {}
        self.seed = seed
        self._init = init
        self.params = torch.nn.Parameter(torch.empty(n_networks, max(self.n_params, 1), device=runtime.device()))
        self.params.requires_grad_(self.n_params > 0)
        self.reset_parameters(seed)

    def n_params_per_network(self) -> int:
        return max(self.n_params, 1)

    def tables(self):
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

    # ---- the contract --------------------------------------------------------------------------------
    def forward_ctx(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR):
        if x_layout != SAMPLE_MAJOR or y_layout != SAMPLE_MAJOR:
            raise ValueError("autodiff parts read and write sample-major tensors")
        y = torch.zeros(x.shape[0], self.n_output_dims, device=x.device)
        if x.shape[0]:
            self._call(self._kernel, x, ids, self.params.detach(), y, replicas=1)
        return y, (Context(x=x, ids=ids) if train else None)

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        x, ids = ctx.x, ctx.ids
        want_params = need_grads and self.n_params > 0
        if not x.shape[0]:
            return (torch.zeros_like(x) if need_dx else None), (
                torch.zeros_like(self.params) if want_params else None,)
        r = self.gradient_replicas if want_params else 1
        table, x_in, y = self._adjoint_buffers(x.shape[0], r, need_dx, want_params, x.device)
        with torch.no_grad():
            table.copy_(self.params.detach().repeat(r, 1) if r > 1 else self.params.detach())
            x_in.copy_(x)
            y.grad.copy_(dy)
            for t in (table, x_in):
                if t.grad is not None:
                    t.grad.zero_()
            # The adjoint kernel recomputes the forward's values itself; it adds into the .grad buffers.
            self._call(self._kernel.grad, x_in, ids, table, y, replicas=r)
        dtable = None
        if want_params:
            dtable = table.grad.view(r, self.n_networks, -1).sum(0) if r > 1 else table.grad.clone()
        return (x_in.grad.clone() if need_dx else None), (dtable,)

    def _adjoint_buffers(self, batch: int, replicas: int, need_dx: bool, want_params: bool, device):
        """Leaf tensors for the adjoint kernel, kept for the last batch shapes and reused: Taichi's torch interop
        takes a tensor's .grad as its gradient buffer when the tensor requires grad."""
        key = (batch, replicas, need_dx, want_params)
        buffers = self._buffers.get(key)
        if buffers is None:
            if len(self._buffers) >= 2:
                self._buffers.clear()
            table = torch.empty(replicas * self.n_networks, self.params.shape[1], device=device)
            x_in = torch.empty(batch, self.n_input_dims, device=device)
            y = torch.zeros(batch, self.n_output_dims, device=device)
            for t, wanted in ((table, want_params), (x_in, need_dx), (y, True)):
                t.requires_grad_(wanted)
                if wanted:
                    t.grad = torch.zeros_like(t)
            buffers = self._buffers[key] = (table, x_in, y)
        return buffers

    def _call(self, kernel, x, ids, table, y, replicas: int):
        try:
            kernel(x, ids, table, y, self.n_networks, replicas)
        except backend.compile_errors() as e:
            raise ConfigError(f"AutodiffPart: the function {getattr(self.func, '__name__', self.func)!r} does not "
                              f"compile as func(x, p, b, net, y) (or its reverse mode): "
                              f"{str(e).strip().splitlines()[-1]}") from e

    def extra_repr(self) -> str:
        return (f"func={getattr(self.func, '__name__', '?')}, in={self.n_input_dims}, out={self.n_output_dims}, "
                f"n_params={self.n_params}, n_networks={self.n_networks}, replicas={self.gradient_replicas}")


class AutodiffLoss:
    """A loss from a per-element forward `@ti.func` `func(pred, target, b, c, out)` writing out[b, c]; the
    loss is the mean of `out`, its gradient with respect to `pred` comes from Taichi's reverse mode.

    Use it as the Trainer's loss (`Trainer(model, AutodiffLoss(f), ...)`) or call it on tensors
    (`loss(pred, target)`, differentiable by torch autograd). The same access rule holds: write `out`
    only, read nothing it writes.
    """

    def __init__(self, func):
        if not callable(func):
            raise ConfigError(f"func must be a Taichi function (@ti.func), got {type(func).__name__}")
        self.func = func
        self._kernel = element_kernel(func)

    def evaluate(self, pred: torch.Tensor, target: torch.Tensor, **_) -> "LossResult":
        from .losses import LossResult

        if pred.shape != target.shape or pred.dim() != 2:
            raise ConfigError(f"AutodiffLoss needs pred and target of one (batch, dims) shape, got "
                              f"{tuple(pred.shape)} and {tuple(target.shape)}")
        p = pred.detach().float().contiguous().requires_grad_(True)
        p.grad = torch.zeros_like(p)
        out = torch.zeros_like(p).requires_grad_(True)
        out.grad = torch.full_like(p, 1.0 / max(p.numel(), 1))   # d mean / d out
        t = target.detach().float().contiguous()
        with torch.no_grad():
            try:
                self._kernel(p, t, out)
                self._kernel.grad(p, t, out)
            except backend.compile_errors() as e:
                raise ConfigError(f"AutodiffLoss: the function {getattr(self.func, '__name__', self.func)!r} does "
                                  f"not compile as func(pred, target, b, c, out): "
                                  f"{str(e).strip().splitlines()[-1]}") from e
            value = out.detach().mean()
        return LossResult(value, p.grad)

    def __call__(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _LossFunction.apply(self, pred, target)


class _LossFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss, pred, target):
        result = loss.evaluate(pred, target)
        ctx.save_for_backward(result.grad)
        return result.value

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return None, grad * g, None


def check_function(part: AutodiffPart, batch: int = 16, eps: float = 1e-3, rtol: float = 2e-2, seed: int = 0) -> None:
    """Compare the part's generated gradients with central finite differences (float32 forward, float64
    arithmetic on the differences) at random inputs; raise ConfigError naming the first derivative that
    differs, which is how a function breaking Taichi's global data access rule shows."""
    gen = torch.Generator().manual_seed(seed)
    dev = runtime.device()
    x = (torch.rand(batch, part.n_input_dims, generator=gen) * 2 - 1).to(dev)
    ids = torch.randint(0, part.n_networks, (batch,), generator=gen, dtype=torch.int32).to(dev)
    w = torch.randn(batch, part.n_output_dims, generator=gen).to(dev)
    y, ctx = part.forward_ctx(x, ids, train=True)
    dx, (dp,) = part.backward(ctx, w, need_dx=True)

    def value(xv, table):
        out = torch.zeros(batch, part.n_output_dims, device=dev)
        part._call(part._kernel, xv.contiguous(), ids, table.contiguous(), out, replicas=1)
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
                              f"but finite differences give {fd:.6g}; the function may read its output y or "
                              "write x or p (Taichi's global data access rule)")
