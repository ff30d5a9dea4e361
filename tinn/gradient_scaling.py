"""Dynamic gradient scaling for networks that compute in float16 (`settings.precision`).

A float16 network multiplies its output gradient by a scale before rounding it to float16, so that small
gradients (a mean over a large batch) do not round to zero, and divides the weight and input gradients by
it again in float32. A fixed scale (tcnn's 128) can also push large gradients past float16's 65504: the
deltas become inf, the weight gradients inf or NaN, and one optimizer step with them ruins the parameters.

`GradientScaler` keeps the scale as a device tensor (`scale`; kernels and replayed CUDA graphs read it
there) with a host copy (`value`, for kernels that take a float). The network's backward unscales its
gradients with `unscale_`, which also records any non-finite value in `found_inf` (one fused pass, no host
sync). At the end of a step `update()` reads `found_inf` once on the host (the skip decision, as torch's
GradScaler.step does) and:
- non-finite gradients: the step is to be skipped, the scale is multiplied by `backoff_factor`;
- `growth_interval` finite steps in a row: the scale is multiplied by `growth_factor`.

Defaults: growth x2 after 2000 finite steps and backoff x0.5 are torch's GradScaler's. The initial scale is
tcnn's static 128, not GradScaler's 2^16: tinn scales the gradient of a mean loss (tcnn's convention),
which 128 already lifts into float16's normal range, and starting at 2^16 would skip the first ~9 steps of
every run while the scale comes down.
"""
from __future__ import annotations

import torch

from .errors import ConfigError

INITIAL_SCALE = 128.0
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000
#: `settings.gradient_scaling` values.
MODES = ("dynamic", "static")


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
        self.init_scale = self.value = float(init_scale)
        self.scale = torch.full((), self.value, dtype=torch.float32, device=device)
        self._inverse = torch.full((), 1.0 / self.value, dtype=torch.float32, device=device)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self.finite_in_a_row = 0
        self.skipped_steps = 0

    def unscale_(self, tensors) -> None:
        """Divide float32 gradients that carry the scale by it, in place, and record whether any value is
        inf or NaN in `found_inf` (accumulated until `update`). One pass, no host sync."""
        tensors = [t for t in tensors if t is not None and t.numel()]
        if tensors:
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, self.found_inf, self._inverse)

    def record_non_finite(self, tensors) -> None:
        """Record in `found_inf` whether gradients a kernel already unscaled hold an inf or NaN (their sum is
        not finite exactly then, short of a float32 overflow of the sum itself). No host sync."""
        for t in tensors:
            if t is not None and t.numel():
                torch.maximum(self.found_inf, t.sum().isfinite().logical_not().float(), out=self.found_inf)

    def update(self) -> bool:
        """End of a step: whether its gradients were finite (one host read of `found_inf`). Backs off after a
        non-finite step (counted in `skipped_steps`; the caller skips its optimizer step), grows after
        `growth_interval` finite ones in a row, and clears `found_inf` for the next step."""
        finite = not bool(self.found_inf.item())
        if finite:
            self.finite_in_a_row += 1
            if self.finite_in_a_row == self.growth_interval:
                self.value *= self.growth_factor
                self.finite_in_a_row = 0
        else:
            self.value *= self.backoff_factor
            self.finite_in_a_row = 0
            self.skipped_steps += 1
        # The host computed the new value from the same flag: the device copies are filled, not read back.
        self.scale.fill_(self.value)
        self._inverse.fill_(1.0 / self.value)
        self.found_inf.zero_()
        return finite

    def reset(self) -> None:
        """Back to the initial scale, nothing recorded or counted."""
        self.load_state_dict({"value": self.init_scale, "finite_in_a_row": 0, "skipped_steps": 0})
        self.found_inf.zero_()

    def state_dict(self) -> dict:
        return {"value": self.value, "finite_in_a_row": self.finite_in_a_row, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])
        self.finite_in_a_row = int(state["finite_in_a_row"])
        self.skipped_steps = int(state["skipped_steps"])
        self.scale.fill_(self.value)
        self._inverse.fill_(1.0 / self.value)

    def __repr__(self) -> str:
        return (f"GradientScaler(scale={self.value:g}, growth x{self.growth_factor:g} every {self.growth_interval} "
                f"finite steps, backoff x{self.backoff_factor:g}, skipped_steps={self.skipped_steps})")


def for_precision(precision: str, mode: str, device) -> GradientScaler | None:
    """The scaler a network computing in `precision` gets: float16 with `settings.gradient_scaling`
    "dynamic"; None otherwise (float32 and bfloat16 need no scale, "static" keeps tcnn's fixed one)."""
    if mode not in MODES:
        raise ConfigError(f"settings.gradient_scaling={mode!r} is not supported; allowed: {list(MODES)}")
    return GradientScaler(device) if precision == "float16" and mode == "dynamic" else None


def step_finite(scalers) -> bool:
    """End of a step for every scaler (each updates its scale); whether all saw finite gradients."""
    finite = True
    for scaler in scalers:
        finite = scaler.update() and finite
    return finite
