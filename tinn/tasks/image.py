"""Learning an image: (x, y) in [0,1]^2 -> RGB, as in tcnn's mlp_learning_an_image.

In array mode the image is cut into `tiles x tiles` regions, each owned by its
own network; a sample is routed to the tile it falls in and sees coordinates
local to that tile.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import runtime
from ..errors import InputError
from ..kernels import image_sampling, triton_step_kernels


def _as_i32(value: int) -> int:
    """The low 32 bits of `value` as a signed int32 (the kernel reads them back as u32)."""
    value &= 0xFFFF_FFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def default_image(size: int = 256) -> np.ndarray:
    """A procedural test picture (float32 HxWx3 in [0,1]): smooth gradients, rings,
    a checkerboard, sharp discs and fine stripes, so both low and high frequencies matter."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float64) / size
    r = np.hypot(x - 0.5, y - 0.5)
    angle = np.arctan2(y - 0.5, x - 0.5)
    img = np.stack([0.5 + 0.5 * np.sin(6 * angle + 10 * r),
                    0.5 + 0.5 * np.cos(18 * r),
                    x * (1 - y)], axis=-1)
    checker = ((np.floor(x * 8) + np.floor(y * 8)) % 2)[..., None]
    img = np.where(((x < 0.35) & (y < 0.35))[..., None], 0.2 + 0.6 * checker * np.array([1.0, 0.8, 0.3]), img)
    for cx, cy, rad, col in [(0.75, 0.25, 0.12, (0.9, 0.1, 0.1)), (0.25, 0.75, 0.1, (0.1, 0.2, 0.9)),
                             (0.7, 0.72, 0.07, (1.0, 1.0, 0.2))]:
        disc = (np.hypot(x - cx, y - cy) < rad)[..., None]
        img = np.where(disc, np.array(col), img)
    stripes = (0.5 + 0.5 * np.sin(x * size * 0.9))[..., None]
    img = np.where(((y > 0.9) & (x > 0.5))[..., None], stripes * np.array([1.0, 1.0, 1.0]), img)
    return img.astype(np.float32)


def load_image(path: str) -> np.ndarray:
    """Any image imageio reads, as float32 HxWx3 in [0,1] (alpha dropped, gray expanded)."""
    import imageio.v3 as iio

    arr = np.asarray(iio.imread(path))
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=-1)
    if arr.ndim != 3 or arr.shape[2] < 3:
        raise InputError(f"image {path!r} has shape {arr.shape}; expected HxW, HxWx3 or HxWx4")
    arr = arr[..., :3]
    if np.issubdtype(arr.dtype, np.integer):
        arr = arr.astype(np.float32) / np.iinfo(arr.dtype).max
    return np.clip(arr.astype(np.float32), 0.0, 1.0)


def save_png(path: str, image: torch.Tensor) -> None:
    """Write an (H, W, C) float image in [0,1] as an 8-bit PNG (clipped, rounded)."""
    import imageio.v3 as iio

    arr = (np.clip(image.detach().cpu().numpy(), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    iio.imwrite(path, arr)


def psnr(pred: torch.Tensor, ref: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB of images in [0, 1] (prediction clamped); shared by every demo."""
    if pred.shape != ref.shape:
        raise InputError(f"prediction {tuple(pred.shape)} and reference {tuple(ref.shape)} differ in shape")
    error = pred.detach().float().clamp(0, 1) - ref.detach().float().to(pred.device)
    return psnr_from_mse(float((error ** 2).mean()))


def psnr_from_mse(mse: float) -> float:
    """PSNR in dB of a mean squared error of images in [0, 1] (inf for 0): for errors pooled over several images."""
    return float("inf") if mse == 0 else -10.0 * math.log10(mse)


class ImageTask:
    def __init__(self, image: np.ndarray, tiles: int = 1, seed: int = 0):
        if tiles < 1:
            raise InputError(f"tiles={tiles} must be >= 1")
        self.device = runtime.device()
        self.image = torch.from_numpy(np.ascontiguousarray(image)).to(self.device)  # (H, W, 3)
        self.height, self.width = self.image.shape[:2]
        self.tiles = tiles
        # Batches come from a stateless hash of (seed, step, sample): a 32-bit seed (a 64-bit one folded in)
        # and a step counter.
        seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        self.seed = (seed ^ ((seed >> 32) * 0x9E3779B1)) & 0xFFFF_FFFF
        self.step = 0
        self._image_f32 = self.image.float().contiguous()  # the sampling kernel's view (no copy if float32)
        self._no_xy = torch.empty(1, 2, dtype=torch.float32, device=self.device)
        ys = (torch.arange(self.height, device=self.device) + 0.5) / self.height
        xs = (torch.arange(self.width, device=self.device) + 0.5) / self.width
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        self.pixel_xy = torch.stack([gx, gy], dim=-1).reshape(-1, 2).contiguous()

    @property
    def n_networks(self) -> int:
        return self.tiles * self.tiles

    def lookup(self, xy: torch.Tensor) -> torch.Tensor:
        """Bilinear image lookup at continuous xy in [0,1]^2 (pixel centres at (i+0.5)/W)."""
        px = (xy[:, 0] * self.width - 0.5).clamp(0, self.width - 1)
        py = (xy[:, 1] * self.height - 0.5).clamp(0, self.height - 1)
        x0 = px.floor().long().clamp(max=self.width - 2) if self.width > 1 else px.long()
        y0 = py.floor().long().clamp(max=self.height - 2) if self.height > 1 else py.long()
        x1 = (x0 + 1).clamp(max=self.width - 1)
        y1 = (y0 + 1).clamp(max=self.height - 1)
        fx = (px - x0).unsqueeze(1)
        fy = (py - y0).unsqueeze(1)
        im = self.image
        top = im[y0, x0] * (1 - fx) + im[y0, x1] * fx
        bottom = im[y1, x0] * (1 - fx) + im[y1, x1] * fx
        return (top * (1 - fy) + bottom * fy).contiguous()

    def route(self, xy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(local coordinates, tile ids): each tile's network sees its own [0,1]^2."""
        if self.tiles == 1:
            return xy, torch.zeros(xy.shape[0], dtype=torch.int32, device=xy.device)
        scaled = xy * self.tiles
        cell = scaled.floor().clamp(0, self.tiles - 1)
        local = (scaled - cell).contiguous()
        ids = (cell[:, 1] * self.tiles + cell[:, 0]).to(torch.int32)
        return local, ids

    def batch(self, size: int, *, return_xy: bool = False):
        """Random training batch: (inputs, targets, net_ids), plus the global xy if `return_xy`.

        One kernel launch: uniform xy in [0,1)^2 from a hash of (seed, step, sample), routed as
        `route` and looked up as `lookup` do. Each call advances the step, so consecutive batches
        differ; a task built with the same seed repeats the same batches. Outputs are new tensors.
        """
        size = int(size)
        if size < 0:
            raise InputError(f"batch size {size} must be >= 0")
        step = self.step
        self.step += 1
        dev = self.device
        local = torch.empty(size, 2, dtype=torch.float32, device=dev)
        targets = torch.empty(size, self._image_f32.shape[2], dtype=torch.float32, device=dev)
        ids = torch.empty(size, dtype=torch.int32, device=dev)
        xy = torch.empty(size, 2, dtype=torch.float32, device=dev) if return_xy else self._no_xy
        if size > 0:
            sampler = image_sampling.sample_image_batch
            if triton_step_kernels(dev):  # one Triton launch on the torch stream (kernels/image_sampling_triton.py)
                from ..kernels import image_sampling_triton
                sampler = image_sampling_triton.sample_image_batch
            sampler(self._image_f32, _as_i32(self.seed), _as_i32(step), self.tiles, local, targets, ids, xy,
                    int(return_xy))
        return (local, targets, ids, xy) if return_xy else (local, targets, ids)

    def render(self, model, chunk: int = 1 << 18) -> torch.Tensor:
        """The model's prediction at every pixel centre, (H, W, 3)."""
        outs = []
        with torch.no_grad():
            for start in range(0, self.pixel_xy.shape[0], chunk):
                local, ids = self.route(self.pixel_xy[start:start + chunk])
                outs.append(model(local, ids if self.tiles > 1 else None))
        return torch.cat(outs).reshape(self.height, self.width, -1)

    def pixel_net_ids(self) -> torch.Tensor:
        """(H, W) map of which network owns each pixel."""
        return self.route(self.pixel_xy)[1].reshape(self.height, self.width)

    def psnr(self, prediction: torch.Tensor) -> float:
        return psnr(prediction, self.image)
