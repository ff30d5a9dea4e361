"""How much of the wall time the web page may take from training, and how a camera's render resolution follows.

One share (`view_share`) bounds the page's time while a browser is connected, whether its camera rests or
moves. Training earns the page credit (share / (1 - share) seconds per second trained); every page update
spends what it really took. An update runs once the credit covers what it is expected to cost, so over any
stretch longer than a few updates the page's time is at most about `view_share` of the whole.

Each camera has a target frame period (short while it moves, long at rest); the resolution of its renders adapts
so that a frame costs about its part of `view_share` x that period (the panels and curves get PANEL_FRACTION of
the share and refresh less often where they cost more). Where even the smallest resolution costs more, the
credit rule stretches the period instead: the resolution drops first, then the frame rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError

DEFAULT_VIEW_SHARE = 0.06
VIEW_SHARE_RANGE = (0.01, 0.5)  # above half the page would take more time than training
MOVING_FRAME_S = 1 / 15  # the frame period a moving camera aims at
RESTING_FRAME_S = 1.0  # ... and a resting one, whose view changes only as training goes on
PANEL_PERIOD_S = 0.5  # panels, status and curves refresh at most this often ...
PANEL_FRACTION = 1 / 3  # ... and, where they cost more, as often as this part of the share pays for; the cameras'
# renders aim at the rest, so that panels refreshed at their fastest cannot starve a moving camera's frames
MIN_SCALE = 0.1  # renders never drop below this share of the viewport's resolution (per side)
SCALE_STEP = (0.7, 1.4)  # one frame changes the resolution by at most these factors (per side)


def check_view_share(value) -> float:
    """`value` as a float in VIEW_SHARE_RANGE, else ConfigError naming `view_share` and the range."""
    lo, hi = VIEW_SHARE_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise ConfigError(f"view_share={value!r}: the page's share of wall time must be a number in [{lo:g}, {hi:g}]")
    return float(value)


def next_scale(scale: float, took_s: float, target_s: float, min_scale: float = MIN_SCALE) -> float:
    """The resolution scale (per side) for a camera's next render, after one at `scale` took `took_s`: a render's
    cost grows about with its pixel count, so the scale moves by sqrt(target / took), at most SCALE_STEP per
    frame, within [min_scale, 1]."""
    if took_s <= 0:
        factor = SCALE_STEP[1]
    else:
        factor = min(SCALE_STEP[1], max(SCALE_STEP[0], math.sqrt(target_s / took_s)))
    return min(1.0, max(min_scale, scale * factor))


class PageBudget:
    """The ledger of the page's time: credit earned by training, spent by page updates (seconds)."""

    def __init__(self, share: float = DEFAULT_VIEW_SHARE):
        self.share = check_view_share(share)
        self.credit = 0.0
        self.page_s = 0.0  # totals, for reports: time spent on the page and training while it was watched
        self.training_s = 0.0

    @property
    def earn_rate(self) -> float:
        """Seconds of page time one second of training pays for."""
        return self.share / (1.0 - self.share)

    def frame_cost_target(self, period_s: float) -> float:
        """What one update may cost for updates to come every `period_s` within the share."""
        return self.share * period_s

    def trained(self, seconds: float, cap_s: float) -> None:
        """Training ran `seconds`; credit grows, but saves up no more than `cap_s` (one expected update), so
        that a stretch with nothing to show is not paid back later by a burst of updates."""
        self.training_s += seconds
        if self.credit < cap_s:
            self.credit = min(cap_s, self.credit + seconds * self.earn_rate)

    def spent(self, seconds: float) -> None:
        """A page update took `seconds`; the credit may go negative (a debt training pays back first)."""
        self.page_s += seconds
        self.credit -= seconds

    def affords(self, cost_s: float, training_s: float = 0.0) -> bool:
        """Whether an update expected to cost `cost_s` fits, counting `training_s` trained and not yet booked."""
        return self.credit + training_s * self.earn_rate >= cost_s

    def training_before(self, cost_s: float) -> float:
        """Training time still needed before an update of `cost_s` fits (0: it fits now)."""
        return max(0.0, (cost_s - self.credit) / self.earn_rate)

    def reset(self) -> None:
        """Nobody watching: no credit carries over to the next browser."""
        self.credit = 0.0


@dataclass
class ViewState:
    """One camera's render settings and what its updates cost (seconds, as last measured)."""
    scale: float = 0.25  # resolution (per side) of renders while the camera moves (the first answer: cheap)
    rest_scale: float = 1.0  # ... and at rest
    move_cost: float = 0.0  # 0: not measured yet (the first update runs and measures it)
    rest_cost: float = 0.0
    frame_at: float = -math.inf  # when its last frame was sent

    def cost(self, moving: bool) -> float:
        """What its next update is expected to cost: the last one in the same state (at rest, before any,
        the moving cost grown with the pixel count)."""
        if moving:
            return self.move_cost
        return self.rest_cost or self.move_cost * (self.rest_scale / self.scale) ** 2

    def period(self, moving: bool) -> float:
        return MOVING_FRAME_S if moving else RESTING_FRAME_S


class PageSchedule:
    """Decides when the page updates and at what resolution, so that its time stays within `view_share`.

    The loop asks `due` between training slices; an update calls `begin`, then `view_sent` for each render and
    `panels_sent` for the panels, then `end`. Only time while training runs is booked: a paused run's page is free.
    `clock` is injectable so that the schedule can be checked against simulated costs.
    """

    def __init__(self, share: float = DEFAULT_VIEW_SHARE, clock=None):
        import time

        self.budget = PageBudget(share)
        self.clock = clock or time.perf_counter
        self.panel_cost = 0.0
        self.panels_at = -math.inf
        self._mark: float | None = None  # end of the last update: training since then earns credit
        self._off_training = 0.0  # time since the mark that was not training (controls, per-network loss)
        self._begun: float | None = None

    # ---- what is due ----------------------------------------------------------------------------------
    def view_due(self, view: ViewState, moving: bool, changed: bool, now: float) -> bool:
        """A camera whose picture changed gets a frame once its period has passed since its last one."""
        return changed and now - view.frame_at >= view.period(moving)

    def panel_period(self) -> float:
        """How often the panels refresh: every PANEL_PERIOD_S, or as often as PANEL_FRACTION of the share pays."""
        return max(PANEL_PERIOD_S, self.panel_cost / (self.budget.share * PANEL_FRACTION))

    def panels_due(self, changed: bool, now: float) -> bool:
        return changed and now - self.panels_at >= self.panel_period()

    def view_cost_target(self, period_s: float, n_views: int) -> float:
        """What one camera's frame may cost for frames every `period_s` within the cameras' part of the share."""
        return self.budget.frame_cost_target(period_s) * (1.0 - PANEL_FRACTION) / max(1, n_views)

    def training_since_mark(self, now: float) -> float:
        return 0.0 if self._mark is None else max(0.0, now - self._mark - self._off_training)

    def affords(self, cost_s: float, now: float) -> bool:
        """Whether an update expected to cost `cost_s` fits the share now."""
        return self.budget.affords(cost_s, self.training_since_mark(now))

    def not_training(self, seconds: float) -> None:
        """Page work done outside an update (controls, per-network loss queries): not training, and paid for."""
        self._off_training += seconds
        self.budget.spent(seconds)

    # ---- an update ----------------------------------------------------------------------------------
    def begin(self, training: bool, expected_s: float) -> None:
        """An update starts: the training since the last one is booked (credit saved up to `expected_s`)."""
        now = self.clock()
        if training and self._mark is not None:
            self.budget.trained(self.training_since_mark(now), cap_s=max(expected_s, 0.0))
        self._begun = now

    def view_sent(self, view: ViewState, moving: bool, took_s: float, n_views: int) -> None:
        """A camera's render went out after `took_s`: its cost is noted and its resolution adapts towards a cost
        of view_share x its period (shared by `n_views` cameras)."""
        view.frame_at = self.clock()
        target = self.view_cost_target(view.period(moving), n_views)
        if moving:
            if not view.rest_cost:  # no frame at rest yet: its first resolution from this one (cost ~ pixels)
                rest_target = self.view_cost_target(view.period(False), n_views)
                view.rest_scale = min(1.0, max(MIN_SCALE, view.scale * math.sqrt(rest_target / max(took_s, 1e-9))))
            view.move_cost = took_s
            view.scale = next_scale(view.scale, took_s, target)
        else:
            view.rest_cost = took_s
            view.rest_scale = next_scale(view.rest_scale, took_s, target)

    def panels_sent(self, took_s: float) -> None:
        self.panel_cost = took_s
        self.panels_at = self.clock()

    def end(self, training: bool) -> float:
        """The update is done; returns what it took (booked against the share while training runs)."""
        now = self.clock()
        took = now - self._begun
        if training:
            self.budget.spent(took)
        self._mark, self._off_training, self._begun = now, 0.0, None
        return took

    def totals(self) -> tuple[float, float]:
        """(page seconds, training seconds) booked while a browser watched, the training since the last update
        included: readable at any moment (another thread may take it while an update runs)."""
        now, mark = self.clock(), self._mark
        pending = 0.0 if mark is None or self._begun is not None else max(0.0, now - mark - self._off_training)
        return self.budget.page_s, self.budget.training_s + pending

    def reset(self) -> None:
        """Nobody watching: the next browser starts with no credit and no debt."""
        self.budget.reset()
        self._mark, self._off_training = None, 0.0
