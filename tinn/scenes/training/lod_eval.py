"""Judging every level of detail against what a viewer at its distance should see.

A camera pulled back by a factor f sees the scene f times smaller: each pixel covers f times more of the
surface, and the right image is the scene averaged over each pixel's area (a box filter), not a point sample
of it. The ground truth at distance f is therefore rendered with `supersample` x `supersample` point samples
per pixel and area-averaged down (`area_filtered`); the octree's render from the same pose selects the coarser
nodes its level rule gives that footprint, and the two are compared on the window where the object lies
(the central W / f x H / f pixels: elsewhere both show background and would inflate the PSNR).

`lod_curve(field, truth, c2w, ...)` renders the field and the truth at each distance factor and reports the
distance, the depth the rule picks for a sample at the scene centre, the PSNR on the object's window (pooled
over the poses given) and the share of parameters the frames touched.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ...errors import InputError
from ...render import camera_rays, pixel_radius
from ...tasks.image import psnr_from_mse
from ..data.posed_images import area_downscale
from ..acceleration.octree import levels_for_radius


def area_filtered(render_point_samples: Callable[[int, int, float], torch.Tensor], width: int, height: int,
                  focal: float, supersample: int) -> torch.Tensor:
    """(H, W, C): `render_point_samples(width * s, height * s, focal * s)` (one sample per fine pixel, the same
    camera) averaged over s x s blocks, i.e. each pixel's area average up to the fine sampling."""
    s = int(supersample)
    if s < 1:
        raise InputError(f"supersample={supersample!r} must be an integer >= 1")
    fine = render_point_samples(width * s, height * s, focal * s)
    if tuple(fine.shape[:2]) != (height * s, width * s):
        raise InputError(f"the point-sample render is {tuple(fine.shape[:2])}, expected {(height * s, width * s)}")
    return area_downscale(fine[None], s)[0]


def pulled_back(c2w: torch.Tensor, factor: float, target: torch.Tensor | None = None) -> torch.Tensor:
    """The camera moved away from `target` (default the origin) along its line of sight, `factor` times as far."""
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise InputError(f"factor={factor!r} must be a finite number > 0")
    out = c2w.clone()
    centre = torch.zeros(3, dtype=c2w.dtype, device=c2w.device) if target is None else target.to(c2w)
    out[:3, 3] = centre + (c2w[:3, 3] - centre) * factor
    return out


def central_window(image: torch.Tensor, factor: float) -> torch.Tensor:
    """The central ceil(W / factor) x ceil(H / factor) pixels (at least 1 x 1): where an object that filled the
    frame lies once the camera is `factor` times as far."""
    h, w = image.shape[:2]
    wh, ww = max(1, min(h, math.ceil(h / factor))), max(1, min(w, math.ceil(w / factor)))
    top, left = (h - wh) // 2, (w - ww) // 2
    return image[top:top + wh, left:left + ww]


def window_psnr(pred: torch.Tensor, truth: torch.Tensor, factor: float) -> float:
    return psnr_from_mse(float(((central_window(pred, factor) - central_window(truth, factor)) ** 2).mean()))


def mesh_truth(mesh, background: torch.Tensor, supersample: int = 4, **render_options):
    """Ground truth of a mesh scene from any camera: `truth(c2w, width, height, focal)` -> (H, W, 3), the mesh
    (normalised as the scene folders are) area-filtered over `supersample`^2 samples per pixel and composited on
    `background`."""
    from ..data.mesh import corner_normals, render_rgba

    mesh = mesh.normalised()
    normals = corner_normals(mesh) if render_options.get("shading", "smooth") == "smooth" else None
    bg = torch.as_tensor(background, dtype=torch.float32).reshape(3)

    def truth(c2w, width, height, focal):
        pose = torch.as_tensor(c2w, dtype=torch.float64).cpu().numpy()
        rgba = render_rgba(mesh, pose, width, height, focal, supersample=supersample, normals=normals,
                           **render_options)
        a = rgba[..., 3:]
        return rgba[..., :3] * a + (1 - a) * bg.to(rgba.device)

    return truth


def procedural_truth(scene, background: torch.Tensor | None = None, supersample: int = 4, n_samples: int = 256):
    """Ground truth of a `ProceduralScene` from any camera, area-filtered over `supersample`^2 rays per pixel."""
    from ..data.procedural import _render_rays

    def truth(c2w, width, height, focal):
        dev = c2w.device
        bg = (scene.background if background is None else torch.as_tensor(background)).float().to(dev)

        def points(w, h, f):
            origins, dirs = camera_rays(c2w.float(), w, h, f)
            out = torch.empty(origins.shape[0], 3, device=dev)
            for r0 in range(0, origins.shape[0], 1 << 13):
                out[r0:r0 + (1 << 13)] = _render_rays(scene, origins[r0:r0 + (1 << 13)], dirs[r0:r0 + (1 << 13)],
                                                      scene.box_min.to(dev), scene.box_max.to(dev), n_samples, bg)
            return out.view(h, w, 3)

        return area_filtered(points, width, height, focal, supersample)

    return truth


@torch.no_grad()
def lod_curve(field, truth, c2w: torch.Tensor, width: int, height: int, focal: float, n_samples: int,
              factors=(1, 2, 4, 8), background: torch.Tensor | None = None, on_frame: Callable | None = None,
              **render) -> list[dict]:
    """One row per distance factor: distance, the depth the rule picks at the scene centre, the octree's PSNR
    against the area-filtered truth on the object's window, and the parameters the frame touched.

    `c2w`: one pose (4, 4) or several (V, 4, 4); with several, each is pulled back alike and the PSNR is that of
    their mean squared error (as `evaluate` pools its views), `psnr_per_view` lists each, the touched shares
    are means and `params_touched` / `nodes_touched_per_depth` the most any view touched. Views at several
    distances (a capture on rings of several radii) each have their own: `distances` and `levels` list them per
    view, and `distance` / `level` are the nearest view's and the deepest, as the most touched. One view's PSNR can
    differ from another's by more than the 1 dB a level is judged by (2-3 dB on the meshes' held-out views).
    `on_frame(factor, view, pred_window, truth_window)`: called with each rendered window (diagnostics)."""
    tree = field.octree
    centre = (tree.box_min + tree.box_max) / 2
    poses = c2w.reshape(-1, 4, 4)
    if poses.shape[0] == 0:
        raise InputError("lod_curve needs at least one pose; c2w has none")
    rows = []
    for factor in factors:
        errors, views_psnr, reports, distances, supersample = [], [], [], [], None
        for v, base in enumerate(poses):
            pose = pulled_back(base, float(factor), centre)
            distances.append(float((pose[:3, 3] - centre.to(pose)).norm()))
            frame = field.render_image(pose, width, height, focal, n_samples, background=background, **render)
            pred = central_window(frame["image"], float(factor))
            target = central_window(truth(pose, width, height, focal).to(pred.device), float(factor))
            err = float(((pred - target) ** 2).mean())
            errors.append(err)
            views_psnr.append(psnr_from_mse(err))
            reports.append(field.touched_report(frame["touched"]))
            supersample = frame["supersample"]
            if on_frame is not None:
                on_frame(float(factor), v, pred, target)
        radius = torch.tensor([d * pixel_radius(focal) for d in distances], device=tree.device)
        levels = [int(v) for v in levels_for_radius(radius, field.lod_root_size).clamp(max=tree.deepest).tolist()]
        per_depth = [max(r["nodes_touched_per_depth"][d] for r in reports)
                     for d in range(len(reports[0]["nodes_touched_per_depth"]))]
        rows.append({"factor": float(factor), "distance": min(distances), "level": max(levels),
                     "distances": distances, "levels": levels,
                     "psnr": psnr_from_mse(sum(errors) / len(errors)), "psnr_per_view": views_psnr,
                     "window": list(pred.shape[:2]),
                     "supersample": supersample,
                     "fraction_touched": sum(r["fraction_touched"] for r in reports) / len(reports),
                     "params_touched": max(r["params_touched"] for r in reports),
                     "nodes_touched_per_depth": per_depth})
    return rows


def format_curve(rows: list[dict]) -> str:
    """`lod_curve`'s rows as a table: the nearest view's distance, the range of the views' levels."""
    lines = ["distance x  distance  level  rays/px  PSNR dB  window   params touched"]
    for r in rows:
        k = r["supersample"]
        low, high = min(r["levels"]), r["level"]
        level = f"{low}-{high}" if low != high else f"{high}"
        lines.append(f"{r['factor']:>10g}  {r['distance']:8.2f}  {level:>5s}  {k * k:7d}  {r['psnr']:7.2f}  "
                     f"{r['window'][1]:>3d}x{r['window'][0]:<3d}  {100 * r['fraction_touched']:5.1f}%")
    return "\n".join(lines)
