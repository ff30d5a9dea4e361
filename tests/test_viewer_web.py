"""The web viewer: camera maths against direct formulas, control checks, and the page in a real browser
(headless Chromium driven by playwright) while a small image task trains on the CPU."""
import asyncio
import importlib.util
import math
import os
import shutil
import threading
import time

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from tinn.tasks.image import ImageTask, default_image
from tinn.trainer import Trainer
from tinn.viewer import ImageTrainerSource, Viewer
from tinn.viewer.controller import LR_SCALE_RANGE, ViewerController
from tinn.viewer.model import image_plane
from tinn.viewer.web import camera_from_browser, render_size, BrowserCamera, thin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "out", "test_web_viewer")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CONFIG = {
    "loss": {"otype": "L2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15},
    "encoding": {"otype": "Frequency", "n_frequencies": 4},
    "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU"},
}


def make_source(size=48, tiles=2, batch=1024):
    task = ImageTask(default_image(size), tiles=tiles, seed=0)
    trainer = Trainer.from_config(CONFIG, 2, 3, n_networks=task.n_networks, seed=7)
    return ImageTrainerSource(trainer, task, batch), trainer, task


# ---- camera maths ---------------------------------------------------------------------------------
def test_browser_camera_flips_opencv_axes_into_the_scenes_convention():
    half = math.sqrt(0.5)
    # 90 degrees about world x: OpenCV's forward (+z) turns to world -y, its down (+y) to world +z.
    c2w, fov, w, h = camera_from_browser((half, half, 0.0, 0.0), (1.0, 2.0, 3.0), 1.0, 640, 480)
    forward_scenes = -c2w[:3, 2]  # the scenes' cameras look down -z
    up_scenes = c2w[:3, 1]
    assert torch.allclose(forward_scenes, torch.tensor([0.0, -1.0, 0.0]), atol=1e-6)
    assert torch.allclose(up_scenes, torch.tensor([0.0, 0.0, -1.0]), atol=1e-6)  # OpenCV down is +z here
    assert torch.allclose(c2w[:3, 3], torch.tensor([1.0, 2.0, 3.0]))
    assert (fov, w, h) == (1.0, 640, 480)
    assert torch.allclose(c2w[:3, :3] @ c2w[:3, :3].T, torch.eye(3), atol=1e-6)


@pytest.mark.parametrize("wxyz, position, fov, width, height", [
    ((float("nan"), 0, 0, 0), (0, 0, 1), 1.0, 100, 100),
    ((1, 0, 0, 0), (0, float("inf"), 1), 1.0, 100, 100),
    ((1, 0, 0), (0, 0, 1), 1.0, 100, 100),  # three numbers for a quaternion
    ((0, 0, 0, 0), (0, 0, 1), 1.0, 100, 100),  # no rotation at all
    ((1, 0, 0, 0), (0, 0, 1e9), 1.0, 100, 100),
    ((1, 0, 0, 0), (0, 0, 1), 0.0, 100, 100),
    ((1, 0, 0, 0), (0, 0, 1), float("nan"), 100, 100),
    ((1, 0, 0, 0), (0, 0, 1), 1.0, 0, 100),
    ((1, 0, 0, 0), (0, 0, 1), 1.0, 100, 10 ** 6),
    ((1, 0, 0, 0), (0, 0, 1), 1.0, 100.5, 100),
    ((1, 0, 0, 0), ("0", "0", "x"), 1.0, 100, 100),
])
def test_browser_camera_refuses_bad_values(wxyz, position, fov, width, height):
    assert camera_from_browser(wxyz, position, fov, width, height) is None


def test_image_plane_at_the_home_distance_shows_the_image_pixel_for_pixel():
    task = ImageTask(default_image(24), tiles=1, seed=0)
    n, fov = 24, 1.0
    focal = 0.5 * n / math.tan(fov / 2)
    c2w = torch.eye(4)
    c2w[2, 3] = focal / n  # the image, one unit high, fills the view exactly
    shown = image_plane(lambda xy: task.lookup(xy.to(task.image.device)), (n, n), c2w, n, n, focal)
    assert torch.allclose(shown, task.image.float().cpu(), atol=1e-4)
    # The source's render_points at the same camera: the held-out render, pixel for pixel.
    source, trainer, _ = make_source(size=n, tiles=2)
    for _ in range(3):
        source.train_step()
    shown = image_plane(source.render_points, (n, n), c2w, n, n, focal)
    assert torch.allclose(shown, source.render().float().cpu(), atol=1e-5)
    # Turned away from the plane: nothing but background.
    away = c2w.clone()
    away[:3, :3] = torch.diag(torch.tensor([1.0, -1.0, -1.0]))
    assert torch.all(image_plane(task.lookup, (n, n), away, 8, 8, focal) == 0.12)


def test_render_size_follows_the_viewport_within_limits():
    cam = BrowserCamera(torch.eye(4), 1.0, 2000, 1000)
    assert render_size(cam, 1.0) == (1024, 512)
    assert render_size(cam, 0.25) == (500, 250)
    assert render_size(BrowserCamera(torch.eye(4), 1.0, 10, 10), 0.1) == (8, 8)


def test_thin_keeps_the_first_and_last_points():
    xs, ys = thin(np.arange(10_000), np.arange(10_000) * 2.0, n=100)
    assert xs.size <= 100 and xs[0] == 0 and xs[-1] == 9999 and np.all(ys == 2 * xs)


# ---- controls --------------------------------------------------------------------------------------
class LodSource:
    lod_range = (-2.0, 2.0)

    def __init__(self):
        self.level_of_detail = 0.0
        self.learning_rate = 0.01

    def train_step(self):
        return 0.0

    def render(self):
        return np.zeros((4, 4, 3))

    def reference(self):
        return np.zeros((4, 4, 3))


class CountingLossSource(LodSource):
    """Counts the per-network-loss queries, which a source may pay for (the octree renders a view)."""

    def __init__(self):
        super().__init__()
        self.queries = 0

    def per_network_loss(self):
        self.queries += 1
        return torch.tensor([1.0, 3.0])


def test_per_network_loss_is_asked_for_only_while_a_front_end_shows_it():
    c = ViewerController(CountingLossSource())
    c.advance(3)
    assert c.source.queries == 3 and torch.equal(c.network_loss, torch.tensor([1.0, 3.0]))
    c.network_loss_wanted = False          # the web page with no browser connected
    c.advance(5)
    assert c.source.queries == 3 and c.step == 8


def test_image_source_computes_no_per_network_loss_while_nobody_watches(tmp_path, monkeypatch):
    import tinn.trainer as trainer_module

    per_network = []
    loss_result = trainer_module._loss_result

    def counting(loss, pred, targets, **kwargs):
        if kwargs.get("net_ids") is not None:
            per_network.append(1)
        return loss_result(loss, pred, targets, **kwargs)

    monkeypatch.setattr(trainer_module, "_loss_result", counting)
    source, trainer, task = make_source()
    c = ViewerController(source)
    c.advance(3)
    assert len(per_network) == 3 and c.network_loss.shape == (task.n_networks,)
    c.network_loss_wanted = False  # the web page with no browser connected
    c.advance(4)
    assert len(per_network) == 3 and source.per_network_loss() is None and c.step == 7
    c.network_loss_wanted = True
    c.advance(2)
    assert len(per_network) == 5
    if importlib.util.find_spec("viser") is not None:  # the page with no browser says so itself
        viewer = Viewer(source, out_dir=str(tmp_path), backend="web", web={"port": 0}, log=lambda *a: None)
        try:
            viewer.frontend.publish()
            viewer.controller.advance(3)
        finally:
            viewer.frontend.close()
        assert not viewer.controller.network_loss_wanted and len(per_network) == 5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0, 1e9, "2", True, None])
def test_learning_rate_scale_refuses_bad_values(bad):
    c = ViewerController(LodSource())
    assert not c.set_learning_rate_scale(bad)
    assert c.learning_rate == 0.01


def test_learning_rate_scale_multiplies_the_starting_rate():
    c = ViewerController(LodSource())
    assert c.set_learning_rate_scale(2.5)
    assert c.learning_rate == pytest.approx(0.025) and c.learning_rate_scale == pytest.approx(2.5)
    assert c.set_learning_rate_scale(LR_SCALE_RANGE[0])
    assert c.learning_rate == pytest.approx(0.01 * LR_SCALE_RANGE[0])


@pytest.mark.parametrize("bad", [float("nan"), -2.5, 2.01, "1", None])
def test_level_of_detail_refuses_values_out_of_range(bad):
    source = LodSource()
    c = ViewerController(source)
    version = c.version
    assert not c.set_level_of_detail(bad)
    assert source.level_of_detail == 0.0 and c.version == version
    assert c.set_level_of_detail(-1.5) and source.level_of_detail == -1.5 and c.version == version + 1


# ---- the page in a browser ------------------------------------------------------------------------
def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    try:
        import viser  # noqa: F401
    except ImportError:
        return "viser is not installed (pip install viser)"
    if CHROMIUM is None:
        return "no chromium on PATH (apt-get install chromium)"
    return None


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def page_step(page) -> int:
    import re

    match = re.search(r"step\s+(\d+)", page.inner_text("body"))
    return int(match.group(1)) if match else -1


def view_pixels(page, path) -> np.ndarray:
    """The rendered view's area of the page (left of the control panel), saved as an artifact."""
    page.screenshot(path=path, clip={"x": 0, "y": 160, "width": 560, "height": 520})
    return iio.imread(path)[..., :3].astype(np.int64)


def send_from_page(frontend, client_id, message, connection=None):
    """Deliver `message` as if the page had sent it: through viser's own handlers on its event loop."""
    server = frontend.server._websock_server
    target = connection if connection is not None else server
    future = asyncio.run_coroutine_threadsafe(target._handle_incoming_message(client_id, message),
                                              server._background_event_loop)
    future.result(timeout=10)


@pytest.mark.needs_package(_browser_missing() is None, str(_browser_missing()))
def test_page_in_a_browser_shows_and_steers_training(tmp_path):
    from playwright.sync_api import sync_playwright
    from viser import _messages

    os.makedirs(ARTIFACTS, exist_ok=True)
    source, trainer, task = make_source()
    viewer = Viewer(source, out_dir=str(tmp_path), backend="web", web={"port": 0, "keep_open": True})
    web, c = viewer.frontend, viewer.controller
    assert web.host == "127.0.0.1"
    results, errors = {}, []

    def shot(page, name):
        page.screenshot(path=os.path.join(ARTIFACTS, name))

    def browse():
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                    "--no-sandbox", "--use-gl=swiftshader", "--enable-unsafe-swiftshader"])
                page = browser.new_page(viewport={"width": 1000, "height": 700})
                start = time.monotonic()
                page.goto(web.url)
                wait_for(lambda: web.frames_sent > 0, 45, "the first frame")
                results["first_frame_s"] = time.monotonic() - start
                wait_for(lambda: len(web.cameras) == 1, 10, "the browser's camera")
                client_id = next(iter(web.cameras))
                notices = page.locator(".mantine-Notification-closeButton")  # viser's software-WebGL notice
                for i in range(notices.count()):
                    notices.nth(i).click()
                time.sleep(1.0)
                shot(page, "1_first_frame.png")

                # Curves gain points and the page's step counter moves while training runs.
                def last_points():  # the curves are thinned to a fixed count: their last step moves on
                    return tuple(plot.data[0][-1] if len(plot.data[0]) else -1
                                 for plot in (web.loss_plot, web.psnr_plot))

                points, page_steps = last_points(), page_step(page)
                wait_for(lambda: min(np.subtract(last_points(), points)) > 0 and page_step(page) > page_steps, 20,
                         "the loss and PSNR curves and the step counter to move")
                results["curve_points"] = (points, last_points())

                # Pause stops the step counter (on the server and on the page).
                page.get_by_role("button", name="Pause").click()
                wait_for(lambda: c.paused, 10, "pause")
                wait_for(lambda: "Resume" in page.inner_text("body"), 10, "the Resume label")
                paused_at = c.step
                time.sleep(1.5)
                assert c.step == paused_at and page_step(page) == paused_at
                shot(page, "2_paused.png")

                # A drag turns the camera; with training paused only the camera can change the view.
                cam = web.cameras[client_id]
                before = view_pixels(page, os.path.join(ARTIFACTS, "3_before_drag.png"))
                page.mouse.move(250, 400)
                page.mouse.down()
                for k in range(1, 11):
                    page.mouse.move(250 + 12 * k, 400 - 4 * k)
                page.mouse.up()
                wait_for(lambda: web.cameras[client_id].seq > cam.seq and web.cameras[client_id].sent is not None
                         and web.cameras[client_id].sent[1:] == (web.cameras[client_id].seq, True), 20,
                         "a full-resolution frame for the moved camera")
                time.sleep(1.0)
                after = view_pixels(page, os.path.join(ARTIFACTS, "4_after_drag.png"))
                results["drag_difference"] = float(np.abs(after - before).mean())
                assert results["drag_difference"] > 5.0

                # Snapshot: a PNG of this browser's view appears in the snapshot folder.
                page.get_by_role("button", name="Snapshot").click()
                wait_for(lambda: web.snapshots and os.path.exists(web.snapshots[-1]), 20, "the snapshot file")
                snap = iio.imread(web.snapshots[-1])
                view = web.cameras[client_id]
                assert snap.shape[:2] == render_size(view, 1.0)[::-1]
                assert os.path.dirname(web.snapshots[-1]) == os.path.join(str(tmp_path), "snapshots")

                # Bad input sent the way a page sends it: refused, nothing about training changes.
                lr, c2w, refused = c.learning_rate, web.cameras[client_id].c2w.clone(), web.refused
                client = web.server.get_clients()[client_id]
                bad_camera = _messages.ViewerCameraMessage(
                    wxyz=(float("nan"), 0.0, 0.0, 0.0), position=(0.0, float("inf"), 1.0), fov=1.0, near=0.01,
                    far=100.0, image_height=500, image_width=500, look_at=(0.0, 0.0, 0.0),
                    up_direction=(0.0, 1.0, 0.0))
                send_from_page(web, client_id, bad_camera, client._websock_connection)
                slider = web.lr_slider._impl.uuid
                for value in (1e9, float("nan"), -7.0):
                    send_from_page(web, client_id, _messages.GuiUpdateMessage(slider, {"value": value}))
                # viser hands an upload aimed at the slider to its callbacks as the slider's value.
                web._queue("lr_scale", b"file contents")
                send_from_page(web, client_id, _messages.ShareUrlRequest())  # a public tunnel: not served
                wait_for(lambda: web.refused >= refused + 5, 20, "five refusals")
                assert web.server._share_tunnel is None
                assert c.learning_rate == lr and torch.equal(web.cameras[client_id].c2w, c2w)
                assert web.lr_slider.value == 0.0  # set back on every page
                assert c.paused and c.step == paused_at

                # A second browser gets its own frames; closing it does not stop training.
                page.get_by_role("button", name="Resume").click()
                wait_for(lambda: not c.paused and c.step > paused_at, 10, "training to resume")
                second = browser.new_page(viewport={"width": 800, "height": 600})
                second.goto(web.url)
                wait_for(lambda: len(web.cameras) == 2 and all(v.sent for v in web.cameras.values()), 45,
                         "frames for both browsers")
                second.close()
                wait_for(lambda: len(web.cameras) == 1, 20, "the closed browser to leave")
                step = c.step
                wait_for(lambda: c.step > step, 10, "training after a browser closed")
                time.sleep(0.6)
                shot(page, "5_training.png")
                page.close()
                browser.close()
                step = c.step
                wait_for(lambda: c.step > step, 10, "training with no browser")
        except BaseException as exc:  # noqa: BLE001 - raised again on the test's thread
            errors.append(exc)
        finally:
            c.quit()

    thread = threading.Thread(target=browse)
    thread.start()
    summary = viewer.run(None)  # training stays on this thread: the page only queues what it asks for
    thread.join()
    if errors:
        raise errors[0]
    assert summary["backend"] == "web" and summary["steps"] == c.step > 0
    assert summary["refused_messages"] == web.refused >= 5 and summary["snapshots"] == web.snapshots
    assert all(b > a for a, b in zip(*results["curve_points"]))


# ---- scene demos behind --viewer web -------------------------------------------------------------------
@pytest.mark.needs_package(importlib.util.find_spec("viser") is not None, "the web viewer needs viser")
def test_octree_demo_serves_the_page_and_its_level_of_detail_control_changes_renders(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, os.path.join(ROOT, "demos"))
    import octree_lod

    sources = []
    init = octree_lod.OctreeSource.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        sources.append(self)

    monkeypatch.setattr(octree_lod.OctreeSource, "__init__", keep)
    s = octree_lod.run(["--small", "--res", "16", "--views", "6", "--test-views", "1", "--steps", "3",
                        "--pyramid-levels", "2", "--samples", "16", "--batch", "128", "--viewer", "web", "--port",
                        "0", "--out", str(tmp_path)])
    assert s["backend"] == "web" and s["steps"] == 3 and s["url"].startswith("http://127.0.0.1:")
    source = sources[0]
    t = source.test
    c2w = t.c2w[source.view]
    # The web cameras' render at the held-out size and focal is the orbit camera's.
    assert torch.equal(source.render_camera(c2w, t.width, t.height, t.focal), source.render_from(c2w))
    fine_nodes = source._frame()["first_node"].unique()
    trained_rule = source.field.lod_resolution
    c = ViewerController(source)
    assert c.set_level_of_detail(-3.0)
    coarse = source._frame()
    assert coarse["first_node"].unique().numel() < fine_nodes.numel()  # coarser levels: fewer, larger nodes
    assert source.field.lod_resolution == trained_rule  # the bias is for renders only: training's rule stays
    assert not c.set_level_of_detail(3.5) and source.level_of_detail == -3.0


def test_sources_without_per_network_loss_show_each_networks_held_out_error():
    class Owned(LodSource):
        def render(self):
            image = np.full((4, 4, 3), 0.5)
            image[:, 2:] = 0.2
            return image

        def ownership(self):
            return np.array([[0, 0, 1, 1]] * 4)

    from tinn.viewer.model import ViewModel

    source = Owned()
    model = ViewModel(source, ViewerController(source))
    # Reference zeros; network 0 owns the pixels predicted 0.5, network 1 those predicted 0.2.
    assert np.allclose(model.heldout_network_error(), [0.25, 0.04])
    panels, titles = model.panels(4, 4)
    assert panels["network_loss"] is not None and titles["network_loss"].startswith("HELD-OUT MSE/NETWORK")
