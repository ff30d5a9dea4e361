"""The training viewer: frames show the prediction (GGUI offscreen and the numpy/PNG fallback),
the controls act through the controller (via the same widget code GGUI runs), and a missing
Vulkan gives a one-line message and the fallback, not a stack trace."""
import contextlib
import json
import os
import subprocess
import sys

import imageio.v3 as iio
import numpy as np
import pytest
import torch

import tinn
from tinn.tasks.image import ImageTask, default_image
from tinn.trainer import Trainer
from tinn.viewer import ImageTrainerSource, Viewer, ViewerUnavailable, app, vulkan_installed
from tinn.viewer.controller import ViewerController
from tinn.viewer.font import draw_text
from tinn.viewer.layout import Layout
from tinn.viewer.render import loss_curve_image, quantize
from tinn.render import camera_rays
from tinn.scenes.data.procedural import look_at_poses
from tinn.viewer.orbit import OrbitCamera
from tinn.viewer.window import ORBIT_HELP, OrbitDrag, draw_controls, ggui_support, handle_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = {
    "loss": {"otype": "L2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15},
    "encoding": {"otype": "Frequency", "n_frequencies": 4},
    "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU"},
}
VULKAN, NO_VULKAN_REASON = vulkan_installed()
GGUI, NO_GGUI_REASON = ggui_support()
# A backend without GGUI (Quadrants) skips these tests anywhere; a missing Vulkan (a system package) skips them
# locally and fails them in CI (tests/conftest.py: missing_package).
needs_vulkan = [pytest.mark.skipif(not GGUI, reason=f"GGUI needs Taichi: {NO_GGUI_REASON}"),
                pytest.mark.needs_package(VULKAN, f"GGUI needs Vulkan: {NO_VULKAN_REASON}")]


def make_source(size=48, tiles=2, batch=1024):
    task = ImageTask(default_image(size), tiles=tiles, seed=0)
    trainer = Trainer.from_config(CONFIG, 2, 3, n_networks=task.n_networks, seed=7)
    return ImageTrainerSource(trainer, task, batch), trainer, task


def panel(frame, viewer, name):
    """A panel of a saved frame, sampled back to image resolution (the layout zooms by an integer here)."""
    zoom = int(viewer.layout.zoom)
    assert zoom == viewer.layout.zoom
    return viewer.layout.panels[name].crop(frame)[zoom // 2::zoom, zoom // 2::zoom]


def read_rgb(path):
    return iio.imread(path)[..., :3]


# ---- frames --------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [pytest.param("ggui", marks=needs_vulkan), "png"])
def test_headless_run_saves_frames_showing_the_prediction(tmp_path, backend, monkeypatch):
    monkeypatch.setenv(app.BACKEND_ENV, backend)  # "ggui": fail rather than fall back
    source, trainer, task = make_source()
    viewer = Viewer(source, out_dir=str(tmp_path), headless=True, frame_every=3)
    assert viewer.backend == backend and not viewer.frontend.visible
    summary = viewer.run(steps=6)

    assert summary["steps"] == 6 and len(summary["history"]["loss"]) == 6
    assert [os.path.basename(f) for f in summary["frames"]] == ["frame_000000.png", "frame_000003.png",
                                                                "frame_000006.png"]
    frame = read_rgb(summary["frames"][-1])
    assert frame.shape[:2] == viewer.layout.size

    expected = quantize(task.render(trainer.model).cpu().numpy())
    shown = panel(frame, viewer, "prediction")
    assert shown.shape == expected.shape
    assert np.abs(shown.astype(int) - expected).max() <= 1
    assert shown.std() > 5  # not blank
    first = panel(read_rgb(summary["frames"][0]), viewer, "prediction")
    assert np.abs(first.astype(int) - shown).mean() > 1  # training moved it
    reference = quantize(task.image.cpu().numpy())
    assert np.abs(panel(frame, viewer, "reference").astype(int) - reference).max() <= 1
    # The sidebar carries the controls (GGUI's imgui) or the status text (fallback).
    assert viewer.layout.sidebar.crop(frame).std() > 5

    curve = read_rgb(summary["loss_curve"])
    assert curve.std() > 5
    with open(tmp_path / "summary.json") as f:
        assert json.load(f)["backend"] == backend


def test_missing_vulkan_or_display_is_one_line_and_falls_back(monkeypatch):
    layout = Layout((16, 16), arrays=False)
    messages = []
    monkeypatch.delenv(app.BACKEND_ENV, raising=False)
    monkeypatch.setattr(app, "ggui_support", lambda: (True, ""))
    monkeypatch.setattr(app, "vulkan_installed", lambda: (False, "no Vulkan loader (libvulkan) installed"))
    front = app.open_frontend(layout, headless=True, log=messages.append, out_dir="out/x")
    assert front.kind == "png"
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "no Vulkan loader" in messages[0] and "falling back" in messages[0] and "out/x" in messages[0]

    # Vulkan looks installed but the window still fails: same fallback, Taichi's reason in the line.
    class Failing:
        def __init__(self, *a, **k):
            raise ViewerUnavailable("GGUI could not open a window (Vulkan must be available for GGUI)")

    messages.clear()
    monkeypatch.setattr(app, "vulkan_installed", lambda: (True, ""))
    monkeypatch.setattr(app, "GGUIFrontend", Failing)
    assert app.open_frontend(layout, headless=False, log=messages.append).kind == "png"
    assert any("Vulkan must be available" in m for m in messages)
    with pytest.raises(ViewerUnavailable):
        app.open_frontend(layout, headless=True, backend="ggui", log=messages.append)

    # A window asked for without a display: GLFW would end the process, so it goes offscreen first.
    class Recording:
        kind = "ggui"

        def __init__(self, layout, visible, title):
            self.visible = visible

    messages.clear()
    monkeypatch.setattr(app, "GGUIFrontend", Recording)
    monkeypatch.setattr(app, "has_display", lambda: False)
    assert app.open_frontend(layout, headless=False, log=messages.append).visible is False
    assert len(messages) == 1 and "no display" in messages[0]


def test_backend_without_ggui_falls_back_to_png_saying_why(monkeypatch):
    # Taichi has GGUI, Quadrants removed it: the check names the backend.
    assert GGUI == (tinn.runtime.backend_name() == "taichi")
    if not GGUI:
        assert "quadrants" in NO_GGUI_REASON and "no GGUI" in NO_GGUI_REASON
    layout = Layout((16, 16), arrays=False)
    messages = []
    monkeypatch.delenv(app.BACKEND_ENV, raising=False)
    monkeypatch.setattr(app, "has_display", lambda: True)
    monkeypatch.setattr(app, "vulkan_installed", lambda: (True, ""))
    reason = "the quadrants 1.3.3 backend has no GGUI (its ui module was removed); the window needs the taichi backend"
    monkeypatch.setattr(app, "ggui_support", lambda: (False, reason))
    front = app.open_frontend(layout, headless=False, log=messages.append, out_dir="out/q")
    assert front.kind == "png"
    assert messages == [f"tinn.viewer: GGUI unavailable: {reason}; falling back to headless PNG frames in out/q"]
    with pytest.raises(ViewerUnavailable, match="has no GGUI"):
        app.open_frontend(layout, headless=True, backend="ggui", log=messages.append)


@pytest.mark.slow
def test_cli_without_vulkan_prints_a_line_and_writes_frames(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    env = dict(os.environ, TINN_ARCH="cpu", VK_ICD_FILENAMES=str(tmp_path / "no_such_icd.json"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DISPLAY", None)
    env.pop("TINN_VIEWER_BACKEND", None)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "tinn.viewer", "--config", str(config), "--size", "32",
                           "--tiles", "2", "--batch", "512", "--steps", "2", "--out", str(out)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "Traceback" not in text
    # no driver, or no loader at all; or a backend without GGUI
    assert ("tinn.viewer: GGUI unavailable: " + ("no Vulkan" if GGUI else "the quadrants")) in text
    assert {"frame_000000.png", "frame_000002.png", "loss_curve.png", "summary.json"} <= set(os.listdir(out))


# ---- controls, through the widget code ----------------------------------------------------------------
class FakeGui:
    """Stands in for `window.get_gui()`: records widgets, "clicks" the buttons named in `press`."""

    def __init__(self, press=(), slider=None):
        self.press, self.slider = set(press), slider or {}
        self.labels, self.texts = [], []

    @contextlib.contextmanager
    def sub_window(self, name, x, y, w, h):
        assert 0 <= x < 1 and 0 <= y < 1 and x + w <= 1.0001 and y + h <= 1.0001
        yield self

    def text(self, line):
        self.texts.append(line)

    def button(self, label):
        self.labels.append(label)
        return label in self.press

    def slider_float(self, label, value, minimum, maximum):
        self.labels.append(label)
        return np.float32(self.slider.get(label, value))  # imgui hands back float32


def click(viewer, *labels, **slider):
    gui = FakeGui(labels, {k.replace("_", " "): v for k, v in slider.items()})
    draw_controls(gui, viewer.controller, viewer.layout)
    assert set(labels) <= set(gui.labels), gui.labels
    return gui


@pytest.fixture
def png_viewer(tmp_path):
    source, trainer, task = make_source(size=32)
    return Viewer(source, out_dir=str(tmp_path), headless=True, backend="png"), trainer


def test_pause_resume_and_single_step(png_viewer):
    viewer, trainer = png_viewer
    c = viewer.controller
    assert c.advance(2) == 2 and c.step == 2
    click(viewer, "Pause")
    assert c.paused and c.advance(5) == 0 and c.step == 2
    click(viewer, "Step")
    assert c.paused and c.step == 3 == trainer.step and len(c.losses) == 3
    click(viewer, "Resume")
    assert not c.paused and c.advance(1) == 1
    assert handle_key(" ", c) and c.paused
    assert handle_key("n", c) and c.step == 5
    assert not handle_key("q", c)


def test_learning_rate_slider(png_viewer):
    viewer, trainer = png_viewer
    click(viewer, log10_lr=-3.0)
    assert trainer.learning_rate == pytest.approx(1e-3, rel=1e-4)
    for _ in range(3):  # an untouched slider must not drift the rate through float32 round-off
        click(viewer)
    assert trainer.learning_rate == pytest.approx(1e-3, rel=1e-4)
    viewer.controller.set_learning_rate(-1.0)  # rejected, rate kept
    assert trainer.learning_rate == pytest.approx(1e-3, rel=1e-4)


def test_reset_restores_parameters_and_optimizer(png_viewer):
    viewer, trainer = png_viewer
    c = viewer.controller
    model0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    opt0 = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in trainer.optimizer.state_dict().items()}
    c.advance(3)
    c.set_learning_rate(5e-3)
    assert any(not torch.equal(model0[k], v) for k, v in trainer.model.state_dict().items())
    before = viewer.draw()
    click(viewer, "Reset parameters")
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(model0[k], v), k
    for k, v in trainer.optimizer.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(opt0[k], v), k
    assert c.step == 0 == trainer.step and c.losses == [] and c.network_loss is None
    assert trainer.learning_rate == pytest.approx(5e-3)  # the user's rate survives a reset
    after = viewer.draw()  # the prediction is re-rendered, not served from the cache
    assert not np.array_equal(panel(before, viewer, "prediction"), panel(after, viewer, "prediction"))
    viewer.source.reset(seed=5)  # the adapter can also re-draw the weights from another seed
    assert not torch.equal(trainer.model.network.params, model0["network.params"])


def test_save_checkpoint_and_screenshot(png_viewer, tmp_path):
    viewer, trainer = png_viewer
    c = viewer.controller
    c.advance(2)
    click(viewer, "Save checkpoint", "Save screenshot")
    ckpt = tmp_path / "checkpoint_step000002.tinn"
    assert ckpt.exists()
    fresh = Trainer.from_config(CONFIG, 2, 3, n_networks=trainer.n_networks, seed=99)
    fresh.load_checkpoint(ckpt)
    for (k, a), b in zip(trainer.model.state_dict().items(), fresh.model.state_dict().values()):
        assert torch.equal(a, b), k
    [shot] = c.screenshot_requests
    frame = viewer.draw()  # the front end writes queued screenshots after drawing
    assert np.array_equal(read_rgb(shot), frame) and c.screenshot_requests == []


# ---- any source, not only images ----------------------------------------------------------------------
class FieldSource:
    """A generic source with only the required methods: fit a 2-channel field by gradient descent."""

    def __init__(self):
        y, x = torch.meshgrid(torch.linspace(0, 1, 20), torch.linspace(0, 1, 24), indexing="ij")
        self.target = torch.stack([x, y], -1)
        self.value = torch.zeros_like(self.target, requires_grad=True)

    def train_step(self):
        loss = ((self.value - self.target) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            self.value -= 200.0 * self.value.grad
            self.value.grad = None
        return loss.detach()

    def render(self):
        return self.value.detach()

    def reference(self):
        return self.target


def test_generic_source_without_optional_capabilities(tmp_path):
    viewer = Viewer(FieldSource(), out_dir=str(tmp_path), headless=True, backend="png", zoom=2)
    summary = viewer.run(steps=4)
    assert summary["final_psnr"] > 10 and summary["final_loss"] < summary["history"]["loss"][0]
    gui = click(viewer)
    assert "Reset parameters" not in gui.labels and "log10 lr" not in gui.labels and "Pause" in gui.labels
    assert "ownership" not in viewer.layout.panels
    # No render_from: no orbit camera, its keys do nothing and its help is not shown.
    assert viewer.controller.orbit is None and not handle_key("a", viewer.controller)
    assert not set(ORBIT_HELP) & set(gui.texts)
    shown = panel(read_rgb(summary["frames"][-1]), viewer, "prediction")
    assert shown.shape == (20, 24, 3) and np.all(shown[..., 2] == 0)  # 2 channels drawn as red/green


# ---- scene sources: the orbit camera --------------------------------------------------------------------
class SkySource:
    """A scene source: a sky coloured by each pixel's world-space ray direction, times a trained gain.

    Any turn of the camera changes the picture, and rendering costs next to nothing. Records every
    render_from call as (pose, gain) so a test can rebuild what each frame should show.
    """

    SIZE, FOCAL = 12, 10.0

    def __init__(self):
        self.home = look_at_poses(torch.tensor([[2.0, 1.0, 1.0]]))[0]
        self.gain = torch.tensor(0.3, requires_grad=True)
        self.calls = []

    def image(self, c2w, gain):
        _, dirs = camera_rays(c2w, self.SIZE, self.SIZE, self.FOCAL)
        return (gain * (0.5 + 0.5 * dirs)).reshape(self.SIZE, self.SIZE, 3)

    def train_step(self):
        loss = (self.gain - 1.0) ** 2
        loss.backward()
        with torch.no_grad():
            self.gain -= 0.2 * self.gain.grad
            self.gain.grad = None
        return loss.detach()

    def render(self):
        return self.image(self.home, self.gain.detach())

    def reference(self):
        return self.image(self.home, 1.0)

    def render_from(self, c2w):
        self.calls.append((c2w.clone(), self.gain.detach().clone()))
        return self.image(c2w, self.gain.detach())

    def orbit_start(self):
        return self.home, torch.zeros(3)


@pytest.mark.parametrize("backend", [pytest.param("ggui", marks=needs_vulkan), "png"])
def test_headless_frames_orbit_the_scene(tmp_path, backend, monkeypatch):
    monkeypatch.setenv(app.BACKEND_ENV, backend)
    source = SkySource()
    viewer = Viewer(source, out_dir=str(tmp_path), headless=True, frame_every=1, zoom=8, orbit_degrees_per_frame=30)
    summary = viewer.run(steps=3)
    frames = [read_rgb(f) for f in summary["frames"]]
    assert len(frames) == 4

    # The poses follow the orbit: 30 degrees of azimuth per saved frame, from the held-out view on.
    orbit = OrbitCamera.from_c2w(source.home)
    assert len(source.calls) == 3
    for k, (pose, _) in enumerate(source.calls, start=1):
        orbit.rotate(30.0)
        assert torch.allclose(pose, orbit.c2w(), atol=1e-6), k
        assert (pose[:3, 3].norm() - source.home[:3, 3].norm()).abs() < 1e-5  # same distance

    # The scene panel shows what each pose sees, and it changes frame to frame; the first frame is the held-out view.
    expected = [quantize(source.image(source.home, 0.3).numpy())] + \
        [quantize(source.image(pose, gain).numpy()) for pose, gain in source.calls]
    shown = [panel(f, viewer, "prediction").astype(int) for f in frames]
    for k in range(4):
        assert np.abs(shown[k] - expected[k]).max() <= 1, k
    for a, b in zip(shown, shown[1:]):
        assert np.abs(a - b).mean() > 2
    # No ground truth for new poses: the reference stays the held-out image.
    reference = quantize(source.reference().numpy())
    for f in frames:
        assert np.abs(panel(f, viewer, "reference").astype(int) - reference).max() <= 1
    assert summary["final_psnr"] == pytest.approx(viewer._psnr(source.render().numpy()), abs=1e-4)


def test_orbit_keys_buttons_and_status():
    source = SkySource()
    c = ViewerController(source)
    assert c.orbit is not None and not c.orbiting and "view az" not in " ".join(c.status_lines())
    start = c.orbit.azimuth, c.orbit.elevation
    assert handle_key("a", c) and c.orbit.azimuth == pytest.approx((start[0] - 10) % 360)
    assert handle_key("w", c) and c.orbit.elevation == pytest.approx(start[1] + 10)
    assert c.orbiting and any(line.startswith("view az") for line in c.status_lines())
    layout = Layout((12, 12), arrays=False, zoom=8)
    gui = FakeGui(press=["Held-out view"])
    draw_controls(gui, c, layout)
    assert not c.orbiting and torch.equal(c.orbit.c2w(), source.home)
    assert set(ORBIT_HELP) <= set(gui.texts)
    version = c.camera_version
    assert handle_key("d", c) and handle_key("h", c) and c.camera_version == version + 2 and not c.orbiting

    class NoStart(FieldSource):  # render_from without the pose to start from
        def render_from(self, c2w):
            return self.render()

    with pytest.raises(TypeError, match="orbit_start"):
        ViewerController(NoStart())


def test_drag_turns_the_orbit_only_from_the_panels():
    layout = Layout((12, 12), arrays=False, zoom=8)
    h, w = layout.size
    drag = OrbitDrag(layout)
    p = layout.panels["prediction"]
    x0, y0 = (p.x + p.w / 2) / w, 1 - (p.y + p.h / 2) / h  # GGUI's cursor: y up
    assert drag.update(False, x0, y0) == (0.0, 0.0)
    assert drag.update(True, x0, y0) == (0.0, 0.0)  # the press itself
    d_az, d_el = drag.update(True, x0 + 0.1, y0 + 0.05)  # right and up
    assert d_az == pytest.approx(-18.0) and d_el == pytest.approx(-9.0)
    assert drag.update(False, x0, y0) == (0.0, 0.0)
    sb = layout.sidebar
    xs, ys = (sb.x + sb.w / 2) / w, 1 - (sb.y + sb.h / 2) / h
    assert drag.over_sidebar(xs, ys) and not drag.over_sidebar(x0, y0)
    drag.update(True, xs, ys)  # imgui's slider, say: no orbit
    assert drag.update(True, xs - 0.3, ys) == (0.0, 0.0)


def test_window_drag_reaches_the_orbit_through_ggui_calls():
    """The visible window's input path (no display here): a stand-in window reports a left-button drag."""
    from types import SimpleNamespace

    from tinn.viewer.window import GGUIFrontend

    class FakeWindow:
        def __init__(self):
            self.cursor, self.pressed = (0.2, 0.5), False

        def get_events(self, kind):
            return []

        def get_cursor_pos(self):
            return self.cursor

        def is_pressed(self, key):
            assert key == "LMB"
            return self.pressed

    layout = Layout((12, 12), arrays=False, zoom=8)
    front = GGUIFrontend.__new__(GGUIFrontend)  # skips opening a Vulkan window
    front.ti = SimpleNamespace(ui=SimpleNamespace(PRESS="Press", LMB="LMB"))
    front.layout, front.visible, front.window = layout, True, FakeWindow()
    front.canvas, front.gui, front.drag = SimpleNamespace(set_image=lambda image: None), FakeGui(), OrbitDrag(layout)
    c = ViewerController(SkySource())
    frame = np.zeros(layout.size + (3,), np.uint8)
    azimuth = c.orbit.azimuth
    front.window.pressed = True
    front.present(frame, c)  # the press
    front.window.cursor = (0.3, 0.5)  # dragged right by a tenth of the window
    front.present(frame, c)
    assert c.orbit.azimuth == pytest.approx((azimuth - 18.0) % 360) and c.orbiting


# ---- drawing helpers ------------------------------------------------------------------------------------
def test_layout_loss_curve_and_text():
    for arrays in (False, True):
        layout = Layout((100, 60), arrays=arrays)
        h, w = layout.size
        rects = list(layout.panels.values()) + [layout.sidebar]
        for i, a in enumerate(rects):
            assert a.y >= 0 and a.x >= 0 and a.y + a.h <= h and a.x + a.w <= w
            for b in rects[i + 1:]:  # no overlaps
                assert a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
    curve = loss_curve_image(range(1, 101), np.geomspace(1.0, 1e-3, 100), 120, 300)
    assert curve.shape == (120, 300, 3) and curve.std() > 5
    assert loss_curve_image([1, 2], [float("nan"), 0.0], 50, 80).shape == (50, 80, 3)  # nothing plottable
    img = np.zeros((10, 40, 3), np.uint8)
    draw_text(img, "PSNR 1.5", 1, -3)  # clipped at the border, no error
    assert img.any()


def test_controller_status_and_finish():
    source, trainer, task = make_source(size=16, tiles=1, batch=256)
    c = ViewerController(source, max_steps=3)
    assert c.advance(10) == 3 and c.finished and c.advance(1) == 0
    c.flush()
    assert c.loss_steps == [1, 2, 3] and c.steps_per_second > 0
    assert c.network_loss is None  # a single network has no per-network panel
    assert any(line.startswith("step 3 / 3") for line in c.status_lines())


def test_a_run_clears_the_frames_of_an_earlier_run(tmp_path, monkeypatch):
    """out_dir holds one run's frames: an earlier run's frames, loss curve and summary are deleted at the start,
    other files (screenshots, the user's) stay."""
    monkeypatch.setenv("TINN_VIEWER_BACKEND", "png")
    for name in ("frame_000999.png", "loss_curve.png", "summary.json", "screenshot_000001_1.png", "notes.txt"):
        (tmp_path / name).write_text("earlier")
    logged = []
    source, _, _ = make_source(size=16)
    summary = Viewer(source, out_dir=str(tmp_path), headless=True, frame_every=2, log=logged.append).run(4)
    frames = sorted(p.name for p in tmp_path.glob("frame_*.png"))
    assert frames == sorted(os.path.basename(f) for f in summary["frames"]) == \
        ["frame_000000.png", "frame_000002.png", "frame_000004.png"]
    assert (tmp_path / "screenshot_000001_1.png").read_text() == "earlier"
    assert (tmp_path / "notes.txt").read_text() == "earlier"
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 4
    assert any("removed 3 frame/summary file(s) of an earlier run" in line for line in logged)
