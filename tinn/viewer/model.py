"""What every viewer front end shows, written once: the panels, their titles, and renders from any camera.

The GGUI window and the PNG frames paste the panels into one frame (`render.compose`); the web page shows
each panel on its own and renders every browser's camera through `render_camera`. Renders are cached by
the controller's `version` (parameters) and the camera, so a front end may ask as often as it likes.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from . import render
from .controller import ViewerController


def ids_numpy(ids) -> np.ndarray:
    if hasattr(ids, "detach"):
        ids = ids.detach().cpu().numpy()
    return np.asarray(ids).astype(np.int64)


class ViewModel:
    """The source's images as panels: prediction, reference, error map + PSNR, ownership, per-network loss."""

    def __init__(self, source, controller: ViewerController):
        self.source, self.controller = source, controller
        self.reference = render.to_rgb(render.as_numpy(source.reference()))
        ids = source.ownership() if hasattr(source, "ownership") else None
        self.ids = None if ids is None else ids_numpy(ids)
        self.n_networks = None if self.ids is None else int(self.ids.max()) + 1
        self._prediction = None
        self._prediction_version = -1
        self._orbit_view = None
        self._orbit_key = None
        self._static: dict[tuple[int, int], dict] = {}  # per panel size: the panels that never change

    @property
    def arrays(self) -> bool:
        return self.ids is not None

    # ---- renders --------------------------------------------------------------------------------
    def prediction(self) -> np.ndarray:
        """The source's current render as float (H, W, 3); re-rendered only after the parameters changed.

        This is the held-out view (the reference's): the error panel and PSNR always compare it.
        """
        c = self.controller
        if self._prediction_version != c.version:
            raw = self.source.render()
            self._prediction = render.to_rgb(render.as_numpy(raw))
            c.record_psnr(float(self.source.psnr(raw)) if c.can("psnr") else self.psnr_of(self._prediction))
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

    def psnr_of(self, prediction: np.ndarray) -> float:
        mse = float(np.mean((np.clip(prediction, 0, 1) - self.reference) ** 2))
        return float("inf") if mse == 0 else -10.0 * np.log10(mse)

    @property
    def is_scene(self) -> bool:
        """Scene sources render from camera poses; image sources are shown as a plane in front of the camera."""
        return self.controller.can("render_from")

    def render_camera(self, c2w: torch.Tensor, width: int, height: int, focal: float) -> np.ndarray:
        """(height, width, 3) float image seen from `c2w` (scenes' convention, see `orbit`) with `focal` pixels.

        Scene sources render the pose (at their own size, resampled, when they lack `render_camera`); image
        sources are a plane (`image_plane`) the camera looks at.
        """
        c = self.controller
        if c.can("render_camera"):
            raw = self.source.render_camera(c2w, width, height, focal)
        elif c.can("render_from"):
            raw = render.resize_nearest(render.as_numpy(self.source.render_from(c2w)), height, width)
        elif c.can("render_points"):
            raw = image_plane(self.source.render_points, self.reference.shape[:2], c2w, width, height, focal)
        else:  # no camera at all: the held-out view, resampled
            raw = render.resize_nearest(self.prediction(), height, width)
        return render.to_rgb(render.as_numpy(raw))

    def heldout_network_error(self) -> np.ndarray:
        """(n_networks,) mean squared error of the held-out view over the pixels each network owns (0: none)."""
        err = np.mean((np.clip(self.prediction(), 0, 1) - self.reference) ** 2, axis=2).ravel()
        ids = self.ids.ravel()
        sums = np.bincount(ids, weights=err, minlength=self.n_networks)
        counts = np.bincount(ids, minlength=self.n_networks)
        return np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)

    # ---- panels -----------------------------------------------------------------------------------
    def static_panels(self, ph: int, pw: int) -> dict:
        """Reference (float and uint8), network ids and ownership tint at panel size; built once per size."""
        key = (ph, pw)
        if key not in self._static:
            ref_small = render.resize_nearest(self.reference, ph, pw)
            ids_small = None if self.ids is None else render.resize_nearest(self.ids, ph, pw)
            self._static[key] = {"reference_small": ref_small, "reference": render.quantize(ref_small),
                                 "ids": ids_small,
                                 "ownership": None if ids_small is None else render.ownership_image(ref_small,
                                                                                                   ids_small)}
        return self._static[key]

    def panels(self, ph: int, pw: int, curve_hw: tuple[int, int] | None = None) -> tuple[dict, dict]:
        """(uint8 panels by name, titles by name) at panel size (ph, pw); a loss-curve image if `curve_hw`."""
        c = self.controller
        c.flush()
        static = self.static_panels(ph, pw)
        pred_small = render.resize_nearest(self.prediction(), ph, pw)
        # Away from the held-out view there is no ground truth: the reference, error and PSNR stay on the
        # held-out view (one more render per frame), the prediction panel shows the orbit camera.
        shown_small = render.resize_nearest(self.shown(), ph, pw) if c.orbiting else pred_small
        panels = {"prediction": render.quantize(shown_small), "reference": static["reference"],
                  "error": render.error_image(pred_small, static["reference_small"]), "ownership": static["ownership"]}
        psnr = "-" if c.psnr is None else f"{c.psnr:.2f} DB"
        prediction_title = f"PREDICTION  STEP {c.step}" if not c.orbiting else \
            f"STEP {c.step} AZ {c.orbit.azimuth:.0f} EL {c.orbit.elevation:.0f}"
        titles = {"prediction": prediction_title, "reference": "REFERENCE",
                  "error": f"ERROR X{render.ERROR_GAIN:g}  PSNR {psnr}"}
        if curve_hw is not None:
            panels["loss_curve"] = render.loss_curve_image(c.loss_steps, c.losses, *curve_hw)
            titles["loss_curve"] = "LOSS" + (f" {c.loss:.4g}" if c.loss is not None else "")
        if static["ids"] is not None:
            titles["ownership"] = f"NETWORKS ({self.n_networks})"
            if c.network_loss is not None:
                image, caption = render.network_loss_image(c.network_loss.cpu().numpy(), static["ids"])
                panels["network_loss"] = image
                titles["network_loss"] = f"LOSS/NETWORK {caption}"
            else:  # scene sources train on rays, not per network: each network's error on the held-out view
                image, caption = render.network_loss_image(self.heldout_network_error(), static["ids"])
                panels["network_loss"] = image
                titles["network_loss"] = f"HELD-OUT MSE/NETWORK {caption}"
        return panels, titles


def image_plane(render_points, image_hw: tuple[int, int], c2w, width: int, height: int, focal: float,
                background: float = 0.12) -> torch.Tensor:
    """An image source seen by a camera: the image lies in the world's z = 0 plane, one unit high and centred on
    the origin, +x right and +y up; pixels whose ray misses it show `background`.

    `render_points(xy)` gives the prediction at image points xy in [0, 1]^2 (x right, y down), so zooming in
    shows the network between the training pixels rather than an upscaled render.
    """
    c2w = torch.as_tensor(c2w, dtype=torch.float64).cpu()
    aspect = image_hw[1] / image_hw[0]
    j = torch.arange(width, dtype=torch.float64) + 0.5
    i = torch.arange(height, dtype=torch.float64) + 0.5
    gi, gj = torch.meshgrid(i, j, indexing="ij")
    # Scenes' convention: the camera looks down -z, +y up in the image.
    d_cam = torch.stack([(gj - width / 2) / focal, -(gi - height / 2) / focal, -torch.ones_like(gi)], dim=-1)
    d = d_cam.reshape(-1, 3) @ c2w[:3, :3].T
    o = c2w[:3, 3]
    t = -o[2] / d[:, 2]  # rays parallel to the plane give inf or nan and count as misses
    hit = o + t[:, None] * d
    x = hit[:, 0] / aspect + 0.5
    y = 0.5 - hit[:, 1]
    inside = (t > 0) & torch.isfinite(t) & (x >= 0) & (x < 1) & (y >= 0) & (y < 1)
    out = torch.full((height * width, 3), background, dtype=torch.float32)
    if bool(inside.any()):
        xy = torch.stack([x[inside], y[inside]], dim=1).float()
        values = render.to_rgb(render.as_numpy(render_points(xy))[:, None])[:, 0]  # (N, C) -> (N, 3)
        out[inside] = torch.from_numpy(np.ascontiguousarray(values))
    return out.reshape(height, width, 3)


def image_plane_home(image_hw: tuple[int, int], fov_y: float, margin: float = 1.1) -> float:
    """Distance from the image plane at which a camera of vertical field of view `fov_y` (radians) sees the
    whole image with `margin` around it."""
    aspect = image_hw[1] / image_hw[0]
    return margin * 0.5 * max(1.0, aspect) / math.tan(fov_y / 2)
