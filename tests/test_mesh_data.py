"""Real meshes rendered into scene folders, and the scene formats users have (tinn/scenes/data/mesh.py, formats.py)."""
import json
import math
import os

import numpy as np
import pytest
import torch

import tinn
from tinn.errors import InputError
from tinn.scenes.data import formats
from tinn.scenes.data import mesh as M
from tinn.scenes.data import load_nerf_synthetic

from conftest import missing_package

BUNNY = "/usr/share/glmark2/models/bunny.obj"   # Debian package glmark2-data


def quad(z=-3.0, half=1.0, colour=(0.2, 0.6, 1.0)) -> M.Mesh:
    """A square facing the camera at the origin (camera space), two triangles."""
    v = np.array([[-half, -half, z], [half, -half, z], [half, half, z], [-half, half, z]], np.float32)
    f = np.array([[0, 1, 2], [0, 2, 3]], np.int32)
    return M.Mesh(v, f, np.tile(np.array(colour, np.float32), (2, 3)))


def test_a_square_covers_its_projected_pixels_with_its_colour():
    focal, res = 50.0, 64
    img = M.render_rgba(quad(), np.eye(4), res, res, focal, supersample=1, ambient=1.0).cpu()
    # Projected half-side: focal * 1 / 3 pixels around the centre; pixel centres inside it are covered.
    edge = focal / 3.0
    centres = torch.arange(res) + 0.5 - res / 2
    inside = (centres.abs() < edge)
    expected = inside[:, None] & inside[None, :]
    assert torch.equal(img[..., 3] > 0.5, expected)
    torch.testing.assert_close(img[expected][:, :3], torch.tensor([0.2, 0.6, 1.0]).expand(int(expected.sum()), 3))
    assert img[~expected].abs().max() == 0


def test_supersampled_alpha_is_the_covered_area_and_nearer_triangles_win():
    focal, res = 40.0, 48
    img = M.render_rgba(quad(half=0.7), np.eye(4), res, res, focal, supersample=4, ambient=1.0).cpu()
    # Sub-sample centres (k + 0.5) / 4 inside the projected square, counted per axis. Its diagonal (the two
    # triangles' shared edge) runs through sub-sample centres: a pinhole on it would lose some of them.
    sub = (torch.arange(4 * res) + 0.5) / 4 - res / 2
    n_inside = int((sub.abs() < 0.7 * focal / 3.0).sum())
    assert float(img[..., 3].sum()) == n_inside ** 2 / 16
    near, far = quad(z=-2.0, half=0.3, colour=(1, 0, 0)), quad(z=-4.0, colour=(0, 1, 0))
    both = M.Mesh(np.concatenate([far.vertices, near.vertices]), np.concatenate([far.faces, near.faces + 4]),
                  np.concatenate([far.corner_rgb, near.corner_rgb]))
    img = M.render_rgba(both, np.eye(4), res, res, focal, supersample=1, ambient=1.0).cpu()
    c = res // 2
    assert img[c, c, :3].tolist() == [1.0, 0.0, 0.0] and img[c, c + 8, :3].tolist() == [0.0, 1.0, 0.0]


def test_texture_lookup_and_obj_with_material(tmp_path):
    import imageio.v3 as iio

    tex = np.zeros((2, 2, 3), np.uint8)
    tex[0, :] = (255, 0, 0)     # top row red (v = 1)
    tex[1, :] = (0, 0, 255)     # bottom row blue (v = 0)
    iio.imwrite(tmp_path / "t.png", tex)
    (tmp_path / "m.mtl").write_text("newmtl a\nKd 1 1 1\nmap_Kd t.png\n")
    (tmp_path / "q.obj").write_text("mtllib m.mtl\nv -1 -1 -3\nv 1 -1 -3\nv 1 1 -3\nv -1 1 -3\n"
                                    "vt 0 0.25\nvt 1 0.25\nvt 1 0.75\nvt 0 0.75\nusemtl a\nf 1/1 2/2 3/3 4/4\n")
    m = M.read_mesh(tmp_path / "q.obj")
    assert m.faces.shape == (2, 3) and m.texture is not None
    img = M.render_rgba(m, np.eye(4), 32, 32, 30.0, supersample=1, ambient=1.0).cpu()
    top, bottom = img[12, 16, :3], img[19, 16, :3]
    assert top[0] > top[2] and bottom[2] > bottom[0]   # v up: the image's top shows the texture's top row


def test_ply_ascii_and_binary_read_the_same(tmp_path):
    v = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], np.float32)
    header = ("ply\nformat {fmt} 1.0\ncomment tinn test\nelement vertex 4\nproperty float x\nproperty float y\n"
              "property float z\nproperty uchar red\nproperty uchar green\nproperty uchar blue\n"
              "element face 1\nproperty list uchar int vertex_indices\nend_header\n")
    body = "".join(f"{a} {b} {c} 255 0 0\n" for a, b, c in v) + "4 0 1 2 3\n"
    (tmp_path / "a.ply").write_text(header.format(fmt="ascii") + body)
    vert = np.zeros(4, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1")])
    vert["x"], vert["y"], vert["z"], vert["r"] = v[:, 0], v[:, 1], v[:, 2], 255
    face = np.array([4], np.uint8).tobytes() + np.array([0, 1, 2, 3], "<i4").tobytes()
    (tmp_path / "b.ply").write_bytes(header.format(fmt="binary_little_endian").encode() + vert.tobytes() + face)
    a, b = M.read_mesh(tmp_path / "a.ply"), M.read_mesh(tmp_path / "b.ply")
    assert np.array_equal(a.faces, [[0, 1, 2], [0, 2, 3]]) and np.array_equal(a.faces, b.faces)
    assert np.array_equal(a.vertices, b.vertices) and np.allclose(a.corner_rgb[:, 0], 1.0)


@pytest.mark.parametrize("name,text,match", [
    ("bad.obj", "v 0 0 0\nv 1 0 0\nf 1 2 9\n", "outside 1..2"),
    ("words.obj", "v 0 zero 0\nf 1 1 1\n", r"bad\.obj|words\.obj:1"),
    ("none.obj", "v 0 0 0\n", "no faces"),
    ("bad.ply", "ply\nformat binary_big_endian 1.0\nend_header\n", "binary_big_endian"),
    ("short.ply", "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\nproperty float z\n"
                  "element face 1\nproperty list uchar int vertex_indices\nend_header\n0 0 0\n1 0 0\n", "ends early"),
    ("m.stl", "solid", r"allowed: \.obj, \.ply"),
])
def test_malformed_meshes_name_the_problem(tmp_path, name, text, match):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=match):
        M.read_mesh(tmp_path / name)


@pytest.fixture(scope="module")
def bunny_scene(tmp_path_factory):
    if not os.path.isfile(BUNNY):
        missing_package(f"{BUNNY} missing (Debian package glmark2-data)")
    out = tmp_path_factory.mktemp("bunny")
    counts = M.write_nerf_synthetic(M.read_mesh(BUNNY), out, views=16, val_views=0, test_views=2, resolution=32)
    return out, counts


def test_written_folder_round_trips_through_the_nerf_synthetic_loader(bunny_scene):
    out, counts = bunny_scene
    assert counts == {"train": 16, "test": 2}
    train = load_nerf_synthetic(out, "train")
    assert len(train) == 16 and train.width == 32
    np.testing.assert_allclose(train.c2w.numpy(), M.sphere_cameras(16).astype(np.float32), atol=1e-6)
    assert abs(train.focal - 16 / math.tan(0.5 * M.CAMERA_ANGLE_X)) < 1e-3
    # The object is in view and not cut off: some pixels covered, the border empty.
    assert (train.images < 0.99).any(dim=-1).float().mean() > 0.05
    border = torch.cat([train.images[:, 0], train.images[:, -1], train.images[:, :, 0], train.images[:, :, -1]], 1)
    assert (border > 0.99).all()
    assert formats.detect_format(out) == "nerf_synthetic"


def _transforms(tmp_path, scene_dir, **top):
    """An instant-ngp style transforms.json over a written NeRF-synthetic folder's training images."""
    meta = json.loads((scene_dir / "transforms_train.json").read_text())
    frames = [{"file_path": os.path.relpath(scene_dir / (fr["file_path"] + ".png"), tmp_path),
               "transform_matrix": fr["transform_matrix"]} for fr in meta["frames"]]
    f = 16 / math.tan(0.5 * meta["camera_angle_x"])
    data = {"fl_x": f, "fl_y": f, "cx": 16.0, "cy": 16.0, "w": 32, "h": 32, "frames": frames, **top}
    (tmp_path / "transforms.json").write_text(json.dumps(data))
    return tmp_path / "transforms.json"


def test_ring_cameras_split_the_views_over_their_spheres_and_stay_on_them():
    cams = M.ring_cameras(8, (4.0, 2.6, 1.8), offset=0.25)
    distances = np.linalg.norm(cams[:, :3, 3], axis=1)
    np.testing.assert_allclose(distances, [4.0] * 3 + [2.6] * 3 + [1.8] * 2, rtol=1e-9)
    for c2w in cams:  # each looks at the origin: its -z axis points there
        np.testing.assert_allclose(-c2w[:3, 2], -c2w[:3, 3] / np.linalg.norm(c2w[:3, 3]), atol=1e-9)
    np.testing.assert_allclose(M.ring_cameras(5, (4.0,), 0.25), M.sphere_cameras(5, 4.0, 0.25))
    # Any lattice offset keeps every camera on its sphere (past half a step it used to leave it).
    for offset in (0.0, 0.5, 0.62, 0.99):
        np.testing.assert_allclose(np.linalg.norm(M.sphere_cameras(3, 2.0, offset)[:, :3, 3], axis=1), 2.0)
    for bad in ((), (1.5,), (4.0, float("nan")), "far"):
        with pytest.raises(InputError, match="radii"):
            M.ring_cameras(4, bad)
    assert M.parse_radii("4, 2.6,1.8") == (4.0, 2.6, 1.8)
    assert M.ring_cameras(0, (4.0, 2.0)).shape == (0, 4, 4)
    with pytest.raises(InputError, match="n=-1"):
        M.ring_cameras(-1)
    for bad in ("", "4,near", "4,1"):
        with pytest.raises(InputError, match="radii"):
            M.parse_radii(bad)


def test_instant_ngp_and_nerfstudio_load_the_same_rays(bunny_scene, tmp_path):
    out, _ = bunny_scene
    ref = load_nerf_synthetic(out, "train")
    path = _transforms(tmp_path, out, aabb_scale=1, k1=0.0)
    assert formats.detect_format(path) == "instant_ngp"
    every = formats.load_scene(path, "all")
    assert torch.equal(every.images, ref.images) and torch.equal(every.c2w, ref.c2w)
    assert abs(every.focal - ref.focal) < 1e-4
    torch.testing.assert_close(every.box_max, torch.full((3,), 0.5 / 0.33))   # aabb 1 at instant-ngp's scale
    test = formats.load_scene(path, "test")
    assert len(test) == 2 and torch.equal(test.c2w, ref.c2w[::8])
    assert len(formats.load_scene(path, "train")) == 14
    _transforms(tmp_path, out, camera_model="OPENCV", applied_transform=np.eye(4)[:3].tolist())
    assert formats.detect_format(tmp_path) == "nerfstudio"
    studio = formats.load_scene(tmp_path, "all")
    assert torch.equal(studio.images, ref.images) and studio.near < studio.far


@pytest.mark.parametrize("change,match", [
    ({"k1": 0.1}, r"lens distortion 'k1'=0\.1"),
    ({"camera_model": "FISHEYE"}, r"camera_model 'FISHEYE' is not supported"),
    ({"fl_y": 10.0}, "square pixels"),
    ({"cx": 5.0}, r"cx=5\.0 is not the image centre"),
    ({"w": 64}, "is 32x32 but w x h = 64x32"),
    ({"fl_x": "wide"}, r"'fl_x' must be a finite number"),
    ({"frames": []}, "'frames' must be a non-empty list"),
])
def test_unsupported_or_malformed_transforms_name_the_field(bunny_scene, tmp_path, change, match):
    out, _ = bunny_scene
    if "camera_model" in change:
        change = dict(change, applied_transform=np.eye(4)[:3].tolist())
    path = _transforms(tmp_path, out, **change)
    with pytest.raises(InputError, match=match):
        formats.load_scene(path, "all")


def test_missing_images_and_folders_are_named(bunny_scene, tmp_path):
    out, _ = bunny_scene
    path = _transforms(tmp_path, out)
    meta = json.loads(path.read_text())
    meta["frames"][3]["file_path"] = "nowhere/r_3"
    path.write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"frames\[3\]: file_path 'nowhere/r_3'"):
        formats.load_scene(path, "all")
    with pytest.raises(InputError, match="neither transforms_train.json"):
        formats.load_scene(tmp_path / "empty")
    path.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        formats.load_scene(path)


def test_kilonerf_trains_on_the_rendered_bunny(tmp_path):
    """The whole pipeline on a real mesh at test size (`--mesh`: rendered, then loaded from the folder):
    teacher, distillation, fine-tuning, held-out PSNR."""
    import sys

    if not os.path.isfile(BUNNY):
        missing_package(f"{BUNNY} missing (Debian package glmark2-data)")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import kilonerf

    summary = kilonerf.run(["--small", "--mesh", BUNNY, "--res", "32", "--views", "16", "--test-views", "2",
                            "--out", str(tmp_path / "run")])
    assert os.path.isfile(tmp_path / "run" / "mesh_scene" / "transforms_test.json")
    # Measured at this size: background 14.7 dB, teacher and student 26.1 dB.
    assert summary["psnr_student"] > summary["psnr_background"] + 8.0


def test_rgba_scenes_keep_alpha_for_random_backgrounds(bunny_scene):
    out, _ = bunny_scene
    train = load_nerf_synthetic(out, "train")
    assert train.alpha is not None and train.alpha.shape == (16, 32, 32, 1)
    empty = train.alpha[..., 0] == 0
    assert empty.any() and (train.images[empty] == 1.0).all()   # uncovered pixels show the (white) background
    half = train.downscaled(2)
    torch.testing.assert_close(half.alpha, train.alpha.reshape(16, 16, 2, 16, 2, 1).mean(dim=(2, 4)))


class _EmptyField(torch.nn.Module):
    """Zero density everywhere: a render shows exactly the background it is given."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1, device=tinn.runtime.device()))
        self.register_buffer("box_min", torch.full((3,), -1.0, device=tinn.runtime.device()))
        self.register_buffer("box_max", torch.full((3,), 1.0, device=tinn.runtime.device()))

    def forward(self, points):
        zero = points[:, 0] * 0.0 + self.w * 0.0
        return zero, torch.stack([zero, zero, zero], 1)


@pytest.mark.parametrize("coverage", [0.0, 1.0])
def test_random_backgrounds_recomposite_the_target(coverage):
    from tinn.scenes.data import PosedImages
    from tinn.scenes.training.photometric import PhotometricTrainer

    red = torch.tensor([1.0, 0.0, 0.0])
    white = torch.ones(3)
    stored = (red if coverage else white).expand(1, 8, 8, 3).contiguous()   # composited on white at load
    data = PosedImages(images=stored, c2w=torch.tensor(M.look_at([0.0, 0.0, 3.0]), dtype=torch.float32)[None],
                       focal=8.0, width=8, height=8, near=0.5, far=6.0, box_min=-white, box_max=white,
                       background=white, alpha=torch.full((1, 8, 8, 1), coverage))
    losses = {}
    for random in (True, False):
        trainer = PhotometricTrainer(_EmptyField(), data, n_samples=8, batch_rays=4096, learning_rate=1e-3,
                                     random_background=random)
        losses[random] = float(trainer.loss())
    if coverage == 0.0:   # the target is the random background itself, which the empty field shows
        assert abs(losses[True]) < 1e-12 and abs(losses[False]) < 1e-12
    else:                 # a covered red pixel stays red; the empty field shows white, or a random colour
        assert abs(losses[False] - 2 / 3) < 1e-6
        assert 0.25 < losses[True] < 0.42   # E[((u - 1)^2 + u^2 + u^2) / 3] = 1/3 for uniform u


DAE = """<?xml version="1.0"?>
<COLLADA xmlns="http://www.collada.org/2005/11/COLLADASchema" version="1.4.1">
 <library_effects><effect id="e"><profile_COMMON><technique sid="t"><lambert>
  <diffuse><color>0.1 0.8 0.3 1</color></diffuse></lambert></technique></profile_COMMON></effect></library_effects>
 <library_geometries><geometry id="g"><mesh>
  <source id="pos"><float_array id="pa" count="12">-1 -1 0 1 -1 0 1 1 0 -1 1 0</float_array>
   <technique_common><accessor source="#pa" count="4" stride="3"/></technique_common></source>
  <vertices id="v"><input semantic="POSITION" source="#pos"/></vertices>
  <polylist count="1"><input semantic="VERTEX" source="#v" offset="0"/><vcount>4</vcount><p>0 1 2 3</p></polylist>
 </mesh></geometry></library_geometries>
 <library_visual_scenes><visual_scene id="s"><node id="n"><translate>0 0 -3</translate>
  <instance_geometry url="#g"/></node></visual_scene></library_visual_scenes>
</COLLADA>
"""


def test_collada_polylists_node_transforms_and_colour(tmp_path):
    (tmp_path / "q.dae").write_text(DAE)
    m = M.read_mesh(tmp_path / "q.dae")
    assert m.faces.shape == (2, 3) and m.texture is None
    np.testing.assert_allclose(m.vertices[:, 2], -3.0)             # the node's translate applied
    np.testing.assert_allclose(m.corner_rgb[0, :3], [0.1, 0.8, 0.3])
    img = M.render_rgba(m, np.eye(4), 32, 32, 30.0, supersample=1, ambient=1.0).cpu()
    assert img[16, 16, :3].tolist() == pytest.approx([0.1, 0.8, 0.3], abs=1e-6)
    (tmp_path / "bad.dae").write_text("<COLLADA><unclosed>")
    with pytest.raises(InputError, match="not valid XML"):
        M.read_mesh(tmp_path / "bad.dae")


def test_the_textured_collada_duck_renders_its_texture():
    duck = "/usr/share/assimp/models/Collada/duck.dae"   # Debian package assimp-testmodels
    if not os.path.isfile(duck):
        missing_package(f"{duck} missing (Debian package assimp-testmodels)")
    m = M.read_mesh(duck)
    assert m.texture is not None and m.texture.shape == (512, 512, 3) and m.corner_uv.shape == (len(m.faces), 6)
    img = M.render_rgba(m.normalised(), M.sphere_cameras(8)[3], 64, 64, 32 / math.tan(0.5 * M.CAMERA_ANGLE_X)).cpu()
    covered = img[..., 3] > 0.99
    r, g, b = img[covered][:, :3].mean(0).tolist()
    assert covered.float().mean() > 0.1 and r > b + 0.2 and g > b + 0.2   # mostly the duck's yellow


def test_octree_training_recomposites_rgba_pixels_and_runs_on_a_mesh(bunny_scene, tmp_path):
    import sys

    from tinn.scenes.training.octree_training import PyramidRays

    out, _ = bunny_scene
    rays = PyramidRays(load_nerf_synthetic(out, "train"), 2)
    _, _, colors, _, alpha = rays.sample_rgba(2000, torch.Generator(device=tinn.runtime.device()).manual_seed(0))
    empty = alpha[:, 0] == 0
    assert alpha.shape == (2000, 1) and empty.any() and (colors[empty] == 1.0).all()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import octree_lod

    s = octree_lod.run(["--small", "--mesh", BUNNY, "--res", "16", "--views", "8", "--test-views", "1",
                        "--steps", "60", "--pyramid-levels", "1", "--samples", "16", "--batch", "256",
                        "--out", str(tmp_path / "octree")])
    assert s["psnr"] > s["background_psnr"] + 3.0


def test_a_fixed_light_shades_a_face_the_same_from_every_view_and_a_headlight_does_not():
    """A quad at the origin seen from two cameras: with a world light its lit colour is |cos| of the normal
    against the light whatever the view; with a headlight it follows the view."""
    flat = quad(z=0.0, half=0.5, colour=(1.0, 1.0, 1.0))
    light = (0.0, 0.6, 0.8)
    centre = []
    for eye in ([0.0, 0.0, 3.0], [2.0, 0.0, 2.2]):
        c2w = M.look_at(np.array(eye))
        fixed = M.render_rgba(flat, c2w, 16, 16, 20.0, supersample=1, ambient=0.2, light=light).cpu()
        head = M.render_rgba(flat, c2w, 16, 16, 20.0, supersample=1, ambient=0.2, light="headlight").cpu()
        centre.append((float(fixed[8, 8, 0]), float(head[8, 8, 0])))
    want = 0.2 + 0.8 * 0.8   # the quad's normal is z
    assert abs(centre[0][0] - want) < 1e-5 and abs(centre[1][0] - want) < 1e-5
    assert abs(centre[0][1] - 1.0) < 1e-3 and centre[1][1] < 0.95   # head-on (pixel centres just off axis), then oblique
    with pytest.raises(InputError, match="light"):
        M.render_rgba(flat, np.eye(4), 8, 8, 10.0, light=(0.0, 0.0, 0.0))
    with pytest.raises(InputError, match="light"):
        M.render_rgba(flat, np.eye(4), 8, 8, 10.0, light="sun")


def icosphere(subdivisions: int = 2) -> M.Mesh:
    """A unit sphere of shared vertices: an icosahedron subdivided, corners pushed onto the sphere."""
    t = (1.0 + 5 ** 0.5) / 2
    v = [[-1, t, 0], [1, t, 0], [-1, -t, 0], [1, -t, 0], [0, -1, t], [0, 1, t], [0, -1, -t], [0, 1, -t],
         [t, 0, -1], [t, 0, 1], [-t, 0, -1], [-t, 0, 1]]
    f = [[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11], [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6],
         [7, 1, 8], [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9], [4, 9, 5], [2, 4, 11], [6, 2, 10],
         [8, 6, 7], [9, 8, 1]]
    verts = [np.array(p, float) / np.linalg.norm(p) for p in v]
    for _ in range(subdivisions):
        mid, out = {}, []

        def middle(i, j):
            key = (min(i, j), max(i, j))
            if key not in mid:
                p = verts[i] + verts[j]
                verts.append(p / np.linalg.norm(p))
                mid[key] = len(verts) - 1
            return mid[key]
        for a, b, c in f:
            ab, bc, ca = middle(a, b), middle(b, c), middle(c, a)
            out += [[a, ab, ca], [b, bc, ab], [c, ca, bc], [ab, bc, ca]]
        f = out
    faces = np.array(f, np.int32)
    return M.Mesh(np.array(verts, np.float32), faces, np.ones((len(faces), 9), np.float32))


def soup(mesh: M.Mesh, flip_every: int = 0) -> M.Mesh:
    """The same triangles with every corner its own vertex (as the bunny's file); optionally every
    `flip_every`-th face wound the other way."""
    faces = mesh.faces.copy()
    if flip_every:
        faces[::flip_every] = faces[::flip_every, ::-1]
    verts = mesh.vertices[faces.reshape(-1)]
    return M.Mesh(verts, np.arange(len(verts), dtype=np.int32).reshape(-1, 3), mesh.corner_rgb)


def test_smooth_corner_normals_follow_the_surface_whatever_the_vertex_sharing_and_winding():
    sphere = icosphere(2)
    normals = M.corner_normals(sphere).reshape(-1, 3, 3)
    radial = sphere.vertices[sphere.faces]                       # unit sphere: the true normal is the position
    assert np.abs(np.einsum("fci,fci->fc", normals, radial)).min() > 0.995
    face = np.cross(radial[:, 1] - radial[:, 0], radial[:, 2] - radial[:, 0])
    face /= np.linalg.norm(face, axis=1, keepdims=True)
    assert np.abs(np.einsum("fi,fci->fc", face, radial)).min() < 0.99   # flat normals are visibly off
    flipped = normals.copy()
    flipped[::3] = flipped[::3, ::-1]                            # a flipped face lists its corners backwards
    for other, want in ((soup(sphere), normals), (soup(sphere, flip_every=3), flipped)):  # unshared; mixed winding
        got = M.corner_normals(other).reshape(-1, 3, 3)
        np.testing.assert_allclose(np.abs(np.einsum("fci,fci->fc", got, want)), 1.0, atol=1e-5)
    # Blocks of positions: a small pair budget gives the same normals.
    np.testing.assert_allclose(M.corner_normals(sphere, pair_block=7), M.corner_normals(sphere), atol=1e-6)


def test_creases_keep_hard_edges_and_bad_angles_are_named():
    v = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float32)
    quads = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]
    faces = np.array([t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))], np.int32)
    cube = M.Mesh(v, faces, np.ones((12, 9), np.float32))
    sharp = M.corner_normals(cube).reshape(-1, 3, 3)             # 90-degree edges > 60: each face flat
    face = np.cross(v[faces[:, 1]] - v[faces[:, 0]], v[faces[:, 2]] - v[faces[:, 0]])
    face /= np.linalg.norm(face, axis=1, keepdims=True)
    np.testing.assert_allclose(np.abs(np.einsum("fi,fci->fc", face, sharp)), 1.0, atol=1e-6)
    rounded = M.corner_normals(cube, crease_degrees=120.0).reshape(-1, 3, 3)
    corner_dir = v[faces] / np.sqrt(3.0)                         # all three faces at a corner averaged
    assert np.abs(np.einsum("fci,fci->fc", rounded, corner_dir)).min() > 0.9
    for bad in (-1.0, 200.0, "sixty", True):
        with pytest.raises(InputError, match="crease_degrees"):
            M.corner_normals(cube, crease_degrees=bad)
    with pytest.raises(InputError, match="shading.*smooth, flat"):
        M.render_rgba(cube, np.eye(4), 8, 8, 10.0, shading="phong")
    with pytest.raises(InputError, match="normals"):
        M.render_rgba(cube, M.look_at(np.array([0.0, 0.0, 4.0])), 8, 8, 10.0, normals=np.zeros((3, 9)))


def test_a_smooth_shaded_sphere_matches_lambert_and_a_flat_one_shows_facets():
    """An icosphere under a fixed light against the analytic sphere's shading, ambient + (1 - ambient) |n . l|
    at the pixel's hit point: interpolated normals come close, flat faces do not."""
    sphere, light, ambient, res, focal = icosphere(3), np.array([0.3, 0.5, 0.81]), 0.3, 48, 60.0
    c2w = M.look_at(np.array([0.0, 0.0, 4.0]))
    errors = {}
    for shading in M.SHADINGS:
        img = M.render_rgba(sphere, c2w, res, res, focal, supersample=1, ambient=ambient, light=tuple(light),
                            shading=shading).cpu().numpy()
        j, i = np.nonzero(img[..., 3] > 0.5)
        d = np.stack([(i + 0.5 - res / 2) / focal, -(j + 0.5 - res / 2) / focal, -np.ones_like(i, float)], 1)
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        origin = c2w[:3, 3]
        world_d = d @ c2w[:3, :3].T
        b = world_d @ origin
        t = -b - np.sqrt(np.maximum(b * b - (origin @ origin - 1.0), 0.0))
        n = origin + t[:, None] * world_d
        want = ambient + (1 - ambient) * np.abs(n @ (light / np.linalg.norm(light)))
        inner = (j - res / 2) ** 2 + (i - res / 2) ** 2 < (0.8 * focal / 4) ** 2   # away from the silhouette
        errors[shading] = float(np.abs(img[j, i, 0] - want)[inner].max())
    assert errors["smooth"] < 0.02 < errors["flat"]


def test_photometric_trainer_takes_adam_options_and_names_a_bad_one():
    from tinn.errors import ConfigError
    from tinn.scenes.data import PosedImages
    from tinn.scenes.fields import HashGridField
    from tinn.scenes.training.photometric import PhotometricTrainer

    white = torch.ones(3)
    data = PosedImages(images=white.expand(1, 4, 4, 3).contiguous(),
                       c2w=torch.tensor(M.look_at([0.0, 0.0, 3.0]), dtype=torch.float32)[None],
                       focal=4.0, width=4, height=4, near=0.5, far=6.0, box_min=-white, box_max=white,
                       background=white)
    field = HashGridField(-white, white, n_levels=2, log2_hashmap_size=8, base_resolution=4, finest_resolution=8,
                          n_neurons=16, n_hidden_layers=1)
    trainer = PhotometricTrainer(field, data, n_samples=4, batch_rays=16, learning_rate=1e-3, total_steps=10,
                                 adam_options={"beta2": 0.999, "l2_reg": 1e-6})
    adam = trainer.optimizer.nested
    assert (adam.beta2, adam.l2_reg, adam.beta1) == (0.999, 1e-6, 0.9)  # beta1 still the NeRF default
    with pytest.raises(ConfigError, match="betta2.*did you mean 'beta2'"):
        PhotometricTrainer(field, data, n_samples=4, batch_rays=16, learning_rate=1e-3, adam_options={"betta2": 0.9})


def test_surface_points_lie_on_the_triangles_in_proportion_to_their_area():
    # Two triangles in z = 0 and z = 1, the second with three times the area.
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [3, 0, 1], [0, 1, 1]], dtype=np.float32)
    f = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.int32)
    mesh = M.Mesh(v, f, np.ones((2, 9), dtype=np.float32))
    p = mesh.surface_points(40_000, seed=3).double()
    assert p.shape == (40_000, 3) and p.dtype == torch.float64
    top = p[:, 2] == 1
    assert bool(((p[:, 2] == 0) | top).all())
    assert abs(float(top.double().mean()) - 0.75) < 0.01
    # Inside each triangle (barycentric coordinates >= 0), and uniform: the first triangle's quarter nearest its
    # right angle (x + y < 1/2) holds a quarter of its points.
    low = p[~top]
    assert bool(((low[:, 0] >= 0) & (low[:, 1] >= 0) & (low[:, 0] + low[:, 1] <= 1 + 1e-6)).all())
    assert abs(float((low[:, 0] + low[:, 1] < 0.5).double().mean()) - 0.25) < 0.02
    high = p[top]
    assert bool(((high[:, 0] >= 0) & (high[:, 1] >= 0) & (high[:, 0] / 3 + high[:, 1] <= 1 + 1e-6)).all())
    assert torch.equal(mesh.surface_points(100, seed=1), mesh.surface_points(100, seed=1))
    assert mesh.surface_points(0).shape == (0, 3)
    for bad in (-1, 2.5, True):
        with pytest.raises(InputError, match="n="):
            mesh.surface_points(bad)
    flat = M.Mesh(np.zeros((3, 3), dtype=np.float32), np.array([[0, 1, 2]], dtype=np.int32),
                  np.ones((1, 9), dtype=np.float32))
    with pytest.raises(InputError, match="no area"):
        flat.surface_points(10)


def test_the_scale_preset_trains_a_close_up_capture_with_a_budget_per_node(tmp_path, monkeypatch):
    """`--scale` (here at CPU size): the glmark2 bunny by default, views on three spheres, every node within the
    per-node budget so the array grows with the tree, the held-out PSNR reported per camera distance; without a
    mesh and without the package it names what to pass."""
    import sys

    if not os.path.isfile(BUNNY):
        missing_package(f"{BUNNY} missing (Debian package glmark2-data)")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import octree_lod

    s = octree_lod.run(["--small", "--scale", "--test-views", "6", "--lod-factors", "1", "--out", str(tmp_path)])
    budget = octree_lod.SCALE_SMALL["node_budget"]
    assert len(s["nodes_per_level"]) == 3 and s["nodes"] == sum(s["nodes_per_level"]) > 9
    # One decoder for every node: each node's budget buys its grid, the decoder counted once.
    assert (s["decoder"], s["finest_share"]) == ("shared", 0.5) and budget // 2 < s["params_per_node"] <= budget
    assert 0 < s["params_total"] - s["nodes"] * s["params_per_node"] < s["params_per_node"]
    assert len(s["psnr_by_distance"]) >= 2
    # The timed frame's samples: within its rays' budget, and some evaluated
    assert 0 < s["samples_per_frame"] <= s["resolution"][0] * s["resolution"][1] * octree_lod.SCALE_SMALL["samples"]
    assert min(s["psnr_by_distance"].values()) > s["background_psnr"] + 6 and s["psnr"] > s["background_psnr"] + 8
    monkeypatch.setattr(octree_lod, "SCALE_MESH", str(tmp_path / "no_such_bunny.obj"))
    with pytest.raises(SystemExit, match="--mesh PATH"):
        octree_lod.run(["--small", "--scale", "--out", str(tmp_path / "none")])
