"""What the viewer trains and shows: a "source".

A source is any object with

    train_step() -> loss         one optimisation step; a float or 0-d tensor (not synced here)
    render() -> (H, W, C)        the current prediction as an image-like array, values in [0, 1]
    reference() -> (H, W, C)     what the prediction should look like (same size)

and, optionally (the viewer hides the matching panel or control when one is missing),

    ownership() -> (H, W) ints   which network owns each pixel (network arrays)
    per_network_loss() -> (n,)   each network's loss at the last step
    want_network_loss(flag)      told whether anyone shows the per-network loss (the web page with no browser
                                 connected does not): a source that computes it in every step can stop
    learning_rate                read/write attribute
    reset()                      back to the initial parameters and optimizer state
    save_checkpoint(path)
    psnr(prediction) -> float    else the viewer computes PSNR against reference()
    render_from(c2w) -> (H, W, C) the prediction seen from another camera (scene sources): a (4, 4)
                                 camera-to-world matrix in the scenes' convention (`tinn.render.camera_rays`);
                                 with it the viewer orbits the camera, and the source also needs
    orbit_start() -> (c2w, target) the pose render() shows and the point the orbit turns around
    render_camera(c2w, width, height, focal) -> (height, width, C)
                                 render_from at any size (the web viewer adapts the resolution)
    render_points(xy) -> (N, C)  image sources: the prediction at points xy in [0,1]^2 (x right, y down);
                                 the web viewer shows the image as a plane the browser's camera looks at
    level_of_detail, lod_range   read/write float and its (low, high): a render-only level-of-detail bias

Scene demos write their own source; `ImageTrainerSource` adapts `ImageTask` + `Trainer`.
"""
from __future__ import annotations

import os

import torch

from ..trainer import TrainerControls

OPTIONAL = ("ownership", "per_network_loss", "want_network_loss", "learning_rate", "reset", "save_checkpoint", "psnr",
            "render_from", "render_camera", "render_points", "level_of_detail")


class ImageTrainerSource(TrainerControls):
    """`ImageTask` + `Trainer` as a viewer source: random batches of `batch` pixels per step."""

    def __init__(self, trainer, task, batch: int = 1 << 13):
        self.trainer, self.task, self.batch = trainer, task, int(batch)
        self.arrays = task.n_networks > 1
        if self.arrays:
            trainer.track_per_network_loss = True
        self._ownership = task.pixel_net_ids() if self.arrays else None

    def train_step(self) -> torch.Tensor:
        return self.trainer.training_step(*self.task.batch(self.batch))

    def render(self) -> torch.Tensor:
        return self.task.render(self.trainer.model)

    def reference(self) -> torch.Tensor:
        return self.task.image

    def ownership(self) -> torch.Tensor | None:
        return self._ownership

    def per_network_loss(self) -> torch.Tensor | None:
        return self.trainer.per_network_loss if self.trainer.track_per_network_loss else None

    def want_network_loss(self, wanted: bool) -> None:
        """The trainer computes each network's loss in its step (off its fused loss path) only while shown."""
        self.trainer.track_per_network_loss = self.arrays and bool(wanted)

    def reset(self, seed: int | None = None) -> None:
        """Back to the starting parameters; with `seed`, re-draw network weights from that seed instead.

        The learning rate the user set is kept: it is a viewer control, not trained state.
        """
        lr = self.learning_rate
        self.trainer.reset(seed)
        self.learning_rate = lr

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        self.trainer.save_checkpoint(path)

    def psnr(self, prediction) -> float:
        return self.task.psnr(prediction)

    def render_points(self, xy: torch.Tensor) -> torch.Tensor:
        """The model's prediction at image points `xy` (N, 2) in [0, 1]^2."""
        with torch.no_grad():
            local, ids = self.task.route(xy.to(self.task.device).float().contiguous())
            return self.trainer.model(local, ids if self.arrays else None)
