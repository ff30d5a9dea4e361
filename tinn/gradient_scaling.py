"""Dynamic gradient scaling for networks that compute in float16 (`settings.precision`).

A float16 network multiplies its output gradient by a scale before rounding it to float16, so that small
gradients (a mean over a large batch) do not round to zero, and divides the weight and input gradients by
it again in float32. A fixed scale (tcnn's 128) can also push large gradients past float16's 65504: the
deltas become inf, the weight gradients inf or NaN, and one optimizer step with them ruins the parameters.

`GradientScaler` keeps its whole state in device tensors, so that a training step never waits for the GPU:
- `scale` (and its inverse): the kernels, the dense path's GEMMs and replayed CUDA graphs read it there;
- `found_inf`: the network's backward unscales its gradients with `unscale_` (or `record_non_finite` where its
  kernels unscaled them), which records any non-finite value here (one fused pass, no host sync);
- `skip`: at the end of a step `update()` turns `found_inf` into this (1,) int32 flag, the verdict on the step
  (1: skip it), which the optimizers' kernels read on the device (`Optimizer.step(skip=...)`, as torch's fused
  Adam reads `found_inf`): a skipped step leaves parameters and optimizer state as they were;
- the growth counter and the count of skipped steps.
`update()` backs the scale off by `backoff_factor` after a non-finite step and grows it by `growth_factor`
after `growth_interval` finite steps in a row (torch's `_amp_update_scale_`, on the device). `update()` returns
whether the step was finite, which reads the flag on the host; `update(sync=False)` returns the flag tensor
instead. `value`, `finite_in_a_row` and `skipped_steps` read the device (a sync, for reports and tests).

The scale alone does not cover a mean loss over a large batch: one sample's output gradient is about
2 |error| / N, and less where the loss reaches the network through small factors (a radiance field's density in
empty space, nearly fitted: 1e-11 to 1e-10 per element at N = 2^18). Times 128 those lie below float16's smallest
subnormal (6e-8) and round to zero, and so do the input and weight gradients they carry: the parameters only they
reach never move (design notes, "Small output gradients lifted before the float16 cast"). So a float16 backward of
a given output gradient (the tensor cores', a single network's dense GEMMs') first lifts it by the power of two
that brings its largest magnitude to [1, 2) when that is smaller (`lift_small`), and divides the lift out of its
results: exact in float32, and the scale then works on gradients of a unit size, as it was chosen for. The kernels
that take a mean loss's gradient themselves (the loss fused into the backward) cannot see its size before they
compute it; with the dynamic scaler they multiply the scale by the largest power of two within the mean's element
count (`mean_lift`), which gives each element the gradient a summed loss would, and divide it out with the scale.
(A summed size can overflow where the mean's did not; the dynamic scaler skips such a step and backs off, the
static scale could not, so it keeps tcnn's 128 on the mean.)

Defaults: growth x2 after 2000 finite steps and backoff x0.5 are torch's GradScaler's. The initial scale is
tcnn's 128, not GradScaler's 2^16: on gradients of a unit size 128 leaves float16's deltas 512x of headroom to
grow through the layers, where 2^16 overflows at once for any loss whose per-sample gradients are of unit size
(a sum, `y.sum().backward()`) and skips steps until it comes down.
"""
from __future__ import annotations

import torch

from .errors import CheckpointError, ConfigError

INITIAL_SCALE = 128.0
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000
#: `settings.gradient_scaling` values.
MODES = ("dynamic", "static")
# The tensors of a scaler's state dict, with their dtypes (shapes: one value each).
STATE = {"scale": torch.float32, "growth_tracker": torch.int32, "skipped_steps": torch.int32}


def lift_small(dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dy times 2^k, 2^-k): the power of two k >= 0 that brings dy's largest magnitude to [1, 2) where it is below
    1, else k = 0. On the device, no host read; (dy, None) for an empty dy. The caller multiplies the gradients it
    computes from the lifted dy by the second value (exact: both are powers of two)."""
    if dy.numel() == 0:
        return dy, None
    _, exponent = torch.frexp(dy.detach().abs().amax().float())  # amax = m 2^e, m in [0.5, 1); 0 and inf give e = 0
    lift = torch.ldexp(torch.ones((), device=dy.device), (1 - exponent).clamp(0, 126))
    return dy * lift, 1.0 / lift


def mean_lift(count: int) -> float:
    """2^k, the largest power of two <= count: float16's deltas of a mean over `count` elements, lifted by it, have
    a summed loss's unit size (times 1 to 2^-1) instead of 1 / count's."""
    return 2.0 ** (max(int(count), 1).bit_length() - 1)


class GradientScaler:
    """The scale one float16 network's backward applies; see the module's notes."""

    def __init__(self, device, init_scale: float = INITIAL_SCALE, growth_factor: float = GROWTH_FACTOR,
                 backoff_factor: float = BACKOFF_FACTOR, growth_interval: int = GROWTH_INTERVAL):
        if not init_scale > 0:
            raise ConfigError(f"init_scale={init_scale} must be > 0")
        if not growth_factor > 1:
            raise ConfigError(f"growth_factor={growth_factor} must be > 1")
        if not 0 < backoff_factor < 1:
            raise ConfigError(f"backoff_factor={backoff_factor} must be in (0, 1)")
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ConfigError(f"growth_interval={growth_interval} must be an integer >= 1")
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.init_scale = float(init_scale)
        self.scale = torch.full((), self.init_scale, dtype=torch.float32, device=device)
        self._inverse = torch.full((), 1.0 / self.init_scale, dtype=torch.float32, device=device)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self.skip = torch.zeros(1, dtype=torch.int32, device=device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self._skipped = torch.zeros(1, dtype=torch.int32, device=device)
        # The (1,) views the kernels take, made once: each view is a torch call of host time in every step.
        self._update_operands = (self.found_inf.reshape(1), self.scale.reshape(1), self._inverse.reshape(1),
                                 self._growth_tracker.reshape(1), self.skip, self._skipped)

    def unscale_(self, tensors) -> None:
        """Divide float32 gradients that carry the scale by it, in place, and record whether any value is
        inf or NaN in `found_inf` (accumulated until `update`). One pass, no host sync."""
        tensors = [t for t in tensors if t is not None and t.numel()]
        if tensors:
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, self.found_inf, self._inverse)

    def unscale_by(self, tensor: torch.Tensor, factor: torch.Tensor) -> None:
        """Multiply a float32 gradient by `factor` (one float32 value on its device) in place, and record whether any
        value is inf or NaN in `found_inf`: one pass (a lifted gradient's lift divided out, `lift_small`)."""
        if tensor.numel():
            torch._amp_foreach_non_finite_check_and_unscale_([tensor], self.found_inf, factor)

    def _kernels(self):
        """The module of the two device steps: Triton's on CUDA (`tuning.triton_step_kernels`), else Taichi's."""
        from .kernels import triton_step_kernels
        if triton_step_kernels(self.scale.device):
            from .kernels import scaler_triton
            return scaler_triton
        from .kernels import gradient_scaling
        return gradient_scaling

    def record_non_finite(self, tensors) -> None:
        """Record in `found_inf` whether gradients a kernel already unscaled hold an inf or NaN (one launch
        each, tinn/kernels/scaler_triton.py or gradient_scaling.py). No host sync."""
        record = self._kernels().record_non_finite
        for t in tensors:
            if t is not None and t.numel():
                values = t if t.dtype == torch.float32 else t.float()
                record(values.contiguous().reshape(-1), self._update_operands[0])

    def update(self, sync: bool = True) -> bool | torch.Tensor:
        """End of a step: set `skip` from `found_inf` (1: the gradients were not finite, the step is to be
        skipped and is counted in `skipped_steps`), back the scale off after a non-finite step, grow it after
        `growth_interval` finite ones in a row, and clear `found_inf` for the next step. All on the device, in one
        launch (tinn/kernels/gradient_scaling.py).

        Returns whether the gradients were finite (one host read), or with `sync=False` the (1,) int32 `skip`
        flag itself, for optimizers that read it on the device."""
        self._kernels().update_scale(*self._update_operands, self.growth_factor, self.backoff_factor,
                                     self.growth_interval)
        if not sync:
            return self.skip
        return not bool(self.skip.item())

    # ---- reads of the device state (each waits for the device) ----------------------------------
    @property
    def value(self) -> float:
        """The current scale."""
        return float(self.scale.item())

    @property
    def finite_in_a_row(self) -> int:
        """Finite steps since the last change of the scale."""
        return int(self._growth_tracker.item())

    @property
    def skipped_steps(self) -> int:
        """Steps whose gradients were not finite."""
        return int(self._skipped.item())

    # ---- state ----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Back to the initial scale, nothing recorded or counted."""
        self.scale.fill_(self.init_scale)
        self._inverse.fill_(1.0 / self.init_scale)
        for t in (self.found_inf, self.skip, self._growth_tracker, self._skipped):
            t.zero_()

    def state_dict(self) -> dict:
        """The scale, the growth counter and the skip count, as (1,) tensors (copies, bit-exact)."""
        return {"scale": self.scale.detach().reshape(1).clone(),
                "growth_tracker": self._growth_tracker.detach().reshape(1).clone(),
                "skipped_steps": self._skipped.detach().clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` output (or the older plain-number form: value, finite_in_a_row,
        skipped_steps); the flags of a step in progress are cleared."""
        if "value" in state:  # the plain-number form
            state = {"scale": torch.tensor([float(state["value"])], dtype=torch.float32),
                     "growth_tracker": torch.tensor([int(state["finite_in_a_row"])], dtype=torch.int32),
                     "skipped_steps": torch.tensor([int(state["skipped_steps"])], dtype=torch.int32)}
        self.check_state_dict(state)
        self.scale.copy_(state["scale"].reshape(()))
        torch.reciprocal(self.scale, out=self._inverse)
        self._growth_tracker.copy_(state["growth_tracker"].reshape(()))
        self._skipped.copy_(state["skipped_steps"].reshape(1))
        self.found_inf.zero_()
        self.skip.zero_()

    @staticmethod
    def check_state_dict(state: dict) -> None:
        """Raise CheckpointError unless `state` is a scaler's `state_dict()`."""
        if set(state) != set(STATE):
            raise CheckpointError(f"gradient scaler state has keys {sorted(state)}; expected {sorted(STATE)}")
        for key, dtype in STATE.items():
            t = state[key]
            if not isinstance(t, torch.Tensor) or t.numel() != 1 or t.dtype != dtype:
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else repr(t)
                raise CheckpointError(f"gradient scaler state {key!r} is {got}; expected one {dtype} value")

    def __repr__(self) -> str:
        return (f"GradientScaler(scale={self.value:g}, growth x{self.growth_factor:g} every {self.growth_interval} "
                f"finite steps, backoff x{self.backoff_factor:g}, skipped_steps={self.skipped_steps})")


def for_precision(precision: str, mode: str, device) -> GradientScaler | None:
    """The scaler a network computing in `precision` gets: float16 with `settings.gradient_scaling`
    "dynamic"; None otherwise (float32 and bfloat16 need no scale, "static" keeps tcnn's fixed one)."""
    if mode not in MODES:
        raise ConfigError(f"settings.gradient_scaling={mode!r} is not supported; allowed: {list(MODES)}")
    return GradientScaler(device) if precision == "float16" and mode == "dynamic" else None


def scalers_of(module: torch.nn.Module) -> list[GradientScaler]:
    """The dynamic gradient scalers of a module's float16 networks (the `gradient_scaler` of each submodule that
    has one), in module order."""
    return [m.gradient_scaler for m in module.modules()
            if isinstance(getattr(m, "gradient_scaler", None), GradientScaler)]


def skip_flag(scalers, out: torch.Tensor | None = None) -> torch.Tensor:
    """End of a step for every scaler (each updates its scale on the device): the (1,) int32 flag that is 1
    where any of them saw non-finite gradients. One scaler's own flag, or the maximum written into `out`."""
    flags = [scaler.update(sync=False) for scaler in scalers]
    if len(flags) == 1:
        return flags[0]
    torch.amax(torch.stack(flags), dim=0, out=out)
    return out
