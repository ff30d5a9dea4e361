"""The viewer loop: train through the controller, build frames, hand them to a front end.

Headless (or without a display) it trains in chunks of `frame_every` steps and saves a PNG
frame after each; with a window it trains for a short time budget per frame so the controls
stay responsive; with the web page (`serve`) it trains between page updates, in slices short
enough to answer a browser at once. All three show the panels of one `ViewModel`.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import time

import numpy as np

from . import render
from .controller import ViewerController
from .layout import Layout
from .model import ViewModel
from .offscreen import PngFrontend, write_png
from .window import GGUIFrontend, ViewerUnavailable, ggui_support, has_display, vulkan_installed

BACKEND_ENV = "TINN_VIEWER_BACKEND"  # "png": force the numpy fallback, "ggui": fail instead of falling back
FRAME_BUDGET_S = 1 / 30  # training time per displayed frame in window mode
ORBIT_DEGREES_PER_FRAME = 15.0  # headless: once round the scene in 24 saved frames


def open_frontend(layout: Layout, headless: bool, backend: str | None = None, title: str = "tinn viewer",
                  log=print, out_dir: str = ".", model: ViewModel | None = None, web: dict | None = None):
    """GGUI if it can run here, else the PNG fallback, saying why in one line (never a stack trace);
    backend="web" serves the page instead (`web`: WebFrontend's host, port, keep_open)."""
    backend = (backend or os.environ.get(BACKEND_ENV) or "auto").lower()
    if backend not in ("auto", "ggui", "png", "web"):
        raise ValueError(f"viewer backend {backend!r}; allowed: auto, ggui, png, web")
    if backend == "png":
        return PngFrontend(layout)
    if backend == "web":
        from .web import WebFrontend

        return WebFrontend(model, out_dir, title=title, log=log, **(web or {}))
    visible = not headless
    if visible and not has_display():
        # Checked up front: GLFW without a display ends the process instead of raising.
        log(f"tinn.viewer: no display (DISPLAY / WAYLAND_DISPLAY unset); running headless, frames in {out_dir}")
        visible = False
    installed, why = vulkan_installed()
    try:
        has_ggui, no_ggui = ggui_support()
        if not has_ggui:
            raise ViewerUnavailable(no_ggui)
        # A missing loader/driver is reported before Taichi tries (and prints its own RHI error);
        # backend="ggui" still tries, for setups this check cannot see.
        if not installed and backend != "ggui":
            raise ViewerUnavailable(why)
        return GGUIFrontend(layout, visible, title)
    except ViewerUnavailable as exc:
        if backend == "ggui":
            raise
        log(f"tinn.viewer: GGUI unavailable: {exc}; falling back to headless PNG frames in {out_dir}")
        return PngFrontend(layout)


RUN_FILES = ("frame_*.png", "loss_curve.png", "summary.json")  # what a run writes into its out_dir


def clear_earlier_run(out_dir: str) -> int:
    """Delete the frames, loss curve and summary an earlier run left in `out_dir` (so the folder holds one
    run's frames, not a mix); other files stay. Returns how many were deleted."""
    stale = [path for pattern in RUN_FILES for path in glob.glob(os.path.join(glob.escape(out_dir), pattern))]
    for path in stale:
        os.remove(path)
    return len(stale)


class Viewer:
    """Trains `source` (see `tinn.viewer.source`) while showing it; `run()` returns a summary dict."""

    def __init__(self, source, out_dir: str = "out/viewer", headless: bool = False, frame_every: int | None = None,
                 backend: str | None = None, zoom: float | None = None, title: str = "tinn viewer", log=print,
                 orbit_degrees_per_frame: float = ORBIT_DEGREES_PER_FRAME, web: dict | None = None):
        self.source, self.out_dir, self.frame_every, self.log = source, out_dir, frame_every, log
        # Headless runs of sources with `render_from` turn the camera this much between saved frames.
        self.orbit_degrees_per_frame = float(orbit_degrees_per_frame)
        os.makedirs(out_dir, exist_ok=True)
        removed = clear_earlier_run(out_dir)
        if removed:
            log(f"tinn.viewer: removed {removed} frame/summary file(s) of an earlier run from {out_dir}")
        self.controller = ViewerController(source, out_dir)
        self.model = ViewModel(source, self.controller)
        self.reference = self.model.reference
        self.layout = Layout(self.reference.shape[:2], arrays=self.model.arrays, zoom=zoom)
        self.frames: list[str] = []
        self.frontend = open_frontend(self.layout, headless, backend, title, log, out_dir, self.model, web)

    @property
    def backend(self) -> str:
        return self.frontend.kind

    # ---- frames -------------------------------------------------------------------------------
    def prediction(self) -> np.ndarray:
        """The held-out view as float (H, W, 3), see `ViewModel.prediction`."""
        return self.model.prediction()

    def shown(self) -> np.ndarray:
        """What the prediction panel shows, see `ViewModel.shown`."""
        return self.model.shown()

    def _psnr(self, prediction: np.ndarray) -> float:
        return self.model.psnr_of(prediction)

    def build_frame(self) -> np.ndarray:
        curve = self.layout.panels["loss_curve"]
        panels, titles = self.model.panels(*self.layout.panel_hw, curve_hw=(curve.h, curve.w))
        status = self.controller.status_lines() if self.frontend.text_status else None
        return render.compose(self.layout, panels, titles, status)

    def draw(self, save_to: str | None = None) -> np.ndarray:
        """Build and present a frame; write it to `save_to` and to any requested screenshots."""
        frame = self.build_frame()
        self.frontend.present(frame, self.controller)
        paths = ([save_to] if save_to else []) + self.controller.take_screenshot_requests()
        for i, path in enumerate(paths):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            if i == 0:
                self.frontend.save(path)
            else:  # one GGUI draw per presented frame: copy rather than render again
                shutil.copyfile(paths[0], path)
        return frame

    def save_frame(self, path: str | None = None) -> str:
        path = path or os.path.join(self.out_dir, f"frame_{self.controller.step:06d}.png")
        self.draw(save_to=path)
        self.frames.append(path)
        return path

    # ---- loops --------------------------------------------------------------------------------
    def run(self, steps: int | None = None) -> dict:
        c = self.controller
        c.max_steps = steps
        try:
            if self.frontend.kind == "web":
                self._run_web()
            elif self.frontend.visible:
                self._run_window()
            else:
                if steps is None:
                    raise ValueError("a headless viewer needs steps=")
                self._run_headless(self.frame_every or max(steps // 10, 1))
        finally:
            summary = self.finish()
        return summary

    def _run_headless(self, every: int) -> None:
        c = self.controller
        self.save_frame()
        while not c.finished and not c.quit_requested:
            if c.advance(every - c.step % every) == 0:
                break  # paused through the API: nobody can resume a headless run
            if c.step % every == 0 or c.finished:
                c.orbit_by(self.orbit_degrees_per_frame)  # the saved frames go round the scene
                self.save_frame()

    def _run_window(self) -> None:
        c = self.controller
        while self.frontend.running and not c.quit_requested:
            before = c.step
            c.advance(budget_s=FRAME_BUDGET_S)
            if c.finished and not c.paused:
                c.pause()
                c.max_steps = None  # resuming trains on past the requested steps
                c.message = f"reached {c.step} steps; resume to go on"
            every = self.frame_every
            if every and c.step // every > before // every:
                self.save_frame()
            else:
                self.draw()
            self.frontend.show()

    def _run_web(self) -> None:
        """Train and keep the page up to date; with keep_open the run pauses at the end instead of returning."""
        c, web = self.controller, self.frontend
        try:
            while not c.quit_requested:
                web.apply_commands()
                # Train in short slices so that a camera that starts moving or a control is answered at once; the
                # page updates when its share of the time has paid for it (`tinn.viewer.budget`).
                trained = 0
                while True:
                    step_trained = c.advance(budget_s=FRAME_BUDGET_S)
                    trained += step_trained
                    if not step_trained or c.quit_requested or web.update_due():
                        break
                if c.finished and not c.paused:
                    if not web.keep_open:
                        break
                    c.pause()
                    c.max_steps = None  # resuming trains on past the requested steps
                    c.message = f"reached {c.step} steps; resume to go on, Ctrl+C to stop"
                web.publish()
                if trained == 0:
                    time.sleep(0.02)  # paused: wait for the page without spinning
        except KeyboardInterrupt:
            self.log("tinn.viewer: interrupted; closing the page")
        self.model.prediction()  # the summary's PSNR is the last step's, watched or not

    def finish(self) -> dict:
        """Final loss-curve image and summary.json; closes the front end."""
        c = self.controller
        c.flush()
        curve_path = os.path.join(self.out_dir, "loss_curve.png")
        write_png(curve_path, render.standalone_loss_curve(c.loss_steps, c.losses))
        summary = {"backend": self.backend, "steps": c.step, "final_loss": c.loss, "final_psnr": c.psnr,
                   "steps_per_second": c.steps_per_second, "frames": list(self.frames), "loss_curve": curve_path,
                   "history": {"step": list(c.loss_steps), "loss": list(c.losses)}}
        if self.backend == "web":
            summary.update(url=self.frontend.url, snapshots=list(self.frontend.snapshots),
                           refused_messages=self.frontend.refused)
        with open(os.path.join(self.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        self.frontend.close()
        return summary


def run_viewer(trainer, task, steps: int | None = None, batch: int = 1 << 13, out_dir: str = "out/viewer",
               headless: bool = False, frame_every: int | None = None, backend: str | None = None,
               zoom: float | None = None, log=print, web: dict | None = None) -> dict:
    """Train an `ImageTask` with a `Trainer` in the viewer (`python -m tinn.viewer`); `web`: the web front end's
    host, port and keep_open when backend="web"."""
    from .source import ImageTrainerSource

    viewer = Viewer(ImageTrainerSource(trainer, task, batch), out_dir=out_dir, headless=headless,
                    frame_every=frame_every, backend=backend, zoom=zoom, log=log, web=web)
    where = "a web page" if viewer.backend == "web" else "a window" if viewer.frontend.visible else \
        f"PNG frames in {out_dir}"
    log(f"tinn.viewer: {viewer.backend} backend, {task.n_networks} network(s), showing {where}")
    return viewer.run(steps)


def serve(source, port: int = 8080, host: str = "127.0.0.1", steps: int | None = None, out_dir: str = "out/viewer",
          keep_open: bool = False, title: str = "tinn viewer", log=print, view_share: float | None = None) -> dict:
    """Train `source` (see `tinn.viewer.source`) while serving a page that shows and steers it, at
    http://host:port. Returns the summary once `steps` steps are done (or, with `keep_open` or no `steps`, when
    interrupted). host: 127.0.0.1 by default; any other interface lets whoever reaches the port steer training.
    view_share: at most about this share of the wall time goes to the page while a browser is connected
    (`tinn.viewer.budget`, default DEFAULT_VIEW_SHARE; ConfigError outside VIEW_SHARE_RANGE).
    """
    web = {"host": host, "port": port, "keep_open": keep_open or steps is None}
    if view_share is not None:
        web["view_share"] = view_share
    viewer = Viewer(source, out_dir=out_dir, backend="web", title=title, log=log, web=web)
    return viewer.run(steps)
