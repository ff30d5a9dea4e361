"""The web front end: a page served with `viser` that any browser can open while training runs on a server.

    tinn.viewer.serve(source, port=8080, steps=2000)        # then open http://127.0.0.1:8080

Each browser gets its own camera: scene sources render from it (orbit with the left button, pan with the right,
fly with the keyboard); image sources are a plane it looks at (pan and zoom). While a browser is connected the
page takes at most about `view_share` of the wall time from training, its camera moving or at rest
(`tinn.viewer.budget`): renders adapt their resolution first, then come less often. The panels (reference, error
map and PSNR, per-network loss), the curves and the controls are shared by every browser.

Safety: everything a page sends arrives in viser's threads and is only checked and queued there; the training
thread applies it between steps. Camera values must be finite and in range, controls within their ranges, or
they are counted as refused and change nothing. No message names a file: snapshots go to a folder the server
picks. The server listens on 127.0.0.1 unless asked otherwise, and does not answer viser's share-link request
(a public tunnel to this server).
"""
from __future__ import annotations

import math
import os
import queue
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import runtime
from . import render
from .budget import DEFAULT_VIEW_SHARE, PANEL_PERIOD_S, PageSchedule, ViewState
from .controller import LR_SCALE_RANGE
from .model import ViewModel, image_plane_home

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
MOVING_FOR_S = 0.3  # the camera counts as moving this long after its last update
MAX_SIDE = 1024  # renders never exceed this many pixels per side
MAX_VIEWPORT = 8192  # larger viewport sizes from a page are refused
FOV_RANGE = (math.radians(1.0), math.radians(170.0))
POSITION_LIMIT = 1e6  # camera positions beyond this (world units) are refused
CURVE_POINTS = 600  # curves are thinned to this many points before they are sent
SNAPSHOT_DIR = "snapshots"


class WebUnavailable(RuntimeError):
    """viser is not installed; the message says how to get it."""


def viser_module():
    try:
        import viser
    except ImportError:
        raise WebUnavailable("the web viewer needs viser: pip install 'tinn[web]' (or pip install viser)") from None
    return viser


@dataclass
class BrowserCamera:
    """One browser's camera, as last checked: pose in the scenes' convention, vertical fov, viewport size."""
    c2w: torch.Tensor
    fov: float
    width: int
    height: int
    seq: int = 0  # bumped on every accepted update
    moved_at: float = 0.0
    view: ViewState = field(default_factory=ViewState)  # render resolutions and costs, kept across updates
    sent: tuple | None = None  # (parameters version, camera seq, at rest) of the last frame sent
    last_image: np.ndarray | None = field(default=None, repr=False)

    def moving(self, now: float) -> bool:
        return now - self.moved_at < MOVING_FOR_S


def finite_numbers(values, n: int) -> tuple[float, ...] | None:
    """`values` as `n` finite floats, or None (wrong length, not numbers, nan or inf)."""
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    if len(out) != n or not all(math.isfinite(v) for v in out):
        return None
    return out


def camera_from_browser(wxyz, position, fov, width, height) -> tuple[torch.Tensor, float, int, int] | None:
    """(c2w, fov, width, height) from a browser's camera message, or None if any value is out of range.

    viser's cameras follow OpenCV (+z forward, +y down); the scenes' convention looks down -z with +y up, so the
    camera's y and z axes flip.
    """
    q = finite_numbers(wxyz, 4)
    p = finite_numbers(position, 3)
    f = finite_numbers([fov], 1)
    if q is None or p is None or f is None:
        return None
    norm = math.sqrt(sum(v * v for v in q))
    if not 0.5 < norm < 2.0 or max(abs(v) for v in p) > POSITION_LIMIT or not FOV_RANGE[0] <= f[0] <= FOV_RANGE[1]:
        return None
    if isinstance(width, bool) or isinstance(height, bool):
        return None
    try:
        w, h = int(width), int(height)
    except (TypeError, ValueError, OverflowError):
        return None
    if w != width or h != height or not (1 <= w <= MAX_VIEWPORT and 1 <= h <= MAX_VIEWPORT):
        return None
    qw, qx, qy, qz = (v / norm for v in q)
    rot = torch.tensor([
        [1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - qw * qz), 2 * (qx * qz + qw * qy)],
        [2 * (qx * qy + qw * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - qw * qx)],
        [2 * (qx * qz - qw * qy), 2 * (qy * qz + qw * qx), 1 - 2 * (qx * qx + qy * qy)]], dtype=torch.float64)
    c2w = torch.eye(4, dtype=torch.float64)
    c2w[:3, :3] = rot @ torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64))
    c2w[:3, 3] = torch.tensor(p, dtype=torch.float64)
    return c2w.float(), f[0], w, h


def render_size(camera: BrowserCamera, scale: float) -> tuple[int, int]:
    """(width, height) of a render at `scale` of the viewport, at most MAX_SIDE per side, at least 8."""
    w, h = camera.width * scale, camera.height * scale
    shrink = min(1.0, MAX_SIDE / max(w, h))
    return max(8, round(w * shrink)), max(8, round(h * shrink))


def sync_device() -> None:
    """Wait for the device's queued work, on a GPU only (on the CPU a call's work is done when it returns):
    a page update's time must include the renders it launched and not the training launched before it."""
    if runtime.is_initialized() and runtime.arch() == "cuda":
        runtime.sync()


def thin(xs, ys, n: int = CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most `n` evenly spaced points of a curve, always keeping the last."""
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if xs.size > n:
        keep = np.unique(np.linspace(0, xs.size - 1, n).round().astype(np.int64))
        xs, ys = xs[keep], ys[keep]
    return xs, ys


class WebFrontend:
    """Serves the page; the viewer loop calls `apply_commands`, trains until `update_due`, then `publish`."""

    kind = "web"
    text_status = False
    visible = True
    running = True

    def __init__(self, model: ViewModel, out_dir: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 title: str = "tinn viewer", keep_open: bool = False, log=print,
                 view_share: float = DEFAULT_VIEW_SHARE, clock=None):
        self.schedule = PageSchedule(view_share, clock)  # checks view_share before anything is served
        viser = viser_module()
        self.model, self.controller, self.log, self.keep_open = model, model.controller, log, keep_open
        self.snapshot_dir = os.path.join(out_dir, SNAPSHOT_DIR)
        if host not in ("127.0.0.1", "localhost", "::1"):
            log(f"tinn.viewer: WARNING: listening on {host}: anyone who can reach port {port} can watch and steer "
                "this training run (pause it, change its learning rate, write snapshots)")
        self.server = viser.ViserServer(host=host, port=port, label=title, verbose=False)
        # viser lets any page ask for a public share tunnel (share.viser.studio) to this server: that would open
        # training to the internet from a click, so the request is not served.
        from viser import _messages
        self.server._websock_server.unregister_handler(_messages.ShareUrlRequest)
        self.host, self.port = host, self.server.get_port()
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{self.port}"
        self.commands: queue.Queue = queue.Queue()
        self.cameras: dict[int, BrowserCamera] = {}
        self.lock = threading.Lock()
        self.refused = 0  # messages from pages that were checked and dropped
        self.snapshots: list[str] = []
        self.frames_sent = 0
        self._panel_key = None
        self._build_page(title)
        log(f"tinn.viewer: serving {self.url} (from another machine: ssh -L {self.port}:127.0.0.1:{self.port} "
            f"<this server>, then open http://127.0.0.1:{self.port})")
        self.server.on_client_connect(self._on_connect)
        self.server.on_client_disconnect(self._on_disconnect)

    # ---- the page ---------------------------------------------------------------------------------
    def _build_page(self, title: str) -> None:
        from viser import uplot

        gui, c, m = self.server.gui, self.controller, self.model
        gui.configure_theme(control_width="large", dark_mode=True, show_logo=False, show_share_button=False)
        self.status = gui.add_markdown("starting")
        self.pause_button = gui.add_button("Pause")
        # Server-side assignments (a refused value set back) also call these: only a page's changes are queued.
        self.pause_button.on_click(lambda event: self._queue("toggle_pause"))
        self.snapshot_button = gui.add_button("Snapshot")
        self.snapshot_button.on_click(lambda event: self._queue("snapshot", event.client_id))
        self.home_button = gui.add_button("Home view")
        self.home_button.on_click(lambda event: self._queue("home", event.client_id))
        self.lr_slider = None
        if c.can("learning_rate"):
            lo, hi = (math.log10(v) for v in LR_SCALE_RANGE)
            self.lr_slider = gui.add_slider("log10 lr scale", min=lo, max=hi, step=0.05, initial_value=0.0)
            self.lr_slider.on_update(lambda event: event.client_id is not None and
                                    self._queue("lr_scale", event.target.value))
        self.lod_slider = None
        if c.can("level_of_detail"):
            lo, hi = m.source.lod_range
            self.lod_slider = gui.add_slider("level of detail", min=lo, max=hi, step=0.25,
                                             initial_value=float(m.source.level_of_detail))
            self.lod_slider.on_update(lambda event: event.client_id is not None and
                                     self._queue("lod", event.target.value))
        h, w = m.reference.shape[:2]
        self.panel_hw = self._panel_size(h, w)
        panels, titles = m.panels(*self.panel_hw)
        self.images = {}
        for name in ("error", "reference", "network_loss", "ownership"):
            if name in titles:
                image = panels.get(name)
                self.images[name] = gui.add_image(image if image is not None else np.zeros(self.panel_hw + (3,),
                                                                                            np.uint8),
                                                  label=titles[name], format="png")
        empty = (np.zeros(0), np.zeros(0))
        axis = uplot.Axis(stroke="#ccc", grid={"stroke": "#444"})
        self.loss_plot = gui.add_uplot(empty, (uplot.Series(label="step"), uplot.Series(label="loss",
                                                                                       stroke="#ffaa3c")),
                                       title="loss", scales={"y": uplot.Scale(distr=3)}, axes=(axis, axis),
                                       aspect=2.0)
        self.psnr_plot = gui.add_uplot(empty, (uplot.Series(label="step"), uplot.Series(label="PSNR dB",
                                                                                       stroke="#5ab4ff")),
                                       title="held-out PSNR", axes=(axis, axis), aspect=2.0)

    @staticmethod
    def _panel_size(h: int, w: int, side: int = 256) -> tuple[int, int]:
        """Panels are shown about `side` pixels wide: small images are enlarged by an integer, large ones shrunk."""
        zoom = max(1, side // max(h, w)) if max(h, w) < side else side / max(h, w)
        return max(1, round(h * zoom)), max(1, round(w * zoom))

    def _home_camera(self, client) -> None:
        """Point a browser's camera at the held-out view (scenes) or the whole image (image sources)."""
        cam = client.camera
        if self.model.is_scene:
            c2w, target = self.model.source.orbit_start()
            c2w = torch.as_tensor(c2w).detach().cpu().double()
            up, position = (0.0, 0.0, 1.0), tuple(float(v) for v in c2w[:3, 3])
            look_at = tuple(float(v) for v in torch.as_tensor(target).cpu().reshape(3))
        else:
            up, look_at = (0.0, 1.0, 0.0), (0.0, 0.0, 0.0)
            position = (0.0, 0.0, image_plane_home(self.model.reference.shape[:2], cam.fov))
        # viser moves the look-at point along with the position: the position goes first.
        with client.atomic():
            cam.up_direction = up
            cam.position = position
            cam.look_at = look_at

    def _on_connect(self, client) -> None:
        client.camera.on_update(self._on_camera)
        self._queue("home", client.client_id)  # the home pose comes from the source: the training thread asks

    def _on_disconnect(self, client) -> None:
        with self.lock:
            self.cameras.pop(client.client_id, None)

    def _on_camera(self, camera) -> None:
        """viser's thread: check the browser's camera and keep it, or count it as refused."""
        checked = camera_from_browser(camera.wxyz, camera.position, camera.fov, camera.image_width,
                                      camera.image_height)
        if checked is None:
            self._refuse()
            return
        c2w, fov, width, height = checked
        cid = camera.client.client_id
        with self.lock:
            old = self.cameras.get(cid)
            new = BrowserCamera(c2w, fov, width, height, seq=0 if old is None else old.seq + 1,
                                moved_at=self.schedule.clock(), view=ViewState() if old is None else old.view,
                                sent=None if old is None else old.sent,
                                last_image=None if old is None else old.last_image)
            self.cameras[cid] = new

    def _refuse(self) -> None:
        """Count a refused message. viser's thread (cameras) and the training thread (controls) both count, and
        `+=` on an attribute is a read and a write the other thread can fall between: under the lock."""
        with self.lock:
            self.refused += 1

    def _queue(self, action: str, value=None) -> None:
        """viser's thread: queue a control for the training thread (which checks its value)."""
        self.commands.put((action, value))

    # ---- the training thread's side ------------------------------------------------------------------
    def apply_commands(self) -> None:
        """Run the queued controls; values out of range are refused and the page's widget is set back."""
        c, start, ran = self.controller, self.schedule.clock(), False
        while True:
            try:
                action, value = self.commands.get_nowait()
            except queue.Empty:
                break
            ran = True
            if action == "toggle_pause":
                c.toggle_pause()
            elif action == "snapshot":
                self.snapshot(value)
            elif action == "home":
                client = self.server.get_clients().get(value)
                if client is not None:
                    self._home_camera(client)
            elif action == "lr_scale":  # the slider moves log10 of the scale
                lo, hi = (math.log10(v) for v in LR_SCALE_RANGE)
                ok = isinstance(value, float) and math.isfinite(value) and lo <= value <= hi and \
                    c.set_learning_rate_scale(min(max(10.0 ** value, LR_SCALE_RANGE[0]), LR_SCALE_RANGE[1]))
                if not ok:
                    self._refuse()
                    self.lr_slider.value = math.log10(c.learning_rate_scale)
            elif action == "lod":
                if not c.set_level_of_detail(value):
                    self._refuse()
                    self.lod_slider.value = c.level_of_detail
            self._panel_key = None  # show the effect at once
            self.schedule.panels_at = -math.inf
        if ran:  # page time too (a snapshot renders at full size)
            self.schedule.not_training(self.schedule.clock() - start)

    def moving(self) -> bool:
        now = self.schedule.clock()
        with self.lock:
            return any(cam.moving(now) for cam in self.cameras.values())

    def _training(self) -> bool:
        """Whether training runs, so that the page's time is taken from it (a paused run's page is free)."""
        c = self.controller
        return not (c.paused or c.finished)

    def _due_views(self, now: float, training: bool) -> list[tuple[int, BrowserCamera, bool]]:
        """(client id, camera, moving) of each camera that gets a frame in the next update."""
        version, due = self.controller.version, []
        with self.lock:
            cameras = list(self.cameras.items())
        for cid, cam in cameras:
            moving = cam.moving(now)
            changed = cam.sent != (version, cam.seq, not moving)
            settling = not moving and cam.sent is not None and not cam.sent[2]  # its first frame at rest
            if changed and (not training or settling or self.schedule.view_due(cam.view, moving, changed, now)
                            or self._answers_a_move(cam)):
                due.append((cid, cam, moving))
        return due

    @staticmethod
    def _answers_a_move(cam: BrowserCamera) -> bool:
        """A camera with no frame yet, or one that starts moving after a frame at rest, is answered at once (the
        budget pays it back later): interaction must not wait for the training's share."""
        return cam.sent is None or (cam.sent[2] and cam.sent[1] != cam.seq)

    def _panels_changed(self) -> bool:
        c = self.controller
        return (c.version, c.paused, c.message) != self._panel_key

    def update_due(self) -> bool:
        """Whether the loop should stop training for a page update now: a control is queued, a camera waits for
        its first answer, or the share has paid for what is due. With no browser: every PANEL_PERIOD_S (the
        losses are read back then)."""
        if not self.commands.empty():
            return True
        now = self.schedule.clock()
        if not self.server.get_clients():
            return now - self.schedule.panels_at >= PANEL_PERIOD_S
        training = self._training()
        views = self._due_views(now, training)
        if not training or any(self._answers_a_move(cam) for _, cam, _ in views):
            return True
        panels = self.schedule.panels_due(self._panels_changed(), now)
        if not views and not panels:
            return False
        return self.schedule.affords(self._expected_cost(views, panels), now)

    def _expected_cost(self, views, panels: bool) -> float:
        return sum(cam.view.cost(moving) for _, cam, moving in views) + (self.schedule.panel_cost if panels else 0.0)

    def publish(self) -> None:
        """Send what is due: each browser's render, then (at most every `schedule.panel_period()`) panels and
        curves; the update's time, device work included, is booked against the page's share."""
        c, schedule = self.controller, self.schedule
        clients = self.server.get_clients()
        c.network_loss_wanted = bool(clients)
        if not clients:
            schedule.reset()
            if schedule.clock() - schedule.panels_at >= PANEL_PERIOD_S:
                # Nobody watching: still read the losses back now and then, so they do not pile up on the device.
                c.flush()
                schedule.panels_at = schedule.clock()
            return
        training = self._training()
        schedule.not_training(c.take_network_loss_s())
        sync_device()  # what training queued belongs to training
        now = schedule.clock()
        views = self._due_views(now, training)
        panels = schedule.panels_due(self._panels_changed(), now)
        with self.lock:
            cameras = list(self.cameras.values())
        # Credit is saved up to one update of everything (cheap panel-only updates must not cap it below a frame).
        schedule.begin(training, sum(cam.view.cost(cam.moving(now)) for cam in cameras) + schedule.panel_cost)
        if panels:
            self._publish_panels()
        for cid, cam, moving in views:
            client = clients.get(cid)
            if client is not None:
                self._publish_view(cam, client, moving, len(views))
        sync_device()
        schedule.end(training)

    def _publish_view(self, cam: BrowserCamera, client, moving: bool, n_views: int) -> None:
        view = cam.view
        start = self.schedule.clock()
        image = self.render(cam, view.scale if moving else view.rest_scale)
        client.scene.set_background_image(image, format="jpeg", jpeg_quality=85)
        # The render ends with the image copied to the host, which waits for the device.
        self.schedule.view_sent(view, moving, self.schedule.clock() - start, n_views)
        cam.sent, cam.last_image = (self.controller.version, cam.seq, not moving), image
        self.frames_sent += 1

    def render(self, cam: BrowserCamera, scale: float = 1.0) -> np.ndarray:
        """uint8 (H, W, 3): the current model seen from a browser's camera at `scale` of its viewport."""
        width, height = render_size(cam, scale)
        focal = 0.5 * height / math.tan(cam.fov / 2)
        return render.quantize(self.model.render_camera(cam.c2w, width, height, focal))

    def _publish_panels(self) -> None:
        c, m = self.controller, self.model
        start = self.schedule.clock()
        self._panel_key = (c.version, c.paused, c.message)
        panels, titles = m.panels(*self.panel_hw)
        for name, handle in self.images.items():
            if panels.get(name) is not None and name != "reference":
                handle.image = panels[name]
            handle.label = titles[name]
        self.loss_plot.data = thin(c.loss_steps, c.losses)
        self.psnr_plot.data = thin(c.psnr_steps, c.psnrs)
        self.pause_button.label = "Resume" if c.paused else "Pause"
        self.status.content = "  \n".join(self.status_lines())
        self.schedule.panels_sent(self.schedule.clock() - start)

    def status_lines(self) -> list[str]:
        c = self.controller
        lines = [f"**step** {c.step}" + (f" / {c.max_steps}" if c.max_steps else "")]
        lines += [line for line in c.status_lines()[1:]]
        if self.refused:
            lines.append(f"refused messages: {self.refused}")
        if self.snapshots:
            lines.append(f"last snapshot: {os.path.basename(self.snapshots[-1])}")
        return lines

    def snapshot(self, client_id: int | None) -> str | None:
        """Save the browser's current view (full resolution) as PNG under the snapshot folder."""
        from .offscreen import write_png

        with self.lock:
            cam = self.cameras.get(client_id)
        image = render.quantize(self.model.prediction()) if cam is None else self.render(cam, 1.0)
        os.makedirs(self.snapshot_dir, exist_ok=True)
        path = os.path.join(self.snapshot_dir, f"snapshot_{self.controller.step:06d}_{len(self.snapshots) + 1}.png")
        write_png(path, image)
        self.snapshots.append(path)
        self.controller.message = f"saved {SNAPSHOT_DIR}/{os.path.basename(path)}"
        return path

    # ---- front-end protocol of the GGUI and PNG front ends --------------------------------------------
    def present(self, frame, controller) -> None:
        self.publish()

    def save(self, path: str) -> None:
        from .offscreen import write_png

        write_png(path, render.quantize(self.model.prediction()))

    def show(self) -> None:
        pass

    def close(self) -> None:
        self.server.stop()
