"""Viewer state and every action a control can trigger, with no GUI in sight.

The GGUI widgets, the keyboard shortcuts and the tests all call these methods, so
what the tests check is what the buttons do.
"""
from __future__ import annotations

import math
import os
import time

import torch

from .orbit import OrbitCamera
from .source import OPTIONAL

LOG10_LR_RANGE = (-5.0, 0.0)  # the learning-rate slider works on log10(lr): rates span decades
LR_SCALE_RANGE = (0.01, 10.0)  # the web page's learning-rate control: a factor on the rate the run started with
NETWORK_LOSS_DECAY = 0.9  # per-network loss is averaged over steps: one batch gives each network few samples
ORBIT_KEY_DEGREES = 10.0  # one press of an orbit key


def _finite_in(value, lo: float, hi: float) -> bool:
    """Whether `value` is a real number (not bool, not a string) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and lo <= value <= hi


class ViewerController:
    def __init__(self, source, out_dir: str = "out/viewer", max_steps: int | None = None):
        self.source = source
        self.out_dir = out_dir
        self.max_steps = max_steps
        self.paused = False
        self.quit_requested = False
        self.step = 0
        self.version = 0  # bumped whenever the parameters change, so renders can be cached
        self.loss_steps: list[int] = []
        self.losses: list[float] = []
        self.loss: float | None = None
        self.psnr: float | None = None
        self.steps_per_second: float | None = None
        self.psnr_steps: list[int] = []  # PSNR history: one point per held-out render
        self.psnrs: list[float] = []
        self.network_loss: torch.Tensor | None = None
        self._network_loss_wanted = True
        self._network_loss_s = 0.0  # time spent on per-network loss queries since a front end last took it
        self.message = ""
        self.screenshot_requests: list[str] = []
        self._pending: list[torch.Tensor | float] = []  # losses not yet read back (reading syncs the device)
        self._pending_time = 0.0
        self._screenshots = 0
        # Scene sources that can render from any pose get an orbit camera, starting at the pose render() shows.
        self.orbit: OrbitCamera | None = None
        self.camera_version = 0  # bumped whenever the camera moves, so renders can be cached
        if self.can("render_from"):
            if not hasattr(source, "orbit_start"):
                raise TypeError(f"{type(source).__name__} has render_from() but no orbit_start() -> (c2w, target)")
            c2w, target = source.orbit_start()
            self.orbit = OrbitCamera.from_c2w(c2w, target)
        self.base_learning_rate = self.learning_rate  # what the learning-rate scale multiplies
        self.network_loss_wanted = True

    @property
    def network_loss_wanted(self) -> bool:
        """Whether a front end shows the per-network loss now (the web page only while a browser is connected).

        A source may pay for it (the octree renders its held-out view per query, the image trainer computes it in
        every step): nobody watching, nobody asks, and sources with `want_network_loss` are told so."""
        return self._network_loss_wanted

    @network_loss_wanted.setter
    def network_loss_wanted(self, wanted: bool) -> None:
        self._network_loss_wanted = bool(wanted)
        if self.can("want_network_loss"):
            self.source.want_network_loss(self._network_loss_wanted)

    def take_network_loss_s(self) -> float:
        """Seconds the per-network loss queries took since the last call (a front end books them as its own)."""
        out, self._network_loss_s = self._network_loss_s, 0.0
        return out

    # ---- what the source offers -----------------------------------------------------------------
    def can(self, capability: str) -> bool:
        assert capability in OPTIONAL, capability
        return hasattr(self.source, capability)

    @property
    def finished(self) -> bool:
        return self.max_steps is not None and self.step >= self.max_steps

    # ---- actions (bound to widgets and keys) ------------------------------------------------------
    def toggle_pause(self) -> None:
        self.pause() if not self.paused else self.resume()

    def pause(self) -> None:
        self.paused = True
        self.message = "paused"

    def resume(self) -> None:
        self.paused = False
        self.message = "running"

    def single_step(self) -> None:
        """Pause, then run exactly one training step."""
        self.paused = True
        self._train(1)
        self.flush()
        self.message = f"stepped to {self.step}"

    @property
    def learning_rate(self) -> float | None:
        return float(self.source.learning_rate) if self.can("learning_rate") else None

    def set_learning_rate(self, value: float) -> None:
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            self.message = f"ignored learning rate {value}"
            return
        self.source.learning_rate = value
        self.message = f"lr = {value:.3g}"

    @property
    def log10_learning_rate(self) -> float:
        lr = self.learning_rate
        return math.log10(lr) if lr else LOG10_LR_RANGE[0]

    def set_log10_learning_rate(self, value: float) -> None:
        """The slider's callback: it moves on a log scale."""
        lo, hi = LOG10_LR_RANGE
        self.set_learning_rate(10.0 ** min(max(float(value), lo), hi))

    @property
    def learning_rate_scale(self) -> float | None:
        lr, base = self.learning_rate, self.base_learning_rate
        return None if lr is None or not base else lr / base

    def set_learning_rate_scale(self, value) -> bool:
        """The web page's control: learning rate = `value` x the starting rate. Out-of-range, non-finite or
        non-numeric values are refused (False) and leave the rate as it was."""
        if not self.can("learning_rate") or not self.base_learning_rate:
            return False
        lo, hi = LR_SCALE_RANGE
        if not _finite_in(value, lo, hi):
            self.message = f"refused learning-rate scale {value!r} (allowed {lo:g} .. {hi:g})"
            return False
        self.source.learning_rate = self.base_learning_rate * float(value)
        self.message = f"lr scale {float(value):.3g}"
        return True

    @property
    def level_of_detail(self) -> float | None:
        return float(self.source.level_of_detail) if self.can("level_of_detail") else None

    def set_level_of_detail(self, value) -> bool:
        """Level-of-detail bias of scene renders (sources with `level_of_detail`, e.g. the octree): levels finer
        (> 0) or coarser (< 0) than the footprint rule picks. Refused (False) outside `source.lod_range`."""
        if not self.can("level_of_detail"):
            return False
        lo, hi = self.source.lod_range
        if not _finite_in(value, lo, hi):
            self.message = f"refused level of detail {value!r} (allowed {lo:g} .. {hi:g})"
            return False
        self.source.level_of_detail = float(value)
        self.version += 1  # renders change: drop the cached ones
        self.message = f"level of detail {float(value):+g}"
        return True

    def record_psnr(self, value: float) -> None:
        """The held-out PSNR after a render at the current step (one curve point per step)."""
        self.psnr = float(value)
        if self.psnr_steps and self.psnr_steps[-1] == self.step:
            self.psnrs[-1] = self.psnr
        elif math.isfinite(self.psnr):
            self.psnr_steps.append(self.step)
            self.psnrs.append(self.psnr)

    def reset(self) -> None:
        """Initial parameters and optimizer state, step 0, fresh loss curve; the learning rate is kept."""
        self.source.reset()
        self.step = 0
        self.version += 1
        self.loss_steps.clear()
        self.losses.clear()
        self.psnr_steps.clear()
        self.psnrs.clear()
        self._pending.clear()
        self.loss = self.psnr = None
        self.network_loss = None
        self.message = "parameters reset"

    def save_checkpoint(self, path: str | None = None) -> str:
        path = path or os.path.join(self.out_dir, f"checkpoint_step{self.step:06d}.tinn")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.source.save_checkpoint(path)
        self.message = f"saved {os.path.basename(path)}"
        return path

    def request_screenshot(self, path: str | None = None) -> str:
        """Queue a screenshot; the front end writes it after drawing the next frame."""
        if path is None:
            self._screenshots += 1
            path = os.path.join(self.out_dir, f"screenshot_{self.step:06d}_{self._screenshots}.png")
        self.screenshot_requests.append(path)
        self.message = f"screenshot {os.path.basename(path)}"
        return path

    def orbit_by(self, d_azimuth: float = 0.0, d_elevation: float = 0.0) -> None:
        """Turn the camera around the scene (degrees); nothing for sources without `render_from`."""
        if self.orbit is None:
            return
        self.orbit.rotate(d_azimuth, d_elevation)
        self.camera_version += 1
        self.message = f"orbit az {self.orbit.azimuth:.0f} el {self.orbit.elevation:.0f}"

    def orbit_left(self) -> None:
        self.orbit_by(-ORBIT_KEY_DEGREES, 0.0)

    def orbit_right(self) -> None:
        self.orbit_by(ORBIT_KEY_DEGREES, 0.0)

    def orbit_up(self) -> None:
        self.orbit_by(0.0, ORBIT_KEY_DEGREES)

    def orbit_down(self) -> None:
        self.orbit_by(0.0, -ORBIT_KEY_DEGREES)

    def orbit_home(self) -> None:
        """Back to the held-out view (the one the reference image shows)."""
        if self.orbit is None:
            return
        self.orbit.reset()
        self.camera_version += 1
        self.message = "held-out view"

    @property
    def orbiting(self) -> bool:
        """Whether the camera is away from the held-out view, so the prediction has no ground truth."""
        return self.orbit is not None and not self.orbit.at_home

    def quit(self) -> None:
        self.quit_requested = True

    # ---- the training loop's side -----------------------------------------------------------------
    def advance(self, steps: int = 1, budget_s: float | None = None) -> int:
        """Train unless paused or done: `steps` steps, or as many as fit in `budget_s` (at least one)."""
        if self.paused or self.finished:
            return 0
        left = steps if self.max_steps is None else min(steps, self.max_steps - self.step)
        if budget_s is None:
            return self._train(left)
        start, done = time.perf_counter(), 0
        while not self.finished and (done == 0 or time.perf_counter() - start < budget_s):
            done += self._train(1)
        return done

    def _train(self, n: int) -> int:
        start, queried = time.perf_counter(), self._network_loss_s
        for _ in range(n):
            loss = self.source.train_step()
            self._pending.append(loss.detach() if isinstance(loss, torch.Tensor) else float(loss))
            self.step += 1
            if self._network_loss_wanted and self.can("per_network_loss"):
                self._query_network_loss()
        if n:
            self.version += 1
        self._pending_time += time.perf_counter() - start - (self._network_loss_s - queried)
        return n

    def _query_network_loss(self) -> None:
        """Fold the source's per-network loss into the running average; its time is the page's, not training's."""
        start = time.perf_counter()
        per_net = self.source.per_network_loss()
        if per_net is not None:
            per_net = per_net.detach()
            self.network_loss = per_net.clone() if self.network_loss is None else \
                torch.lerp(per_net, self.network_loss, NETWORK_LOSS_DECAY)
        self._network_loss_s += time.perf_counter() - start

    def flush(self) -> None:
        """Read back queued losses (one device sync) and update loss, curve and steps/s."""
        if not self._pending:
            return
        start = time.perf_counter()
        if all(isinstance(v, torch.Tensor) for v in self._pending):
            values = torch.stack([v.reshape(()).float() for v in self._pending]).tolist()
        else:
            values = [float(v) for v in self._pending]
        elapsed = self._pending_time + time.perf_counter() - start
        first = self.step - len(values) + 1
        self.loss_steps.extend(range(first, self.step + 1))
        self.losses.extend(values)
        self.loss = values[-1]
        if elapsed > 0:
            rate = len(values) / elapsed
            self.steps_per_second = rate if self.steps_per_second is None else 0.7 * self.steps_per_second + 0.3 * rate
        self._pending.clear()
        self._pending_time = 0.0

    def take_screenshot_requests(self) -> list[str]:
        out, self.screenshot_requests = self.screenshot_requests, []
        return out

    def status_lines(self) -> list[str]:
        def fmt(v, spec):
            return "-" if v is None else format(v, spec)

        lines = [f"step {self.step}" + (f" / {self.max_steps}" if self.max_steps else ""),
                 f"loss {fmt(self.loss, '.4g')}",
                 f"psnr {fmt(self.psnr, '.2f')} db",
                 f"steps/s {fmt(self.steps_per_second, '.1f')}"]
        if self.can("learning_rate"):
            lines.append(f"lr {self.learning_rate:.3g}")
        if self.orbiting:
            lines.append(f"view az {self.orbit.azimuth:.0f} el {self.orbit.elevation:.0f}")
            lines.append("error, psnr: held-out view")
        lines.append("paused" if self.paused else ("done" if self.finished else "training"))
        if self.message:
            lines.append(self.message)
        return lines
