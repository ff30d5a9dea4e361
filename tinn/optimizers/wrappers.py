"""Wrapper optimizers: each holds one nested optimizer (`"nested": {...}` in the config; without it
the nested optimizer is a default Adam, as in tcnn).

EMA, Average and Lookahead keep extra weights that are meant for inference (tcnn's
`custom_weights`): read them with `opt.inference_params(name)`, or evaluate inside
`with opt.swap_in_inference_params(): ...`, which copies them into the parameters and
restores the training weights afterwards. Wrapping composes: EMA over Lookahead averages
Lookahead's slow weights, as in tcnn.

A step skipped on the device (`step(skip=flag)`) changes nothing here either: EMA, Average and Lookahead
skip it in their kernels and take the nested step count they depend on from the device
(`Optimizer.device_step_count`); ExponentialDecay computes the nested learning rate on the device then
(around a leaf optimizer that skips on the device). Batched decides on the host whether there is a nested
step at all, so it reads the flag on the host.
"""
from __future__ import annotations

import torch

from .. import chunks
from ..config import Section
from ..kernels import optimizers as optimizer_kernels
from .base import LeafOptimizer, Optimizer, as_rows, no_skip
from .registry import create_optimizer


class Wrapper(Optimizer):
    """Delegates learning rate, step count and per-network scales to the nested optimizer."""

    OPTIONS: tuple = ("nested",)

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg.path)
        self.nested = create_optimizer(cfg.section("nested", required=False), self.named_params)
        self.children = [("nested.", self.nested)]

    @property
    def skips_on_device(self) -> bool:
        return self.SKIPS_ON_DEVICE and self.nested.skips_on_device

    def _apply(self, grads, skip=None) -> None:
        self.nested._apply(grads, skip)

    def device_step_count(self, device) -> tuple[int, torch.Tensor]:
        return self.nested.device_step_count(device)

    def _nested_taken(self, device, skip) -> tuple[int, torch.Tensor]:
        """The nested optimizer's steps taken, as the kernels take them: (steps asked, pending skips), read on
        the device where `skip` is a device flag; from the host count (settled, no pending) otherwise."""
        if skip is None:
            return self.nested.step_count, no_skip(device)   # (a zero count)
        return self.nested.device_step_count(device)

    def _inference_params_now(self, name: str) -> torch.Tensor:
        """`inference_params` without a host read, for a step in progress (see Lookahead's)."""
        return self.nested._inference_params_now(name)

    def _get_lr(self) -> float:
        return self.nested.learning_rate

    def _set_lr(self, value: float) -> None:
        self.nested.learning_rate = value

    @property
    def step_count(self) -> int:
        return self.nested.step_count

    def set_lr_scale(self, name, scale) -> None:
        self.nested.set_lr_scale(name, scale)

    def lr_scale(self, name):
        return self.nested.lr_scale(name)

    def inference_params(self, name: str) -> torch.Tensor:
        return self.nested.inference_params(name)

    def _own_hyperparams(self) -> dict:
        return {k: getattr(self, k) for k in self.OPTIONS if k != "nested"}

    def hyperparams(self) -> dict:
        return {"otype": self.otype, **self._own_hyperparams(), "nested": self.nested.hyperparams()}

    def _rows_view(self, name: str, t: torch.Tensor) -> torch.Tensor:
        p = self.params[name]
        return as_rows(t, p.shape[0] if p.dim() >= 1 and p.shape[0] > 0 else 1)

    def _launch(self, kernel, name: str, tensors: tuple, scalars: tuple) -> None:
        """`kernel(*tensors, *scalars)` on (rows, cols) views of the tensors, by row chunks when the table
        passes the chunk limit (tinn/chunks.py)."""
        views = [self._rows_view(name, t) for t in tensors]
        chunks.launch_by_rows(kernel, views[0].shape[0], views[0].shape[1], (*views, *scalars),
                              sliced=range(len(views)))

    def _new_copy(self, kind: str, name: str, zero: bool = True) -> torch.Tensor:
        p = self.params[name]
        t = torch.zeros_like(p.detach()) if zero else p.detach().clone()
        self.state[f"{kind}.{name}"] = t
        return t


class EMA(Wrapper):
    """Bias-corrected exponential moving average of the weights after every nested step:
    ema_t = (decay (1 - decay^(t-1)) ema_{t-1} + (1 - decay) w_t) / (1 - decay^t), so ema_1 = w_1.
    `full_precision` is accepted for tcnn compatibility; tinn always averages in float32."""

    otype = "EMA"
    OPTIONS = ("nested", "decay", "full_precision")
    SKIPS_ON_DEVICE = True

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.decay = cfg.number("decay", 0.99, lo=0.0, hi=0.999999)
        self.full_precision = cfg.boolean("full_precision", False)
        for name, _ in self.named_params:
            self._new_copy("ema", name)

    @property
    def skips_on_device(self) -> bool:
        # its kernel reads the nested inference weights, which an averaging wrapper knows only from its count
        return self.nested.skips_on_device and not isinstance(self.nested, (EMA, Average))

    def _apply(self, grads, skip=None) -> None:
        self.nested._apply(grads, skip)
        for name, p in self.named_params:
            if p.numel():
                step_now, pending = self._nested_taken(p.device, skip)
                source = self.nested.inference_params(name) if skip is None else self._inference_params_now(name)
                self._launch(optimizer_kernels.ema_step, name, (source.detach(), self.state[f"ema.{name}"]),
                             (no_skip(p.device) if skip is None else skip, pending, step_now, self.decay))

    def inference_params(self, name: str) -> torch.Tensor:
        self._check_name(name)
        return self.state[f"ema.{name}"] if self.step_count > 0 else self.nested.inference_params(name)


class Average(Wrapper):
    """Mean of the weights over the last `n_samples` steps (a ring buffer of n_samples copies: mind the
    memory). tcnn divides by n_samples from the start (zeros fill the window); tinn's
    `inference_params` returns the mean over the min(step, n_samples) weights actually seen."""

    otype = "Average"
    OPTIONS = ("nested", "n_samples")
    SKIPS_ON_DEVICE = True

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.n_samples = cfg.integer("n_samples", 128, lo=1, hi=1 << 16)
        for name, p in self.named_params:
            self._new_copy("average", name)
            self.state[f"samples.{name}"] = torch.zeros((self.n_samples,) + tuple(p.shape), dtype=torch.float32,
                                                        device=p.device)

    @property
    def skips_on_device(self) -> bool:
        # one launch per table: its kernel picks the window's slot from the device count
        return (self.nested.skips_on_device and not isinstance(self.nested, (EMA, Average))
                and all(chunks.single(self._rows_view(name, p)) for name, p in self.named_params if p.numel()))

    def _apply(self, grads, skip=None) -> None:
        self.nested._apply(grads, skip)
        for name, p in self.named_params:
            if not p.numel():
                continue
            w = self._rows_view(name, (self.nested.inference_params(name) if skip is None
                                       else self._inference_params_now(name)).detach())
            avg, samples = self._rows_view(name, self.state[f"average.{name}"]), self.state[f"samples.{name}"]
            samples = samples.view(self.n_samples, *w.shape)
            if skip is not None:   # one launch (skips_on_device): the slot is the device count's
                step_now, pending = self.nested.device_step_count(p.device)
                optimizer_kernels.average_step(w, samples, avg, skip, pending, step_now, 1.0 / self.n_samples)
                continue
            slot = self.nested.step_count % self.n_samples   # a window of one slot, by row chunks
            no_pending = no_skip(p.device)
            for lo, hi in chunks.row_spans(w.shape[0], w.shape[1]):
                optimizer_kernels.average_step(w[lo:hi], samples[slot:slot + 1, lo:hi], avg[lo:hi], no_pending,
                                               no_pending, 0, 1.0 / self.n_samples)

    def inference_params(self, name: str) -> torch.Tensor:
        self._check_name(name)
        t = self.step_count
        if t == 0:
            return self.nested.inference_params(name)
        avg = self.state[f"average.{name}"]
        return avg if t >= self.n_samples else avg * (self.n_samples / t)


class Lookahead(Wrapper):
    """Lookahead (Zhang et al. 2019): every n_steps nested steps the slow weights move alpha of the way
    to the fast ones and the fast weights restart there. The slow weights are the inference weights."""

    otype = "Lookahead"
    OPTIONS = ("nested", "alpha", "n_steps")
    SKIPS_ON_DEVICE = True

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.alpha = cfg.number("alpha", 0.5, lo=0.0, hi=1.0)
        self.n_steps = cfg.integer("n_steps", 16, lo=1)
        for name, _ in self.named_params:
            self._new_copy("slow", name)

    def _apply(self, grads, skip=None) -> None:
        # The slow weights start as the weights before the first step asked (a skipped one leaves them so).
        asked = self.nested.step_count if skip is None else self.nested.device_step_count(self.params_device)[0]
        if asked == 0:
            for name, p in self.named_params:
                self.state[f"slow.{name}"].copy_(p.detach())
        self.nested._apply(grads, skip)
        # Sync right after every n_steps-th fast step, so the next gradient is taken at the synced
        # weights (tcnn syncs at the start of the following step, after its gradient was computed). With a
        # device flag the kernel runs every step and decides from the device count.
        step_now, pending = self._nested_taken(self.params_device, skip)
        if skip is None and step_now % self.n_steps != 0:
            return
        for name, p in self.named_params:
            if p.numel():
                self._launch(optimizer_kernels.lookahead_step, name, (p.detach(), self.state[f"slow.{name}"]),
                             (no_skip(p.device) if skip is None else skip, pending, step_now, self.n_steps,
                              self.alpha))

    @property
    def params_device(self) -> torch.device:
        return self.named_params[0][1].device

    def inference_params(self, name: str) -> torch.Tensor:
        self._check_name(name)
        return self.state[f"slow.{name}"] if self.step_count > 0 else self.params[name]

    def _inference_params_now(self, name: str) -> torch.Tensor:
        # The slow weights equal the weights from the first step asked until the first sync.
        self._check_name(name)
        asked = self.nested.device_step_count(self.params_device)[0]
        return self.state[f"slow.{name}"] if asked > 0 else self.params[name]


class ExponentialDecay(Wrapper):
    """Piecewise-constant decay of the nested learning rate: before nested step t (counting from 0),
    if decay_start <= t <= decay_end and (t - decay_start) % decay_interval == 0, the factor is
    multiplied by decay_base. `learning_rate` is the current (decayed) rate; setting it rescales
    the base so that the current rate becomes the new value (tcnn semantics).

    With a device skip flag (`step(skip=...)`) the count t of nested steps taken is known on the device only:
    the factor then lives in a float64 device tensor, `decayed_rate` updates it there (unless the step is
    skipped) and writes the nested rate, which the nested kernels read (`device_learning_rate`); the host's
    `learning_rate_factor` catches up when the host asks (`settle`)."""

    otype = "ExponentialDecay"
    OPTIONS = ("nested", "decay_base", "decay_start", "decay_interval", "decay_end")
    COMPACT = True  # it only rescales the nested learning rate; the nested optimizer checks its own
    SKIPS_ON_DEVICE = True

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.decay_base = cfg.number("decay_base", 0.1, lo=0.0)
        self.decay_start = cfg.integer("decay_start", 10000, lo=0)
        self.decay_interval = cfg.integer("decay_interval", 10000, lo=1)
        self.decay_end = cfg.integer("decay_end", 10000000, lo=0)
        self.scalars["base_learning_rate"] = float(self.nested.learning_rate)
        self.scalars["learning_rate_factor"] = 1.0
        # On the device (see the class notes): the factor (float64), the nested rate (float32), and whether
        # the host's factor lags behind.
        self._factor: torch.Tensor | None = None
        self._rate: torch.Tensor | None = None
        self._unsettled = False

    @property
    def skips_on_device(self) -> bool:
        # the nested kernels must take their rate from the device: a leaf optimizer's
        return isinstance(self.nested, LeafOptimizer) and self.nested.skips_on_device

    def _apply(self, grads, skip=None) -> None:
        if skip is not None:
            self._apply_on_device(grads, skip)
            return
        self._leave_device()
        t = self.nested.step_count
        if t == 0:
            self.scalars["learning_rate_factor"] = 1.0
        if self.decay_start <= t <= self.decay_end and (t - self.decay_start) % self.decay_interval == 0:
            self.scalars["learning_rate_factor"] *= self.decay_base
        self.nested.learning_rate = self.scalars["base_learning_rate"] * self.scalars["learning_rate_factor"]
        self.nested._apply(grads)

    def _apply_on_device(self, grads, skip: torch.Tensor) -> None:
        device = skip.device
        if self._factor is None:   # the host's factor, filled in (no read back)
            self._factor = torch.full((1,), self.scalars["learning_rate_factor"], dtype=torch.float64, device=device)
            self._rate = torch.empty(1, dtype=torch.float32, device=device)
        step_now, pending = self.nested.device_step_count(device)
        optimizer_kernels.decayed_rate(self._factor, self._rate, skip, pending, step_now, self.decay_start,
                                       self.decay_interval, min(self.decay_end, 2 ** 31 - 1), self.decay_base,
                                       self.scalars["base_learning_rate"])
        self.nested.device_learning_rate = self._rate
        self._unsettled = True
        self.nested._apply(grads, skip)

    def settle(self) -> None:
        super().settle()
        if self._unsettled:
            self.scalars["learning_rate_factor"] = float(self._factor.item())
            self.nested.learning_rate = self.scalars["base_learning_rate"] * self.scalars["learning_rate_factor"]
            self._unsettled = False

    def _leave_device(self) -> None:
        """Back to the host's factor (after steps with a device flag)."""
        if self._factor is not None:
            self.settle()
            self._factor = self._rate = None
            self.nested.device_learning_rate = None

    def _after_restore(self) -> None:
        self._factor = self._rate = None
        self._unsettled = False
        self.nested.device_learning_rate = None

    def _get_lr(self) -> float:
        self.settle()
        return self.scalars["base_learning_rate"] * self.scalars["learning_rate_factor"]

    def _set_lr(self, value: float) -> None:
        self.settle()
        factor = self.scalars["learning_rate_factor"]
        self.scalars["base_learning_rate"] = value / factor if factor > 0 else value
        self.nested.learning_rate = value

    def hyperparams(self) -> dict:
        self.settle()
        return super().hyperparams()


class Batched(Wrapper):
    """Averages gradients over `batch_size_multiplier` calls of step() and runs the nested optimizer
    on the mean every that many calls (a larger effective batch). A parameter whose grad was None
    throughout a window is skipped by the nested step; inside a window None counts as zero."""

    otype = "Batched"
    OPTIONS = ("nested", "batch_size_multiplier")

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.batch_size_multiplier = cfg.integer("batch_size_multiplier", 16, lo=1)
        self.scalars["step_count"] = 0
        for name, _ in self.named_params:
            self._new_copy("pool", name)
            self.scalars[f"seen.{name}"] = False

    @property
    def step_count(self) -> int:
        return int(self.scalars["step_count"])

    def device_step_count(self, device) -> tuple[int, torch.Tensor]:
        return int(self.scalars["step_count"]), no_skip(device)   # (it reads skip flags on the host: none pending)

    def _apply(self, grads, skip=None) -> None:
        k = self.batch_size_multiplier
        first = self.scalars["step_count"] % k == 0
        for name, p in self.named_params:
            pool = self.state[f"pool.{name}"]
            if first:
                self.scalars[f"seen.{name}"] = False
            g = grads.get(name)
            if g is None:
                if first:
                    pool.zero_()
                continue
            if p.numel():
                self._launch(optimizer_kernels.accumulate_grad, name, (pool, g), (int(first), 1.0 / k))
            self.scalars[f"seen.{name}"] = True
        self.scalars["step_count"] += 1
        if self.scalars["step_count"] % k == 0:
            self.nested._apply({name: (self.state[f"pool.{name}"] if self.scalars[f"seen.{name}"] else None)
                                for name, _ in self.named_params})
