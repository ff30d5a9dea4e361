"""An analytic scene for tests and demos: a few coloured SDF primitives inside [-1, 1]^3, and its ground truth.

Density is a smoothed indicator of the solid, sigma = density_scale * sigmoid(-sdf / softness), so edges are a
couple of pixels wide at 32-64 px and small networks can learn the scene. Colour blends the primitives' colours
by how close each primitive is (a soft-min of their SDFs), with gentle stripes so there is texture to learn.
"""
from __future__ import annotations

import math

import torch

from ...errors import InputError
from ...render import camera_rays, composite_dense, ray_box, stratified_t
from .posed_images import PosedImages


# The primitives' constant vectors on each device and dtype: `p.new_tensor(...)` per call would copy them from
# the host every time, a synchronising copy in every training step that queries the scene.
_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _vector(p: torch.Tensor, values) -> torch.Tensor:
    key = (tuple(values), p.device, p.dtype)
    v = _CONSTANTS.get(key)
    if v is None:
        v = _CONSTANTS[key] = torch.tensor(values, dtype=p.dtype, device=p.device)
    return v


def _sphere(p, centre, radius):
    return (p - _vector(p, centre)).norm(dim=-1) - radius


def _rounded_box(p, centre, half, rounding):
    q = (p - _vector(p, centre)).abs() - (_vector(p, half) - rounding)
    outside = q.clamp_min(0.0).norm(dim=-1)
    inside = q.amax(dim=-1).clamp_max(0.0)
    return outside + inside - rounding


def _torus_z(p, centre, major, minor):
    q = p - _vector(p, centre)
    ring = torch.sqrt(q[:, 0] ** 2 + q[:, 1] ** 2 + 1e-12) - major
    return torch.sqrt(ring**2 + q[:, 2] ** 2 + 1e-12) - minor


def _capsule(p, a, b, radius):
    a, b = _vector(p, a), _vector(p, b)
    ab = b - a
    h = (((p - a) @ ab) / (ab @ ab)).clamp(0.0, 1.0)
    return (p - a - h[:, None] * ab).norm(dim=-1) - radius


class ProceduralScene:
    """Four primitives (sphere, rounded box, flat torus, capsule) in the box [-1, 1]^3, z up.

    density(points (M, 3)) -> (M,) and color(points) -> (M, 3) are plain differentiable torch functions on the
    points' device; sdf(points) -> (M,) is the union's signed distance.
    """

    # name, base colour, stripe direction (frequency per axis)
    PRIMITIVES = (
        ("sphere", (0.9, 0.25, 0.2), (0.0, 0.0, 9.0)),
        ("box", (0.2, 0.35, 0.9), (7.0, 0.0, 0.0)),
        ("torus", (0.25, 0.8, 0.3), (0.0, 8.0, 0.0)),
        ("capsule", (0.95, 0.8, 0.2), (0.0, 0.0, 0.0)),
    )

    def __init__(self, density_scale: float = 100.0, softness: float = 0.01, color_blend: float = 0.03,
                 background=(1.0, 1.0, 1.0)):
        if not density_scale > 0 or not softness > 0 or not color_blend > 0:
            raise InputError(f"density_scale, softness and color_blend must be positive, got "
                             f"{density_scale}, {softness}, {color_blend}")
        self.density_scale = float(density_scale)
        self.softness = float(softness)
        self.color_blend = float(color_blend)
        self.box_min = torch.full((3,), -1.0)
        self.box_max = torch.full((3,), 1.0)
        self.background = torch.tensor(background, dtype=torch.float32).reshape(3)

    def primitive_sdfs(self, points: torch.Tensor) -> torch.Tensor:
        """(M, 4): each primitive's signed distance."""
        if not isinstance(points, torch.Tensor) or points.dim() != 2 or points.shape[1] != 3:
            raise InputError(f"points must be an (M, 3) tensor, got "
                             f"{tuple(points.shape) if isinstance(points, torch.Tensor) else type(points).__name__}")
        p = points
        return torch.stack([
            _sphere(p, (-0.4, -0.3, 0.15), 0.35),
            _rounded_box(p, (0.35, 0.3, -0.1), (0.3, 0.25, 0.3), 0.05),
            _torus_z(p, (0.0, -0.1, -0.6), 0.4, 0.12),
            _capsule(p, (-0.5, 0.5, -0.45), (0.05, 0.55, 0.65), 0.11),
        ], dim=1)

    def sdf(self, points: torch.Tensor) -> torch.Tensor:
        return self.primitive_sdfs(points).amin(dim=1)

    def density(self, points: torch.Tensor) -> torch.Tensor:
        return self.density_from_sdfs(self.primitive_sdfs(points))

    def color(self, points: torch.Tensor) -> torch.Tensor:
        return self.color_from_sdfs(points, self.primitive_sdfs(points))

    def density_from_sdfs(self, sdfs: torch.Tensor) -> torch.Tensor:
        return self.density_scale * torch.sigmoid(-sdfs.amin(dim=1) / self.softness)

    def color_from_sdfs(self, points: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """color(points) given primitive_sdfs(points) (saves evaluating them twice)."""
        weights = torch.softmax(-d / self.color_blend, dim=1)  # (M, 4): the nearest primitive dominates
        base = _vector(points, tuple(c for _, c, _ in self.PRIMITIVES))     # (4, 3)
        freq = _vector(points, tuple(f for _, _, f in self.PRIMITIVES))     # (4, 3)
        stripes = 0.8 + 0.2 * torch.sin(points @ freq.T)                    # (M, 4)
        return torch.einsum("mk,mk,kc->mc", weights, stripes, base).clamp(0.0, 1.0)


def look_at_poses(positions: torch.Tensor, target=(0.0, 0.0, 0.0)) -> torch.Tensor:
    """(V, 4, 4) camera-to-world matrices of cameras at `positions` (V, 3) looking at `target`, z up."""
    z = positions - positions.new_tensor(target)   # the camera looks down its -z axis
    z = z / z.norm(dim=1, keepdim=True)
    up = positions.new_tensor([0.0, 0.0, 1.0]).expand_as(z)
    near_pole = z[:, 2].abs() > 0.999
    up = torch.where(near_pole[:, None], positions.new_tensor([0.0, 1.0, 0.0]).expand_as(z), up)
    x = torch.linalg.cross(up, z)
    x = x / x.norm(dim=1, keepdim=True)
    y = torch.linalg.cross(z, x)
    c2w = torch.zeros(positions.shape[0], 4, 4, dtype=positions.dtype, device=positions.device)
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2], c2w[:, :3, 3] = x, y, z, positions
    c2w[:, 3, 3] = 1.0
    return c2w


def sphere_positions(n: int, radius: float, seed: int) -> torch.Tensor:
    """n points uniformly at random on a sphere (reproducible from seed)."""
    g = torch.Generator().manual_seed(int(seed))
    v = torch.randn(n, 3, generator=g, dtype=torch.float64)
    return (radius * v / v.norm(dim=1, keepdim=True)).float()


@torch.no_grad()
def render_views(scene: ProceduralScene, n_views: int, width: int, height: int, seed: int = 0, radius: float = 3.0,
                 focal: float | None = None, n_samples: int = 256, background=None,
                 rays_per_chunk: int = 1 << 13) -> PosedImages:
    """Ground-truth images of `scene` from n_views cameras on a sphere of `radius` looking at the origin.

    Cameras are uniform at random on the sphere (seed picks them: use different seeds for train and test views).
    focal defaults to 1.2 * width (the scene fills most of the frame at radius 3). Rendered with `tinn.render`:
    n_samples stratified midpoints inside the scene box, composited on the scene's background (or `background`).
    Returns PosedImages on tinn's device.
    """
    from ... import runtime

    n_views, width, height, n_samples = int(n_views), int(width), int(height), int(n_samples)
    if n_views < 1:
        raise InputError(f"n_views must be >= 1, got {n_views}")
    if radius <= math.sqrt(3.0):
        raise InputError(f"radius={radius} puts cameras inside the scene box [-1, 1]^3; allowed: > sqrt(3)")
    dev = runtime.device()
    focal = 1.2 * width if focal is None else float(focal)
    bg = scene.background if background is None else torch.as_tensor(background, dtype=torch.float32).reshape(3)
    bg = bg.to(dev)
    box_min, box_max = scene.box_min.to(dev), scene.box_max.to(dev)
    c2w = look_at_poses(sphere_positions(n_views, radius, seed)).to(dev)
    images = torch.empty(n_views * height * width, 3, dtype=torch.float32, device=dev)
    # Rays are made per chunk of views so memory stays bounded for hundreds of views.
    views_per_chunk = max(1, rays_per_chunk // (width * height))
    for v0 in range(0, n_views, views_per_chunk):
        origins, dirs = camera_rays(c2w[v0:v0 + views_per_chunk], width, height, focal)
        base = v0 * width * height
        for r0 in range(0, origins.shape[0], rays_per_chunk):
            o, d = origins[r0:r0 + rays_per_chunk], dirs[r0:r0 + rays_per_chunk]
            images[base + r0:base + r0 + o.shape[0]] = _render_rays(scene, o, d, box_min, box_max, n_samples, bg)
    return PosedImages(images=images.reshape(n_views, height, width, 3), c2w=c2w, focal=focal, width=width,
                       height=height, near=radius - math.sqrt(3.0), far=radius + math.sqrt(3.0), box_min=box_min,
                       box_max=box_max, background=bg)


def _render_rays(scene, origins, dirs, box_min, box_max, n_samples, bg):
    t_near, t_far = ray_box(origins, dirs, box_min, box_max)
    t, deltas = stratified_t(t_near, t_far, n_samples, jitter=False)
    points = (origins[:, None, :] + t[..., None] * dirs[:, None, :]).reshape(-1, 3)
    sdfs = scene.primitive_sdfs(points)
    sigma = scene.density_from_sdfs(sdfs)
    # Colour only where the density is above 1e-6 of its peak: elsewhere a sample's weight is below ~1e-6 and
    # its colour cannot show (the skipped samples of a ray add up to well under one 8-bit level).
    visible = sigma > 1e-6 * scene.density_scale
    rgb = torch.zeros(points.shape[0], 3, dtype=points.dtype, device=points.device)
    rgb[visible] = scene.color_from_sdfs(points[visible], sdfs[visible])
    return composite_dense(sigma.reshape(t.shape), rgb.reshape(*t.shape, 3), deltas, background=bg).rgb


def surface_points(scene: ProceduralScene, n_points: int, seed: int = 0, tolerance: float = 1e-3) -> torch.Tensor:
    """n_points points within `tolerance` of the scene's surfaces, on tinn's device (reproducible from seed).

    Uniform points of the box are pulled onto the nearest surface by Newton steps on the SDF
    (x <- x - sdf(x) grad / |grad|^2); those that end inside the box and close enough are kept.
    """
    from ... import runtime

    n_points = int(n_points)
    if n_points < 1:
        raise InputError(f"n_points must be >= 1, got {n_points}")
    dev = runtime.device()
    g = torch.Generator().manual_seed(int(seed))
    lo, hi = scene.box_min.double(), scene.box_max.double()
    kept, n_kept = [], 0
    for _ in range(64):
        x = (lo + (hi - lo) * torch.rand(2 * n_points, 3, generator=g, dtype=torch.float64)).to(dev)
        for _ in range(8):
            x = x.detach().requires_grad_()
            d = scene.sdf(x)
            (grad,) = torch.autograd.grad(d.sum(), x)
            x = x - (d / (grad * grad).sum(dim=1).clamp_min(1e-12))[:, None] * grad
        x = x.detach()
        ok = (scene.sdf(x).abs() < tolerance) & ((x >= lo.to(dev)) & (x <= hi.to(dev))).all(dim=1)
        kept.append(x[ok])
        n_kept += int(ok.sum())
        if n_kept >= n_points:
            break
    else:
        raise RuntimeError(f"could only place {n_kept} of {n_points} surface points")
    return torch.cat(kept)[:n_points].float()
