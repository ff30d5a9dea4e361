"""tcnn's Adam (with AdaBound, weight decay and clipping options).

Differences from torch.optim.Adam, on purpose (they are tcnn's):
- epsilon is added to sqrt(v) *before* bias correction: w -= lr_t * m / (sqrt(v) + eps) with
  lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t); both agree when eps is negligible.
- l2_reg (default 1e-8) is added to the gradient of matrix params (network weights), non_matrix_l2_reg
  (default 0) to that of non-matrix params (encoding tables, see `base.is_matrix_param`); with
  skip_zero_grad_non_matrix_params (default true) non-matrix elements with an exactly zero gradient
  are skipped, so every element keeps its own step count for the bias correction; a tensor never
  skipped keeps one count (a scalar of the state), not one per element.
- gradient_clipping_magnitude (0: off) clamps the regularised gradient to [-c, c] before the moments;
  clipping_magnitude (0: off) clamps the new weight.
- relative_decay / absolute_decay shrink the weight by (relative_decay * lr_t) * w and
  (absolute_decay * lr_t) * sign(w) (decoupled, scaled by the bias-corrected rate).
- adabound clamps lr_t / (sqrt(v) + eps) to [0.1 - 0.1/((1-beta2) t + 1), 0.1 + 0.1/((1-beta2) t)].

Compact (bfloat16) grid tables arrive with sparse gradients: only their entries are stepped (the lazy
Adam of torch.optim.SparseAdam), with the same per-element update, bfloat16 moments, stochastically
rounded weights (tinn/kernels/compact.py) and one step count per tensor for the bias correction.

A step skipped on the device (`step(skip=flag)`, a float16 network's overflow) moves no weight, moment or
per-element count; a tensor's one step count is its host count less its steps skipped and not yet settled
(`LeafOptimizer.settle`), which the kernel reads on the device. AdaBound's bounds and compact tables take
their counts on the host: with either, the flag is read on the host.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from .. import chunks
from ..config import Section
from ..kernels import compact as compact_kernels
from ..kernels import optimizers as optimizer_kernels
from ..kernels import triton_step_kernels
from .base import LeafOptimizer, is_matrix_param, no_skip

F32_MAX = 3.4028234663852886e38


class Adam(LeafOptimizer):
    otype = "Adam"
    COMPACT = True
    ELEMENTWISE = True
    OPTIONS = ("learning_rate", "beta1", "beta2", "epsilon", "l2_reg", "relative_decay", "absolute_decay",
               "adabound", "clipping_magnitude", "gradient_clipping_magnitude", "non_matrix_learning_rate_factor",
               "non_matrix_l2_reg", "optimize_matrix_params", "optimize_non_matrix_params",
               "skip_zero_grad_non_matrix_params")

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.beta1 = cfg.number("beta1", 0.9, lo=0.0, hi=0.999999)
        self.beta2 = cfg.number("beta2", 0.999, lo=0.0, hi=0.999999)
        self.epsilon = cfg.number("epsilon", 1e-8, lo=0.0, lo_open=True)
        self.l2_reg = cfg.number("l2_reg", 1e-8, lo=0.0)
        self.relative_decay = cfg.number("relative_decay", 0.0, lo=0.0, hi=1.0)
        self.absolute_decay = cfg.number("absolute_decay", 0.0, lo=0.0)
        self.adabound = cfg.boolean("adabound", False)
        self.clipping_magnitude = cfg.number("clipping_magnitude", 0.0, lo=0.0)
        self.gradient_clipping_magnitude = cfg.number("gradient_clipping_magnitude", 0.0, lo=0.0)
        self.non_matrix_l2_reg = cfg.number("non_matrix_l2_reg", 0.0, lo=0.0)
        self.skip_zero_grad_non_matrix_params = cfg.boolean("skip_zero_grad_non_matrix_params", True)
        self.non_matrix_learning_rate_factor = cfg.number("non_matrix_learning_rate_factor", 1.0, lo=0.0)
        self.optimize_matrix_params = cfg.boolean("optimize_matrix_params", True)
        self.optimize_non_matrix_params = cfg.boolean("optimize_non_matrix_params", True)
        self.is_matrix = {name: is_matrix_param(name, p) for name, p in self.named_params}
        self._corrections = None  # the kernels' bias corrections by step count (`_correction_table`)
        self._corrections_made = 0  # tables made so far (a captured step reads the one it was captured with)
        # Captured steps (tinn/step_graphs.py): per tensor counted as a whole, its step count less one on the
        # device, and the kernel's pending operand made from it; `_capturing` while a step is captured.
        self._graph_counts: dict[str, torch.Tensor] = {}
        self._graph_operands: dict[str, torch.Tensor] = {}
        self._capturing = False
        self._no_steps = None
        for name, p in self.named_params:
            self.new_state("m", name, dtype=p.dtype)
            self.new_state("v", name, dtype=p.dtype)
            if p.dtype == torch.bfloat16:
                self.scalars[f"steps.{name}"] = 0
            elif self._skips(name):
                self.new_state("steps", name, dtype=torch.int32)
            else:
                self.scalars[f"steps.{name}"] = 0
                self._pending_keys[f"steps.{name}"] = len(self._pending_keys)
                if self._no_steps is None:  # the kernels' steps argument, unread for these tensors
                    self._no_steps = torch.zeros(1, 1, dtype=torch.int32, device=p.device)

    @property
    def skips_on_device(self) -> bool:
        return not self.adabound and all(p.dtype != torch.bfloat16 for _, p in self.named_params)

    def _skips(self, name) -> bool:
        """Whether elements of `name` with a zero gradient are left alone (then each counts its own steps)."""
        return not self.is_matrix[name] and self.skip_zero_grad_non_matrix_params

    def _bounds(self) -> tuple[float, float]:
        if not self.adabound:
            return 0.0, F32_MAX
        t = float(self.step_count)
        return 0.1 - 0.1 / ((1 - self.beta2) * t + 1), 0.1 + 0.1 / ((1 - self.beta2) * t)

    def _counted(self, updates) -> tuple[str, ...]:
        return tuple(f"steps.{name}" for name, *_ in updates if self._optimized(name) and not self._skips(name))

    def _update_all(self, updates, skip=None) -> None:
        """Two updated tensors (an encoding and its network, the usual model) share one launch
        (`adam_step_pair`): the same elementwise update, less host time. Otherwise one launch each, per row
        chunk of tables past the chunk limit (tinn/chunks.py). On CUDA the launches are Triton's
        (`tuning.triton_step_kernels`, tinn/kernels/adam_triton.py), else Taichi's."""
        todo = [self._operands(*update, skip) for update in updates if self._optimized(update[0])]
        if not todo:
            return
        device = todo[0][0].device
        triton = triton_step_kernels(device)
        hyper = (self._correction_table(device),) + self._hyper()
        if len(todo) == 2 and all(chunks.single(operands[0]) for operands in todo):
            self._launch([self._kernel_arguments(operands, flat=not triton) for operands in todo], hyper, triton)
            return
        for operands in todo:
            w = operands[0]
            for lo, hi in chunks.row_spans(w.shape[0], w.shape[1]):
                self._launch([self._kernel_arguments(operands, lo, hi, flat=not triton)], hyper, triton)

    @staticmethod
    def _launch(tables, hyper, triton: bool) -> None:
        """One launch over one or two tables' kernel arguments (`hyper`: what they share, the correction table
        first)."""
        if triton:
            from ..kernels import adam_triton
            adam_triton.adam_step(tables, hyper)
        elif len(tables) == 2:
            optimizer_kernels.adam_step_pair(*tables[0], *tables[1], *hyper)
        else:
            optimizer_kernels.adam_step(*tables[0], *hyper)

    # ---- captured steps (tinn/step_graphs.py) ----------------------------------------------------
    # Steps a replayed graph can take before its correction table must grow (which then recaptures it), and the
    # first table's length: large enough that a replayed run starts without growing it (a blocking copy).
    GRAPH_HEADROOM = 1 << 16
    FIRST_TABLE = 1 << 17

    def graph_key(self, device) -> tuple | None:
        """The hyperparameters and the correction table a captured step reads; None where the step cannot be
        captured: Taichi's kernels, AdaBound's host bounds, compact tables, a learning rate computed on the
        device by a schedule, or a skip flag read on the host."""
        if (not self.skips_on_device or self.adabound or self.device_learning_rate is not None
                or not triton_step_kernels(device)):
            return None
        self._correction_table(device, headroom=self.GRAPH_HEADROOM)
        return (self, tuple(self.hyperparams().items()), self._corrections_made, self.state_storage())

    def begin_capture(self, device) -> None:
        for name, p in self.named_params:
            if not self._skips(name) and name not in self._graph_counts:
                self._graph_counts[name] = torch.zeros(1, dtype=torch.int32, device=device)
                self._graph_operands[name] = torch.zeros(1, dtype=torch.int32, device=device)
            self.pending(f"steps.{name}" if not self._skips(name) else "step_count", device)  # made outside
        self._capturing = True

    def end_capture(self) -> None:
        self._capturing = False

    def load_graph_counts(self) -> None:
        for name, count in self._graph_counts.items():
            count.fill_(self.scalars[f"steps.{name}"] - 1)

    def _correction_table(self, device, headroom: int = 1) -> torch.Tensor:
        """Adam's bias correction sqrt(1 - beta2^t) / (1 - beta1^t) for every step count t up to the steps asked so
        far (entry t; entry 0 unused), for both launch paths. Computed in float64 and rounded once: with beta2 near 1 a
        float32 power loses most of 1 - beta2^t's digits, and two powers an element (float32 on the CPU, float64
        on CUDA) were most of a hash grid's Adam, where every entry counts its own steps (design notes).
        Grown by doubling, so a new table is made a logarithmic number of times."""
        need = int(self.scalars["step_count"]) + headroom
        table = self._corrections
        if table is None or table.shape[0] < need or table.device != device:
            size = max(need, self.FIRST_TABLE, 2 * (0 if table is None else table.shape[0]))
            with np.errstate(divide="ignore", invalid="ignore"):
                values = self._bias_corrections(np.arange(size, dtype=np.float64))
            values[0] = 0.0
            self._corrections = table = torch.from_numpy(values.astype(np.float32)).to(device)
            self._corrections_made += 1
        return table

    def _bias_corrections(self, t):
        """sqrt(1 - beta2^t) / (1 - beta1^t) in float64, of the betas as the kernels receive them (float32)."""
        beta1, beta2 = (float(np.float32(b)) for b in (self.beta1, self.beta2))
        return np.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)

    def _kernel_arguments(self, operands, lo: int = 0, hi: int | None = None, flat: bool = True) -> tuple:
        """A tensor's kernel arguments for rows lo .. hi, as the kernels take them: its tables (flat for Taichi's
        kernels; Triton's read the (rows, cols) tables through their pointers, and each view costs the host a torch
        call) and the row length after the row scales (w, g, m, v, steps, lr_scale, cols, lr, ...)."""
        w, g, m, v, steps, lr_scale, *rest = operands
        if hi is not None or lo:
            w, g, m, v, lr_scale = w[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], lr_scale[lo:hi]
            if steps is not self._no_steps:
                steps = steps[lo:hi]
        cols = max(1, w.shape[1])
        if flat:
            w, g, m, v, steps = w.view(-1), g.view(-1), m.view(-1), v.view(-1), steps.view(-1)
        return (w, g, m, v, steps, lr_scale, cols, *rest)

    def _update_sparse(self, name, w, g, lr_scale) -> None:
        """A compact table: its entries with a gradient, row chunk by row chunk (tinn/chunks.py)."""
        if not self._optimized(name) or not g._nnz():
            return
        step = self.scalars[f"steps.{name}"] = self.scalars[f"steps.{name}"] + 1
        share, l2_reg = self._rate_and_l2(name)
        lr = self.learning_rate * share
        indices, values = g.indices(), g.values().contiguous().view(torch.int16)
        rows, cols = indices[0].contiguous(), indices[1].contiguous()
        m, v = self.state[f"m.{name}"].view(torch.int16), self.state[f"v.{name}"].view(torch.int16)
        bits = w.view(torch.int16)
        seed = zlib.crc32(name.encode())  # stochastic rounding: a stream of its own per tensor
        correction = float(np.float32(self._bias_corrections(np.float64(step))))
        for lo, hi in chunks.row_spans(w.shape[0], w.shape[1], f"the table {name!r}"):
            compact_kernels.adam_sparse_bf16(bits[lo:hi], m[lo:hi], v[lo:hi], rows, cols, values, lr_scale, lo, lr,
                                             l2_reg, step, correction, seed, *self._hyper())

    def _rate_and_l2(self, name) -> tuple[float, float]:
        """A tensor's share of the learning rate and its L2 term: tcnn's for matrix params, the non-matrix ones
        otherwise."""
        if self.is_matrix[name]:
            return 1.0, self.l2_reg
        return self.non_matrix_learning_rate_factor, self.non_matrix_l2_reg

    def _optimized(self, name) -> bool:
        return self.optimize_matrix_params if self.is_matrix[name] else self.optimize_non_matrix_params

    def _operands(self, name, w, g, lr_scale, skip) -> tuple:
        """One tensor's kernel arguments: (w, g, m, v, steps, lr_scale, lr, l2_reg, skip_zero, step_now,
        pending, skip, lr_factor); the step of a tensor with one step count is already counted (`_counted`)."""
        share, l2_reg = self._rate_and_l2(name)
        lr, lr_factor = self.rate_operands(share, w.device)
        if self._skips(name):
            steps, step_now, pending = self.state[f"steps.{name}"], 0, self.pending("step_count", w.device)
        else:
            steps, step_now = self._no_steps, self.scalars[f"steps.{name}"]
            pending = self.pending(f"steps.{name}", w.device)
            if self._capturing:
                # The count the kernel takes, step_now - pending, from the device: step_now 1 and pending less the
                # count's device copy (count - 1, `load_graph_counts`), one op inside the captured graph.
                pending = torch.sub(pending, self._graph_counts[name], out=self._graph_operands[name])
                step_now = 1
        return (w, g, self.state[f"m.{name}"], self.state[f"v.{name}"], steps, lr_scale, lr, l2_reg,
                int(self._skips(name)), step_now, pending, no_skip(w.device) if skip is None else skip, lr_factor)

    def _hyper(self) -> tuple:
        """The arguments both Adam kernels share, in their order (beta1 ... upper)."""
        lower, upper = self._bounds()
        return (self.beta1, self.beta2, self.epsilon, self.relative_decay, self.absolute_decay,
                self.clipping_magnitude, self.gradient_clipping_magnitude, lower, upper)

    def hyperparams(self) -> dict:
        return {"otype": self.otype, "learning_rate": self.learning_rate,
                **{k: getattr(self, k) for k in self.OPTIONS if k != "learning_rate"}}
