"""Scene folders users have: NeRF-synthetic (Blender), instant-ngp `transforms.json`, nerfstudio `transforms.json`.

`load_scene(path, split)` tells them apart and returns `PosedImages`. All three use camera-to-world matrices
in the OpenGL/Blender convention (camera looks down -z, +y up), which is tinn's (`tinn.render.rays`).

What `PosedImages` holds limits what loads: one pinhole camera for all frames, square pixels (fl_x = fl_y)
and the principal point at the image centre, no lens distortion. Anything else is refused with the field
that differs. A single `transforms.json` has no splits: every 8th frame (0, 8, 16, ...) is the held-out
"test" split, the others "train", as instant-ngp and nerfstudio evaluations commonly take them; "all" takes
every frame.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

from ...errors import InputError
from .posed_images import NERF_SYNTHETIC_BOX, PosedImages, _read_rgba, load_nerf_synthetic, stack_alpha

SPLITS = ("train", "test", "all")
HELD_OUT_EVERY = 8
DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")
NERFSTUDIO_MODELS = ("PINHOLE", "OPENCV", "SIMPLE_PINHOLE")


def detect_format(path) -> str:
    """"nerf_synthetic", "instant_ngp" or "nerfstudio" for a folder (or a transforms.json file)."""
    path = os.fspath(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "transforms_train.json")):
        return "nerf_synthetic"
    meta, _ = _read_json(path)
    if "camera_model" in meta or "applied_transform" in meta:
        return "nerfstudio"
    return "instant_ngp"


def load_scene(path, split: str = "train", downscale: int = 1, background=(1.0, 1.0, 1.0),
               max_views: int | None = None, box: float | None = None) -> PosedImages:
    """Posed images of `split` from any supported scene folder (see the module's notes)."""
    kind = detect_format(path)
    if kind == "nerf_synthetic":
        return load_nerf_synthetic(path, split=split if split != "all" else "train", downscale=downscale,
                                   background=background, max_views=max_views,
                                   **({} if box is None else {"box": box}))
    meta, file = _read_json(path)
    return _load_transforms(meta, file, kind, split, downscale, background, max_views, box)


def _read_json(path) -> tuple[dict, str]:
    path = os.fspath(path)
    file = os.path.join(path, "transforms.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise InputError(f"{path!r} holds neither transforms_train.json (NeRF-synthetic) nor transforms.json "
                         "(instant-ngp, nerfstudio)")
    with open(file) as f:
        try:
            meta = json.load(f)
        except json.JSONDecodeError as e:
            raise InputError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{file}: the top level must be an object, got {type(meta).__name__}")
    return meta, file


def _number(where: str, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: '{key}' must be a finite number, got {value!r}")
    return float(value)


def _intrinsics(meta: dict, where: str, width: int | None, height: int | None, kind: str) -> dict:
    """fl_x, fl_y, cx, cy, w, h of a frame or the top level (frame keys override the top level's)."""
    if kind == "nerfstudio" and "camera_model" in meta:
        model = meta["camera_model"]
        if model not in NERFSTUDIO_MODELS:
            raise InputError(f"{where}: camera_model {model!r} is not supported; allowed: {list(NERFSTUDIO_MODELS)} "
                             "(with zero distortion)")
    for key in DISTORTION_KEYS:
        if key in meta and _number(where, key, meta[key]) != 0.0:
            raise InputError(f"{where}: lens distortion '{key}'={meta[key]} is not supported; allowed: 0 "
                             "(undistort the images first)")
    w = int(_number(where, "w", meta["w"])) if "w" in meta else width
    h = int(_number(where, "h", meta["h"])) if "h" in meta else height
    if "fl_x" in meta:
        fx = _number(where, "fl_x", meta["fl_x"])
    elif "camera_angle_x" in meta and w:
        fx = 0.5 * w / math.tan(0.5 * _number(where, "camera_angle_x", meta["camera_angle_x"]))
    else:
        raise InputError(f"{where}: needs 'fl_x' (or 'camera_angle_x' with 'w')")
    fy = _number(where, "fl_y", meta["fl_y"]) if "fl_y" in meta else fx
    cx = _number(where, "cx", meta["cx"]) if "cx" in meta else None
    cy = _number(where, "cy", meta["cy"]) if "cy" in meta else None
    return {"fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "w": w, "h": h}


def _load_transforms(meta, file, kind, split, downscale, background, max_views, box) -> PosedImages:
    import imageio.v3 as iio

    if split not in SPLITS:
        raise InputError(f"split={split!r} is not supported for {file}; allowed: {list(SPLITS)}")
    frames = meta.get("frames")
    if not isinstance(frames, list) or not frames:
        raise InputError(f"{file}: 'frames' must be a non-empty list")
    downscale = int(downscale)
    if downscale < 1:
        raise InputError(f"downscale must be a positive integer, got {downscale}")
    top = {k: v for k, v in meta.items() if k != "frames"}
    chosen = [(k, fr) for k, fr in enumerate(frames)
              if split == "all" or (k % HELD_OUT_EVERY == 0) == (split == "test")]
    if max_views is not None:
        chosen = chosen[:int(max_views)]
    if not chosen:
        raise InputError(f"{file}: no frames in split {split!r} ({len(frames)} frames, every "
                         f"{HELD_OUT_EVERY}th held out)")
    bg = torch.tensor(background, dtype=torch.float32).reshape(3)
    folder = os.path.dirname(file)
    images, poses, cams, alphas = [], [], [], []
    for k, frame in chosen:
        where = f"{file}: frames[{k}]"
        if not isinstance(frame, dict):
            raise InputError(f"{where} must be an object")
        for key in ("file_path", "transform_matrix"):
            if key not in frame:
                raise InputError(f"{where} has no '{key}' field")
        image_path = _image_path(folder, frame["file_path"], where)
        pixels = np.asarray(iio.imread(image_path))
        cam = _intrinsics({**top, **{q: v for q, v in frame.items() if q not in ("file_path", "transform_matrix")}},
                          where, pixels.shape[1], pixels.shape[0], kind)
        if (cam["w"], cam["h"]) != (pixels.shape[1], pixels.shape[0]):
            raise InputError(f"{where}: {image_path} is {pixels.shape[1]}x{pixels.shape[0]} but w x h = "
                             f"{cam['w']}x{cam['h']}")
        rgb, alpha = _read_rgba(pixels, bg, downscale, image_path)
        images.append(rgb)
        alphas.append(alpha)
        try:
            pose = torch.tensor(frame["transform_matrix"], dtype=torch.float32)
        except (TypeError, ValueError):
            raise InputError(f"{where}: transform_matrix must be a 4x4 list of numbers") from None
        if pose.shape != (4, 4) or not torch.isfinite(pose).all():
            raise InputError(f"{where}: transform_matrix must be a finite 4x4 matrix, got shape {tuple(pose.shape)}")
        poses.append(pose)
        cams.append((where, cam))
    first_where, cam = cams[0]
    for where, other in cams[1:]:
        for key in ("fl_x", "fl_y", "cx", "cy", "w", "h"):
            if other[key] != cam[key] and not (other[key] is not None and cam[key] is not None
                                                and abs(other[key] - cam[key]) <= 1e-6 * abs(cam[key])):
                raise InputError(f"{where}: '{key}'={other[key]} differs from {first_where}'s {cam[key]}; "
                                 "supported: one camera for all frames")
    w, h = cam["w"], cam["h"]
    if abs(cam["fl_x"] - cam["fl_y"]) > 1e-3 * cam["fl_x"]:
        raise InputError(f"{file}: fl_x={cam['fl_x']} and fl_y={cam['fl_y']} differ; supported: square pixels")
    for key, centre in (("cx", w / 2), ("cy", h / 2)):
        if cam[key] is not None and abs(cam[key] - centre) > 0.5:
            raise InputError(f"{file}: {key}={cam[key]} is not the image centre {centre}; supported: a principal "
                             "point at the centre (within half a pixel)")
    c2w = torch.stack(poses)
    lo, hi = _box(top, file, kind, c2w, box)
    half_diag = float((hi - lo).norm()) / 2
    centre_dist = (c2w[:, :3, 3] - (lo + hi) / 2).norm(dim=1)
    near = max(0.0, float(centre_dist.min()) - half_diag)
    far = float(centre_dist.max()) + half_diag
    return PosedImages(images=torch.stack(images), c2w=c2w, focal=cam["fl_x"] / downscale,
                       width=images[0].shape[1], height=images[0].shape[0], near=near, far=max(far, near + 1e-3),
                       box_min=lo, box_max=hi, background=bg, alpha=stack_alpha(alphas))


def _image_path(folder: str, name, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: file_path must be a non-empty string, got {name!r}")
    path = os.path.join(folder, os.path.normpath(name))
    if os.path.splitext(path)[1]:
        candidates = [path]
    else:
        candidates = [path + ext for ext in (".png", ".jpg", ".jpeg", ".PNG", ".JPG")]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise InputError(f"{where}: file_path {name!r} names {candidates[0]}, which does not exist")


def _box(top: dict, file: str, kind: str, c2w: torch.Tensor, box: float | None):
    """The scene's bounding box in the frames' coordinates."""
    if box is not None:
        half = _number(file, "box", box)
        return torch.full((3,), -half), torch.full((3,), half)
    if kind == "instant_ngp" and ("aabb_scale" in top or "scale" in top or "offset" in top):
        # instant-ngp maps a point p to p * scale + offset and renders the cube of side aabb_scale around 0.5.
        a = _number(file, "aabb_scale", top.get("aabb_scale", 1))
        scale = _number(file, "scale", top.get("scale", 0.33))
        offset = torch.tensor(top.get("offset", [0.5, 0.5, 0.5]), dtype=torch.float32)
        if scale <= 0 or a <= 0 or offset.shape != (3,):
            raise InputError(f"{file}: need aabb_scale > 0, scale > 0 and a 3-vector offset")
        return (0.5 - a / 2 - offset) / scale, (0.5 + a / 2 - offset) / scale
    if kind == "instant_ngp":
        return torch.full((3,), -NERF_SYNTHETIC_BOX), torch.full((3,), NERF_SYNTHETIC_BOX)
    # nerfstudio's object captures: cameras around the scene, which fills about half their distance.
    half = 0.5 * float(c2w[:, :3, 3].norm(dim=1).mean())
    return torch.full((3,), -half), torch.full((3,), half)
