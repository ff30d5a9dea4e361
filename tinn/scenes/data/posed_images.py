"""Posed images (a scene's training data) and the NeRF-synthetic (Blender) loader."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from ...errors import InputError
from ...render.rays import camera_rays


@dataclass(eq=False)  # tensor fields: compare explicitly, not with ==
class PosedImages:
    """V images of one scene with their cameras (NeRF/Blender convention, see `tinn.render.rays`).

    images (V, H, W, 3) float32 in [0, 1], already composited on `background`; c2w (V, 4, 4) float32;
    focal in pixels; near/far bound the depths of interest; box_min/box_max (3,) is the scene's bounding box.
    alpha (V, H, W, 1) float32, the coverage of images read from RGBA files (None otherwise): with it a
    trainer can composite the same pixels on other backgrounds (`recomposited`).
    """

    images: torch.Tensor
    c2w: torch.Tensor
    focal: float
    width: int
    height: int
    near: float
    far: float
    box_min: torch.Tensor
    box_max: torch.Tensor
    background: torch.Tensor
    alpha: torch.Tensor | None = None

    def __post_init__(self):
        img = self.images
        if not isinstance(img, torch.Tensor) or img.dim() != 4 or img.shape[3] != 3:
            raise InputError(f"images must be a (V, H, W, 3) tensor, got "
                             f"{tuple(img.shape) if isinstance(img, torch.Tensor) else type(img).__name__}")
        if img.dtype != torch.float32:
            raise InputError(f"images has dtype {img.dtype}; allowed: torch.float32 in [0, 1]")
        if (img.shape[1], img.shape[2]) != (self.height, self.width):
            raise InputError(f"images are {img.shape[2]}x{img.shape[1]} (WxH) but width={self.width}, height={self.height}")
        if not isinstance(self.c2w, torch.Tensor) or tuple(self.c2w.shape) != (img.shape[0], 4, 4):
            raise InputError(f"c2w must have shape ({img.shape[0]}, 4, 4) (one pose per image), got "
                             f"{tuple(self.c2w.shape) if isinstance(self.c2w, torch.Tensor) else type(self.c2w).__name__}")
        for name in ("box_min", "box_max", "background"):
            v = getattr(self, name)
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != (3,):
                raise InputError(f"{name} must be a (3,) tensor, got {v!r}")
        if not self.focal > 0:
            raise InputError(f"focal must be positive (pixels), got {self.focal}")
        if not 0 <= self.near < self.far:
            raise InputError(f"need 0 <= near < far, got near={self.near}, far={self.far}")
        a = self.alpha
        if a is not None and (not isinstance(a, torch.Tensor) or tuple(a.shape) != tuple(img.shape[:3]) + (1,)):
            raise InputError(f"alpha must be None or a {tuple(img.shape[:3]) + (1,)} tensor (one coverage per pixel), "
                             f"got {tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__}")

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def device(self) -> torch.device:
        return self.images.device

    def to(self, device) -> "PosedImages":
        tensors = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                   if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **tensors)

    def rays(self, views=None):
        """origins, directions, colors (R, 3) of every pixel of the chosen views (all by default), view-major then
        row-major, as `tinn.render.camera_rays` orders them. views: an int, a sequence of ints or an index tensor."""
        idx = self._view_index(views)
        origins, directions = camera_rays(self.c2w[idx], self.width, self.height, self.focal)
        colors = self.images[idx].reshape(-1, 3)
        return origins, directions, colors

    def alphas(self, views=None) -> torch.Tensor | None:
        """(R, 1) coverage of the pixels `rays(views)` returns, in the same order (None without alpha)."""
        return None if self.alpha is None else self.alpha[self._view_index(views)].reshape(-1, 1)

    def _view_index(self, views) -> torch.Tensor:
        n = len(self)
        if views is None:
            return torch.arange(n, device=self.c2w.device)
        idx = torch.as_tensor(views, device=self.c2w.device).reshape(-1)
        if idx.dtype not in (torch.int32, torch.int64):
            raise InputError(f"views must be integers, got dtype {idx.dtype}")
        if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise InputError(f"views {idx.tolist()} out of range; allowed: 0 <= view < {n}")
        return idx.long()

    def downscaled(self, factor: int) -> "PosedImages":
        """Images averaged over factor x factor pixel blocks, focal / factor (the same cameras, one pyramid level
        coarser). Width and height must be divisible by factor, so the pixel grid stays centred on the same rays."""
        factor = int(factor)
        if factor < 1:
            raise InputError(f"factor must be a positive integer, got {factor}")
        if factor == 1:
            return replace(self)
        if self.width % factor or self.height % factor:
            raise InputError(f"width={self.width} and height={self.height} must be divisible by factor={factor}")
        return replace(self, images=area_downscale(self.images, factor), width=self.width // factor,
                       height=self.height // factor, focal=self.focal / factor,
                       alpha=None if self.alpha is None else area_downscale(self.alpha, factor))


def area_downscale(images: torch.Tensor, factor: int) -> torch.Tensor:
    """(V, H, W, C) -> (V, H / factor, W / factor, C): the mean of each factor x factor block."""
    v, h, w, c = images.shape
    return images.reshape(v, h // factor, factor, w // factor, factor, c).mean(dim=(2, 4))


# The Blender scenes fit in [-1.5, 1.5]^3 and their cameras sit 4 units from the origin; these are the usual bounds.
NERF_SYNTHETIC_BOX = 1.5
NERF_SYNTHETIC_NEAR, NERF_SYNTHETIC_FAR = 2.0, 6.0


def load_nerf_synthetic(root, split: str = "train", downscale: int = 1, background=(1.0, 1.0, 1.0),
                        max_views: int | None = None, *, box: float = NERF_SYNTHETIC_BOX,
                        near: float = NERF_SYNTHETIC_NEAR, far: float = NERF_SYNTHETIC_FAR) -> PosedImages:
    """Read a NeRF-synthetic (Blender) scene folder: `transforms_{split}.json` and its RGBA PNGs.

    The json holds camera_angle_x (horizontal field of view, radians) and frames[] with file_path (relative to
    root, with or without ".png") and transform_matrix (4x4 camera-to-world). RGBA is composited on `background`
    (alpha 1 = object); each image is area-downscaled by `downscale` while loading. focal = 0.5 W / tan(0.5
    camera_angle_x) at the loaded width. Returns CPU tensors (move them with `.to(device)`).
    """
    import imageio.v3 as iio

    root = os.fspath(root)
    path = os.path.join(root, f"transforms_{split}.json")
    if not os.path.isfile(path):
        found = sorted(f for f in os.listdir(root) if f.startswith("transforms_")) if os.path.isdir(root) else []
        raise InputError(f"{path} not found (split={split!r}); transforms files in {root!r}: {found or 'none'}")
    with open(path) as f:
        try:
            meta = json.load(f)
        except json.JSONDecodeError as e:
            raise InputError(f"{path} is not valid JSON: {e}") from None
    for key in ("camera_angle_x", "frames"):
        if key not in meta:
            raise InputError(f"{path} has no '{key}' field")
    frames = meta["frames"]
    if not isinstance(frames, list) or not frames:
        raise InputError(f"{path}: 'frames' must be a non-empty list")
    if max_views is not None:
        frames = frames[:int(max_views)]
    downscale = int(downscale)
    if downscale < 1:
        raise InputError(f"downscale must be a positive integer, got {downscale}")
    bg = torch.tensor(background, dtype=torch.float32).reshape(3)

    images, poses, alphas = [], [], []
    for k, frame in enumerate(frames):
        for key in ("file_path", "transform_matrix"):
            if key not in frame:
                raise InputError(f"{path}: frames[{k}] has no '{key}' field")
        image_path = os.path.join(root, os.path.normpath(frame["file_path"]))
        if not os.path.splitext(image_path)[1]:
            image_path += ".png"
        if not os.path.isfile(image_path):
            raise InputError(f"{path}: frames[{k}] names {image_path}, which does not exist")
        rgb, alpha = _read_rgba(iio.imread(image_path), bg, downscale, image_path)
        images.append(rgb)
        alphas.append(alpha)
        pose = torch.tensor(frame["transform_matrix"], dtype=torch.float32)
        if pose.shape != (4, 4):
            raise InputError(f"{path}: frames[{k}].transform_matrix must be 4x4, got {tuple(pose.shape)}")
        poses.append(pose)
    shapes = {tuple(im.shape) for im in images}
    if len(shapes) != 1:
        raise InputError(f"{path}: images have different sizes {sorted(shapes)}")
    height, width = images[0].shape[:2]
    focal = 0.5 * width / math.tan(0.5 * float(meta["camera_angle_x"]))
    return PosedImages(images=torch.stack(images), c2w=torch.stack(poses), focal=focal, width=width, height=height,
                       near=near, far=far, box_min=torch.full((3,), -float(box)), box_max=torch.full((3,), float(box)),
                       background=bg, alpha=stack_alpha(alphas))


def stack_alpha(alphas: list) -> torch.Tensor | None:
    """The images' coverage as one (V, H, W, 1) tensor when every image had an alpha channel, else None."""
    return torch.stack(alphas) if alphas and all(a is not None for a in alphas) else None


def _read_rgba(pixels: np.ndarray, background: torch.Tensor, downscale: int, name: str):
    """(`_read_rgb`'s image, its (H, W, 1) alpha area-downscaled, or None for an RGB file)."""
    rgb = _read_rgb(pixels, background, downscale, name)
    if pixels.ndim != 3 or pixels.shape[2] != 4:
        return rgb, None
    scale = 65535.0 if pixels.dtype == np.uint16 else 255.0 if pixels.dtype == np.uint8 else 1.0
    alpha = torch.from_numpy(pixels[..., 3:].astype(np.float32) / scale)
    return rgb, (area_downscale(alpha[None], downscale)[0] if downscale > 1 else alpha).contiguous()


def _read_rgb(pixels: np.ndarray, background: torch.Tensor, downscale: int, name: str) -> torch.Tensor:
    """(H, W, 3) float32 in [0, 1]: RGBA composited on background, then area-downscaled."""
    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
        raise InputError(f"{name}: expected an RGB or RGBA image, got array shape {pixels.shape}")
    if pixels.dtype == np.uint8:
        scale = 255.0
    elif pixels.dtype == np.uint16:
        scale = 65535.0
    else:
        scale = 1.0
    img = torch.from_numpy(pixels.astype(np.float32) / scale)
    if img.shape[2] == 4:
        alpha = img[..., 3:]
        img = img[..., :3] * alpha + background * (1.0 - alpha)
    h, w = img.shape[:2]
    if downscale > 1:
        if h % downscale or w % downscale:
            raise InputError(f"{name} is {w}x{h}: not divisible by downscale={downscale}")
        img = area_downscale(img[None], downscale)[0]
    return img.contiguous()
