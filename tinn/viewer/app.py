"""The viewer loop: train through the controller, build frames, hand them to a front end.

One loop serves both modes. Headless (or without a display) it trains in chunks of
`frame_every` steps and saves a PNG frame after each; with a window it trains for a
short time budget per frame so the controls stay responsive.
"""
from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np

from . import render
from .controller import ViewerController
from .layout import Layout
from .offscreen import PngFrontend, write_png
from .window import GGUIFrontend, ViewerUnavailable, ggui_support, has_display, vulkan_installed

BACKEND_ENV = "TINN_VIEWER_BACKEND"  # "png": force the numpy fallback, "ggui": fail instead of falling back
FRAME_BUDGET_S = 1 / 30  # training time per displayed frame in window mode
ORBIT_DEGREES_PER_FRAME = 15.0  # headless: once round the scene in 24 saved frames


def open_frontend(layout: Layout, headless: bool, backend: str | None = None, title: str = "tinn viewer",
                  log=print, out_dir: str = "."):
    """GGUI if it can run here, else the PNG fallback, saying why in one line (never a stack trace)."""
    backend = (backend or os.environ.get(BACKEND_ENV) or "auto").lower()
    if backend not in ("auto", "ggui", "png"):
        raise ValueError(f"viewer backend {backend!r}; allowed: auto, ggui, png")
    if backend == "png":
        return PngFrontend(layout)
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


def _ids_numpy(ids) -> np.ndarray:
    if hasattr(ids, "detach"):
        ids = ids.detach().cpu().numpy()
    return np.asarray(ids).astype(np.int64)


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
                 orbit_degrees_per_frame: float = ORBIT_DEGREES_PER_FRAME):
        self.source, self.out_dir, self.frame_every, self.log = source, out_dir, frame_every, log
        # Headless runs of sources with `render_from` turn the camera this much between saved frames.
        self.orbit_degrees_per_frame = float(orbit_degrees_per_frame)
        os.makedirs(out_dir, exist_ok=True)
        removed = clear_earlier_run(out_dir)
        if removed:
            log(f"tinn.viewer: removed {removed} frame/summary file(s) of an earlier run from {out_dir}")
        self.controller = ViewerController(source, out_dir)
        self.reference = render.to_rgb(render.as_numpy(source.reference()))
        ids = source.ownership() if hasattr(source, "ownership") else None
        self.layout = Layout(self.reference.shape[:2], arrays=ids is not None, zoom=zoom)
        ph, pw = self.layout.panel_hw
        # Panels that never change are built once.
        self._ref_small = render.resize_nearest(self.reference, ph, pw)
        self._ref_panel = render.quantize(self._ref_small)
        self._ids_small = None if ids is None else render.resize_nearest(_ids_numpy(ids), ph, pw)
        self._own_panel = None if ids is None else render.ownership_image(self._ref_small, self._ids_small)
        self._n_networks = None if ids is None else int(_ids_numpy(ids).max()) + 1
        self._prediction = None
        self._prediction_version = -1
        self._orbit_view = None
        self._orbit_key = None
        self.frames: list[str] = []
        self.frontend = open_frontend(self.layout, headless, backend, title, log, out_dir)

    @property
    def backend(self) -> str:
        return self.frontend.kind

    # ---- frames -------------------------------------------------------------------------------
    def prediction(self) -> np.ndarray:
        """The source's current render as float (H, W, 3); re-rendered only after the parameters changed.

        This is the held-out view (the reference's): the error panel and PSNR always compare it.
        """
        c = self.controller
        if self._prediction_version != c.version:
            raw = self.source.render()
            self._prediction = render.to_rgb(render.as_numpy(raw))
            c.psnr = float(self.source.psnr(raw)) if c.can("psnr") else self._psnr(self._prediction)
            self._prediction_version = c.version
        return self._prediction

    def shown(self) -> np.ndarray:
        """What the prediction panel shows: the held-out view, or the orbit camera's once it moved away."""
        c = self.controller
        if not c.orbiting:
            return self.prediction()
        key = (c.version, c.camera_version)
        if self._orbit_key != key:
            self._orbit_view = render.to_rgb(render.as_numpy(self.source.render_from(c.orbit.c2w())))
            self._orbit_key = key
        return self._orbit_view

    def _psnr(self, prediction: np.ndarray) -> float:
        mse = float(np.mean((np.clip(prediction, 0, 1) - self.reference) ** 2))
        return float("inf") if mse == 0 else -10.0 * np.log10(mse)

    def build_frame(self) -> np.ndarray:
        c = self.controller
        c.flush()
        ph, pw = self.layout.panel_hw
        pred_small = render.resize_nearest(self.prediction(), ph, pw)
        # Away from the held-out view there is no ground truth: the reference, error and PSNR stay on the
        # held-out view (one more render per frame), the prediction panel shows the orbit camera.
        shown_small = render.resize_nearest(self.shown(), ph, pw) if c.orbiting else pred_small
        panels = {"prediction": render.quantize(shown_small), "reference": self._ref_panel,
                  "error": render.error_image(pred_small, self._ref_small), "ownership": self._own_panel}
        curve = self.layout.panels["loss_curve"]
        panels["loss_curve"] = render.loss_curve_image(c.loss_steps, c.losses, curve.h, curve.w)
        psnr = "-" if c.psnr is None else f"{c.psnr:.2f} DB"
        prediction_title = f"PREDICTION  STEP {c.step}" if not c.orbiting else \
            f"STEP {c.step} AZ {c.orbit.azimuth:.0f} EL {c.orbit.elevation:.0f}"
        titles = {"prediction": prediction_title, "reference": "REFERENCE",
                  "error": f"ERROR X{render.ERROR_GAIN:g}  PSNR {psnr}",
                  "loss_curve": "LOSS" + (f" {c.loss:.4g}" if c.loss is not None else "")}
        if self._ids_small is not None:
            titles["ownership"] = f"NETWORKS ({self._n_networks})"
            if c.network_loss is not None:
                image, caption = render.network_loss_image(c.network_loss.cpu().numpy(), self._ids_small)
                panels["network_loss"] = image
                titles["network_loss"] = f"LOSS/NETWORK {caption}"
            else:
                titles["network_loss"] = "LOSS/NETWORK"
        status = c.status_lines() if self.frontend.text_status else None
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
            if self.frontend.visible:
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

    def finish(self) -> dict:
        """Final loss-curve image and summary.json; closes the front end."""
        c = self.controller
        c.flush()
        curve_path = os.path.join(self.out_dir, "loss_curve.png")
        write_png(curve_path, render.standalone_loss_curve(c.loss_steps, c.losses))
        summary = {"backend": self.backend, "steps": c.step, "final_loss": c.loss, "final_psnr": c.psnr,
                   "steps_per_second": c.steps_per_second, "frames": list(self.frames), "loss_curve": curve_path,
                   "history": {"step": list(c.loss_steps), "loss": list(c.losses)}}
        with open(os.path.join(self.out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        self.frontend.close()
        return summary


def run_viewer(trainer, task, steps: int | None = None, batch: int = 1 << 13, out_dir: str = "out/viewer",
               headless: bool = False, frame_every: int | None = None, backend: str | None = None,
               zoom: float | None = None, log=print) -> dict:
    """Train an `ImageTask` with a `Trainer` in the viewer (the image demo's `--gui`)."""
    from .source import ImageTrainerSource

    viewer = Viewer(ImageTrainerSource(trainer, task, batch), out_dir=out_dir, headless=headless,
                    frame_every=frame_every, backend=backend, zoom=zoom, log=log)
    where = "a window" if viewer.frontend.visible else f"PNG frames in {out_dir}"
    log(f"tinn.viewer: {viewer.backend} backend, {task.n_networks} network(s), showing {where}")
    return viewer.run(steps)
