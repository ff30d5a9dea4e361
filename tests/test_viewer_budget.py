"""The web page's share of the time (`tinn.viewer.budget`): the viewer's own loop run against a simulated clock, on
which training steps, renders and per-network loss queries cost given times, so the share can be checked exactly."""
import importlib.util
import math
import types

import numpy as np
import pytest
import torch

from tinn.errors import ConfigError
from tinn.viewer import Viewer
from tinn.viewer import controller as controller_module
from tinn.viewer.budget import (MIN_SCALE, MOVING_FRAME_S, PANEL_FRACTION, RESTING_FRAME_S, VIEW_SHARE_RANGE,
                                PageBudget, check_view_share, next_scale)
from tinn.viewer.web import BrowserCamera

needs_viser = pytest.mark.needs_package(importlib.util.find_spec("viser") is not None, "the web viewer needs viser")


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SimulatedScene:
    """A scene source whose work costs simulated time: a step `step_s`, a render `fixed_s` + `pixel_s` per pixel,
    the held-out view for the panels `heldout_s`, a per-network loss query `query_s`. `on_step` runs after every
    step (it moves the camera, ends the run)."""

    def __init__(self, clock, step_s, fixed_s, pixel_s, query_s=0.0, heldout_s=0.0):
        self.clock, self.step_s, self.fixed_s, self.pixel_s, self.query_s = clock, step_s, fixed_s, pixel_s, query_s
        self.heldout_s = heldout_s
        self.steps = 0
        self.on_step = lambda: None

    def train_step(self):
        self.clock.advance(self.step_s)
        self.steps += 1
        self.on_step()
        return 0.0

    def per_network_loss(self):
        self.clock.advance(self.query_s)
        return torch.ones(2)

    def render(self):
        self.clock.advance(self.heldout_s)
        return np.zeros((4, 4, 3), np.float32)

    def reference(self):
        return np.zeros((4, 4, 3), np.float32)

    def render_from(self, c2w):
        return np.zeros((4, 4, 3), np.float32)

    def orbit_start(self):
        c2w = torch.eye(4)
        c2w[2, 3] = 3.0
        return c2w, torch.zeros(3)

    def render_camera(self, c2w, width, height, focal):
        self.clock.advance(self.fixed_s + self.pixel_s * width * height)
        return np.zeros((height, width, 3), np.float32)


class Client:
    """What the frontend needs of a viser client: somewhere to send the background image."""

    def __init__(self):
        self.scene = types.SimpleNamespace(set_background_image=lambda image, **kwargs: None)


def simulate(tmp_path, monkeypatch, *, seconds, step_s, fixed_s, pixel_s, move_every_s=None, move_from_s=0.0,
             query_s=0.0, heldout_s=0.02, share=0.06):
    """Run the web viewer's loop for `seconds` of simulated time with one 1280 x 720 browser camera (moved every
    `move_every_s` from `move_from_s` on, or at rest). Returns (page's share of the wall time, frames as
    (time, scale, moving), camera)."""
    clock = FakeClock()
    monkeypatch.setattr(controller_module, "time", types.SimpleNamespace(perf_counter=clock))
    source = SimulatedScene(clock, step_s, fixed_s, pixel_s, query_s, heldout_s)
    viewer = Viewer(source, out_dir=str(tmp_path), backend="web", log=lambda *a: None,
                    web={"port": 0, "view_share": share, "clock": clock})
    web, c = viewer.frontend, viewer.controller
    client = Client()
    monkeypatch.setattr(web.server, "get_clients", lambda: {1: client})
    cam = BrowserCamera(torch.eye(4), math.radians(60), 1280, 720, moved_at=clock())
    web.cameras[1] = cam
    frames, start = [], clock()
    sent = web._publish_view

    def publish_view(cam, client, moving, n_views):
        scale = cam.view.scale if moving else cam.view.rest_scale
        sent(cam, client, moving, n_views)
        frames.append((clock() - start, scale, moving))

    monkeypatch.setattr(web, "_publish_view", publish_view)
    moves = {"at": clock()}

    def on_step():
        if move_every_s is not None and clock() - start >= move_from_s and clock() - moves["at"] >= move_every_s:
            cam.seq += 1
            cam.moved_at = moves["at"] = clock()
        if clock() - start >= seconds:
            c.quit()

    source.on_step = on_step
    try:
        viewer._run_web()
    finally:
        web.close()
    wall = clock() - start
    training = source.steps * step_s
    return 1.0 - training / wall, frames, cam


@needs_viser
def test_resting_camera_the_page_takes_its_share(tmp_path, monkeypatch):
    # A full-resolution frame (1024 x 576 of the 1280 x 720 viewport) costs 0.12 s, twice what a frame a second may.
    share, frames, cam = simulate(tmp_path, monkeypatch, seconds=60.0, step_s=0.01, fixed_s=0.002, pixel_s=2e-7,
                                  query_s=0.0001)
    at_rest = [f for f in frames if not f[2]]
    assert len(at_rest) >= 20
    assert share == pytest.approx(0.06, abs=0.012)
    # The resolution went down to fit a frame a second in the cameras' part of the share:
    # 0.002 + 2e-7 x 1280 x 720 x scale^2 = 0.06 x (1 - PANEL_FRACTION) x RESTING_FRAME_S.
    target = 0.06 * (1 - PANEL_FRACTION) * RESTING_FRAME_S
    assert cam.view.rest_scale == pytest.approx(math.sqrt((target - 0.002) / (2e-7 * 1280 * 720)), rel=0.05)
    assert np.diff([t for t, _, moving in at_rest[5:]]).mean() == pytest.approx(RESTING_FRAME_S, rel=0.25)


@needs_viser
def test_moving_camera_keeps_its_frame_rate_while_the_resolution_can_fall(tmp_path, monkeypatch):
    # Renders cost little beyond their pixels: a smaller resolution fits the frame period within the share.
    share, frames, cam = simulate(tmp_path, monkeypatch, seconds=30.0, step_s=0.004, fixed_s=0.0005, pixel_s=2e-7,
                                  move_every_s=1 / 30)
    assert share == pytest.approx(0.06, abs=0.012)
    assert cam.view.scale > MIN_SCALE
    late = [t for t, _, moving in frames if moving and t > 10.0]
    period = np.diff(late).mean()
    assert period < 1.6 * MOVING_FRAME_S


@needs_viser
def test_moving_camera_at_the_smallest_resolution_gets_fewer_frames(tmp_path, monkeypatch):
    # Even the smallest render costs 10 ms, more than the 4 ms a frame every MOVING_FRAME_S may take.
    share, frames, cam = simulate(tmp_path, monkeypatch, seconds=30.0, step_s=0.004, fixed_s=0.010, pixel_s=2e-7,
                                  move_every_s=1 / 30)
    assert share == pytest.approx(0.06, abs=0.012)
    assert cam.view.scale == MIN_SCALE
    scales = [s for _, s, moving in frames if moving]
    assert scales[-1] == MIN_SCALE and scales[1] > MIN_SCALE  # the resolution fell first ...
    late = [t for t, _, moving in frames if moving and t > 10.0]
    cost = 0.010 + 2e-7 * 128 * 72
    # ... then the frame rate: frames as often as the share pays for, less what the panels take of it.
    assert cost / 0.06 < np.diff(late).mean() < 1.1 * cost / (0.06 * (1 - PANEL_FRACTION))


@pytest.mark.parametrize("bad", [0.0, 0.009, 0.51, 1.0, -0.1, float("nan"), float("inf"), "0.05", True, None])
def test_view_share_out_of_range_is_refused_naming_the_field(bad):
    lo, hi = VIEW_SHARE_RANGE
    with pytest.raises(ConfigError, match=rf"view_share=.*\[{lo:g}, {hi:g}\]"):
        check_view_share(bad)
    with pytest.raises(ConfigError, match="view_share"):
        PageBudget(bad)


@needs_viser
def test_web_viewer_with_a_bad_view_share_refuses_to_start(tmp_path):
    import argparse

    from tinn.viewer.cli import add_viewer_args, open_viewer

    parser = argparse.ArgumentParser()
    add_viewer_args(parser)
    args = parser.parse_args(["--viewer", "web", "--port", "0", "--view-share", "0.9"])
    with pytest.raises(ConfigError, match=r"view_share=0.9.*\[0.01, 0.5\]"):
        open_viewer(args, SimulatedScene(FakeClock(), 0.01, 0.0, 0.0), str(tmp_path), "test")


def test_view_share_within_range_is_kept():
    assert check_view_share(0.05) == 0.05 and check_view_share(VIEW_SHARE_RANGE[1]) == VIEW_SHARE_RANGE[1]


def test_budget_credit_pays_for_updates_at_the_share():
    budget = PageBudget(0.2)  # a second of training pays for a quarter second of page
    budget.trained(1.0, cap_s=1.0)
    assert budget.credit == pytest.approx(0.25) and budget.affords(0.25) and not budget.affords(0.3)
    budget.spent(0.45)
    assert budget.credit == pytest.approx(-0.2)
    assert budget.training_before(0.1) == pytest.approx(0.3 / 0.25)
    budget.trained(10.0, cap_s=0.1)  # nothing to show: no more than one update saved up
    assert budget.credit == pytest.approx(0.1)


def test_next_scale_moves_by_the_square_root_within_its_limits():
    assert next_scale(0.5, took_s=0.04, target_s=0.01) == pytest.approx(0.35)  # sqrt(1/4) limited to 0.7
    assert next_scale(0.5, took_s=0.0121, target_s=0.01) == pytest.approx(0.5 * math.sqrt(0.01 / 0.0121))
    assert next_scale(0.12, took_s=1.0, target_s=0.01) == MIN_SCALE
    assert next_scale(0.9, took_s=0.001, target_s=0.01) == 1.0


@needs_viser
def test_a_camera_that_starts_moving_is_answered_after_the_current_slice(tmp_path, monkeypatch):
    from tinn.viewer.app import FRAME_BUDGET_S

    share, frames, cam = simulate(tmp_path, monkeypatch, seconds=25.0, step_s=0.01, fixed_s=0.002, pixel_s=2e-7,
                                  move_every_s=1 / 30, move_from_s=20.0)
    first_move = min(t for t, _, moving in frames if moving and t > 15.0)
    # The first camera message comes with the first step past 20 s; the answer follows the slice it lands in,
    # whatever the resting frames left of the credit.
    assert 20.0 <= first_move <= 20.0 + FRAME_BUDGET_S + 2 * 0.01 + 0.05
