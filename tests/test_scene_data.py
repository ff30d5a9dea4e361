"""PosedImages, the procedural scene and its ground truth, and the NeRF-synthetic loader."""
import json
import math

import numpy as np
import pytest
import torch

import tinn
from tinn.errors import InputError
from tinn.render import camera_rays, composite_dense, ray_box, stratified_t
from tinn.scenes import PosedImages, ProceduralScene, load_nerf_synthetic, render_views, surface_points

DEV = tinn.runtime.device()


def make_posed(n_views=2, width=6, height=4, focal=5.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    c2w = torch.eye(4).repeat(n_views, 1, 1)
    c2w[:, 2, 3] = torch.arange(n_views, dtype=torch.float32) + 3.0
    return PosedImages(images=torch.rand(n_views, height, width, 3, generator=g), c2w=c2w, focal=focal, width=width,
                       height=height, near=1.0, far=5.0, box_min=-torch.ones(3), box_max=torch.ones(3),
                       background=torch.ones(3)).to(DEV)


# ---------------------------------------------------------------------------------------------------------
# PosedImages
# ---------------------------------------------------------------------------------------------------------
def test_posed_images_rays_follow_camera_rays():
    data = make_posed()
    assert len(data) == 2
    origins, dirs, colors = data.rays()
    o_ref, d_ref = camera_rays(data.c2w, 6, 4, 5.0)
    assert torch.equal(origins, o_ref) and torch.equal(dirs, d_ref)
    assert torch.equal(colors, data.images.reshape(-1, 3))
    o1, d1, c1 = data.rays(views=[1])
    assert torch.equal(c1, data.images[1].reshape(-1, 3)) and torch.equal(o1, o_ref[24:])
    with pytest.raises(InputError, match="views"):
        data.rays(views=[2])


def test_downscaled_halves_sizes_and_focal_and_averages_pixels():
    data = make_posed()
    half = data.downscaled(2)
    assert (half.width, half.height, half.focal) == (3, 2, 2.5)
    assert half.images.shape == (2, 2, 3, 3)
    block = data.images[1, 2:4, 4:6].reshape(-1, 3).mean(0)  # view 1, pixel (row 1, column 2) of the half image
    torch.testing.assert_close(half.images[1, 1, 2], block)
    # The coarse pixel looks through the centre of its 2x2 block: original pixel coordinates (5, 3).
    _, dirs, _ = half.rays(views=[0])
    cam = torch.tensor([(5.0 - 3.0) / 5.0, -(3.0 - 2.0) / 5.0, -1.0], device=DEV)
    torch.testing.assert_close(dirs[1 * 3 + 2], cam / cam.norm())
    assert torch.equal(half.c2w, data.c2w) and half.near == data.near
    assert data.downscaled(1).images is data.images
    with pytest.raises(InputError, match="divisible"):
        data.downscaled(4)


def test_posed_images_validate_fields():
    data = make_posed()
    with pytest.raises(InputError, match="c2w"):
        PosedImages(images=data.images, c2w=data.c2w[:1], focal=5.0, width=6, height=4, near=1.0, far=5.0,
                    box_min=data.box_min, box_max=data.box_max, background=data.background)
    with pytest.raises(InputError, match="width"):
        PosedImages(images=data.images, c2w=data.c2w, focal=5.0, width=4, height=6, near=1.0, far=5.0,
                    box_min=data.box_min, box_max=data.box_max, background=data.background)
    moved = data.to("cpu")
    assert moved.device.type == "cpu" and moved.c2w.device.type == "cpu" and moved.background.device.type == "cpu"
    assert torch.equal(moved.images, data.images.cpu()) and moved.focal == data.focal


# ---------------------------------------------------------------------------------------------------------
# Procedural scene
# ---------------------------------------------------------------------------------------------------------
def test_procedural_scene_density_and_color():
    scene = ProceduralScene()
    centre = torch.tensor([[-0.4, -0.3, 0.15]], device=DEV)  # the sphere's centre: deep inside, red
    far = torch.tensor([[0.95, -0.95, 0.95]], device=DEV)    # a corner of the box: empty
    assert float(scene.density(centre)) == pytest.approx(scene.density_scale, rel=1e-6)
    assert float(scene.density(far)) < 1e-6 * scene.density_scale
    c = scene.color(centre)[0]
    assert float(c[0]) > 0.5 and float(c[1]) < 0.3 and float(c[2]) < 0.3
    p = torch.rand(100, 3, device=DEV) * 2 - 1
    assert scene.density(p).shape == (100,) and scene.color(p).shape == (100, 3)
    assert bool((scene.color(p) >= 0).all()) and bool((scene.color(p) <= 1).all())
    p.requires_grad_()
    (g,) = torch.autograd.grad(scene.density(p).sum(), p)
    assert bool(torch.isfinite(g).all()) and float(g.abs().sum()) > 0


def test_render_views_is_deterministic_and_shows_the_object():
    scene = ProceduralScene()
    views = render_views(scene, 3, 16, 12, seed=5, n_samples=64)
    again = render_views(scene, 3, 16, 12, seed=5, n_samples=64)
    other = render_views(scene, 3, 16, 12, seed=6, n_samples=64)
    assert views.images.shape == (3, 12, 16, 3) and views.c2w.shape == (3, 4, 4)
    assert torch.equal(views.images, again.images) and not torch.equal(views.images, other.images)
    assert (views.focal, views.width, views.height) == (1.2 * 16, 16, 12)
    # Cameras at radius 3 look at the origin: their -z axis points at it.
    pos = views.c2w[:, :3, 3]
    torch.testing.assert_close(pos.norm(dim=1), torch.full((3,), 3.0, device=DEV))
    torch.testing.assert_close(-views.c2w[:, :3, 2], -pos / 3.0)
    bg = views.background
    diff = (views.images - bg).abs().sum(-1)  # (V, H, W)
    assert bool((diff[:, 0, 0] < 1e-3).all())                # the corners show the white background
    for v in range(3):
        assert float((diff[v] > 0.5).float().mean()) > 0.1   # the object covers a good part of every view
    assert float(views.images.mean()) < float(bg.mean()) - 0.1


def test_rendering_the_scene_gives_sensible_depth_and_opacity():
    scene = ProceduralScene()
    sphere_centre, radius = torch.tensor([-0.4, -0.3, 0.15]), 0.35
    origins = torch.tensor([[-0.4, -3.0, 0.15],   # straight at the sphere along +y
                            [0.0, -3.0, 0.95]], device=DEV)   # along +y near the top of the box: hits nothing
    dirs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], device=DEV)
    background = scene.background.to(DEV)  # the scene describes it on the host
    t_near, t_far = ray_box(origins, dirs, scene.box_min, scene.box_max)
    t, deltas = stratified_t(t_near, t_far, 256, jitter=False)
    pts = (origins[:, None] + t[..., None] * dirs[:, None]).reshape(-1, 3)
    out = composite_dense(scene.density(pts).reshape(t.shape), scene.color(pts).reshape(*t.shape, 3), deltas,
                          background=background, t=t)
    surface = float(sphere_centre[1] - radius - origins[0, 1])   # 2.35 from the origin of ray 0
    assert float(out.opacity[0]) > 0.999 and float(out.opacity[1]) < 1e-3
    assert float(out.depth[0]) == pytest.approx(surface, abs=0.03)
    assert float(out.rgb[0, 0]) > 0.5 and float(out.rgb[0, 2]) < 0.4
    torch.testing.assert_close(out.rgb[1], background, atol=2e-3, rtol=0)


def test_surface_points_lie_on_every_primitive():
    scene = ProceduralScene()
    pts = surface_points(scene, 2000, seed=1)
    assert pts.shape == (2000, 3) and pts.dtype == torch.float32
    assert float(scene.sdf(pts.double()).abs().max()) < 1e-3
    assert bool((pts.abs() <= 1).all())
    nearest = scene.primitive_sdfs(pts).argmin(dim=1)
    assert torch.bincount(nearest, minlength=4).min() > 100
    assert torch.equal(pts, surface_points(scene, 2000, seed=1))


# ---------------------------------------------------------------------------------------------------------
# NeRF-synthetic loader
# ---------------------------------------------------------------------------------------------------------
def write_blender_scene(root, n_views=2, size=8, angle=0.7):
    """A tiny NeRF-synthetic folder: RGBA PNGs plus transforms_train.json (one path with .png, one without)."""
    import imageio.v3 as iio

    rng = np.random.default_rng(0)
    (root / "train").mkdir()
    frames, rgba = [], []
    for v in range(n_views):
        img = rng.integers(0, 256, size=(size, size, 4), dtype=np.uint8)
        img[0, 0, 3] = 0      # fully transparent pixel: pure background
        img[0, 1, 3] = 255    # opaque pixel: its own colour
        iio.imwrite(root / "train" / f"r_{v}.png", img)
        rgba.append(img)
        pose = np.eye(4)
        pose[:3, 3] = [0.0, -4.0 - v, 0.5 * v]
        pose[:3, :3] = [[1, 0, 0], [0, 0, -1], [0, 1, 0]]  # looking along +y
        frames.append({"file_path": f"./train/r_{v}" + (".png" if v else ""), "rotation": 0.1,
                       "transform_matrix": pose.tolist()})
    (root / "transforms_train.json").write_text(json.dumps({"camera_angle_x": angle, "frames": frames}))
    return np.stack(rgba), frames


def test_load_nerf_synthetic_reads_poses_focal_and_composited_images(tmp_path):
    rgba, frames = write_blender_scene(tmp_path)
    data = load_nerf_synthetic(tmp_path, background=(0.0, 0.5, 1.0))
    assert len(data) == 2 and (data.width, data.height) == (8, 8)
    assert data.focal == pytest.approx(0.5 * 8 / math.tan(0.5 * 0.7))
    for v in range(2):
        torch.testing.assert_close(data.c2w[v], torch.tensor(frames[v]["transform_matrix"], dtype=torch.float32))
    a = rgba[..., 3:].astype(np.float64) / 255
    want = rgba[..., :3] / 255 * a + np.array([0.0, 0.5, 1.0]) * (1 - a)
    torch.testing.assert_close(data.images.double(), torch.from_numpy(want), atol=1e-6, rtol=0)
    torch.testing.assert_close(data.images[:, 0, 0], torch.tensor([[0.0, 0.5, 1.0]] * 2))
    torch.testing.assert_close(data.images[:, 0, 1].double(), torch.from_numpy(rgba[:, 0, 1, :3] / 255.0))
    assert torch.equal(data.box_max, torch.full((3,), 1.5)) and (data.near, data.far) == (2.0, 6.0)

    small = load_nerf_synthetic(tmp_path, downscale=2, background=(0.0, 0.5, 1.0), max_views=1)
    assert len(small) == 1 and (small.width, small.height) == (4, 4)
    assert small.focal == pytest.approx(data.focal / 2)
    torch.testing.assert_close(small.images[0], data.downscaled(2).images[0])


def test_load_nerf_synthetic_errors(tmp_path):
    with pytest.raises(InputError, match="transforms_train.json not found"):
        load_nerf_synthetic(tmp_path)
    write_blender_scene(tmp_path)
    with pytest.raises(InputError, match="transforms_test.json not found.*transforms_train.json"):
        load_nerf_synthetic(tmp_path, split="test")
    (tmp_path / "transforms_val.json").write_text(json.dumps({"frames": []}))
    with pytest.raises(InputError, match="camera_angle_x"):
        load_nerf_synthetic(tmp_path, split="val")
    (tmp_path / "transforms_val.json").write_text(json.dumps({"camera_angle_x": 0.5,
                                                              "frames": [{"file_path": "./val/missing"}]}))
    with pytest.raises(InputError, match="transform_matrix"):
        load_nerf_synthetic(tmp_path, split="val")
    (tmp_path / "transforms_val.json").write_text(json.dumps(
        {"camera_angle_x": 0.5, "frames": [{"file_path": "./val/missing", "transform_matrix": np.eye(4).tolist()}]}))
    with pytest.raises(InputError, match="does not exist"):
        load_nerf_synthetic(tmp_path, split="val")
    with pytest.raises(InputError, match="divisible"):
        load_nerf_synthetic(tmp_path, downscale=3)
