"""KiloNeRF: cell routing, occupancy grid, empty-space skipping, distillation, the demo end to end (CPU)."""
import importlib.util
import json
import os

import pytest
import torch

import tinn
from tinn.errors import InputError
from tinn.scenes import ProceduralScene
from tinn.scenes.fields.kilonerf import KiloNeRF, cell_of
from tinn.scenes.acceleration.occupancy import OccupancyGrid
from tinn.render import render_image
from tinn.scenes.training import Distiller
from tinn.viewer.orbit import OrbitCamera

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DEV = tinn.runtime.device()


@pytest.fixture
def one_torch_thread():
    # Taichi's CPU thread pool and torch's OpenMP threads compete for this machine's cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class AnalyticField(torch.nn.Module):
    """A field (training.py's protocol) from analytic density/colour functions: a known teacher."""

    def __init__(self, density, color, box_min=(-1.0, -1.0, -1.0), box_max=(1.0, 1.0, 1.0)):
        super().__init__()
        self.density_fn, self.color_fn = density, color
        self.register_buffer("box_min", torch.tensor(box_min, device=DEV))
        self.register_buffer("box_max", torch.tensor(box_max, device=DEV))

    def forward(self, points):
        return self.density_fn(points), self.color_fn(points)


def sphere_density(centre, radius, value=10.0):
    c = torch.tensor(centre, device=DEV)
    return lambda p: torch.where((p - c).norm(dim=1) < radius, torch.full_like(p[:, 0], value),
                                 torch.zeros_like(p[:, 0]))


# ---- cell routing ---------------------------------------------------------------------------------

def test_cell_of_known_points():
    lo, hi = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV)
    pts = torch.tensor([[-1.0, -1.0, -1.0],    # first corner: cell 0
                        [0.1, -0.6, 0.9],      # cell (2, 0, 3) of 4: scaled (2.2, 0.8, 3.8)
                        [1.0, 1.0, 1.0],       # box_max belongs to the last cell
                        [0.0, 0.0, 0.0],       # on faces: the upper cell (2, 2, 2)
                        [1.5, 0.0, -0.25],     # outside in x: flagged, clamped to ix = 3
                        [-0.75, -2.0, 0.3]], device=DEV)   # outside in y
    c = cell_of(pts, lo, hi, 4)
    assert c.ids.dtype == torch.int32
    assert c.ids.tolist() == [0, (2 * 4 + 0) * 4 + 3, 63, (2 * 4 + 2) * 4 + 2, (3 * 4 + 2) * 4 + 1,
                              (0 * 4 + 0) * 4 + 2]
    expected_local = torch.tensor([[-1.0, -1.0, -1.0], [-0.6, 0.6, 0.6], [1.0, 1.0, 1.0], [-1.0, -1.0, -1.0],
                                   [1.0, -1.0, 0.0], [0.0, -1.0, 0.2]], device=DEV)
    assert torch.allclose(c.local, expected_local, atol=1e-5)
    assert c.inside.tolist() == [True, True, True, True, False, False]


def test_cell_of_non_cubic_box():
    lo, hi = torch.tensor([0.0, 0.0, 0.0], device=DEV), torch.tensor([2.0, 1.0, 4.0], device=DEV)
    c = cell_of(torch.tensor([[1.5, 0.25, 1.0]], device=DEV), lo, hi, 2)  # cell sizes (1, 0.5, 2): cell (1, 0, 0)
    assert c.ids.tolist() == [4]
    assert torch.allclose(c.local, torch.zeros(1, 3, device=DEV), atol=1e-6)


def test_the_cell_kernel_matches_cell_of():
    model = KiloNeRF(torch.tensor([-1.0, -0.5, 0.0], device=DEV), torch.tensor([1.0, 1.5, 3.0], device=DEV), grid=5)
    gen = torch.Generator().manual_seed(3)
    pts = torch.rand(5000, 3, generator=gen) * torch.tensor([2.6, 2.6, 3.6]) + torch.tensor([-1.3, -0.8, -0.3])
    faces = torch.tensor([[-1.0, -0.5, 0.0], [1.0, 1.5, 3.0], [0.2, 0.3, 1.2], [-0.6, 0.7, 2.4]])  # on faces
    pts = torch.cat([pts, faces, torch.tensor([[float("nan"), 0.0, 1.0]])]).to(DEV)
    want = model.cell_of(pts[:-1])
    got = model.network_inputs(pts)
    assert torch.equal(got.ids[:-1], want.ids) and torch.equal(got.inside[:-1], want.inside)
    assert not bool(got.inside[-1])
    if DEV.type == "cpu":
        assert torch.equal(got.local[:-1], want.local * 0.5)
    else:  # CUDA's fast math may round the local coordinates differently in the last bit
        assert float((got.local[:-1] - want.local * 0.5).abs().max()) < 2e-6
    assert 0.2 < float(want.inside.float().mean()) < 0.9   # both inside and outside points were tried


def test_each_network_models_only_its_cell():
    model = KiloNeRF((-1, -1, -1), (1, 1, 1), grid=2, seed=3)
    gen = torch.Generator().manual_seed(0)
    pts = (torch.rand(512, 3, generator=gen) * 2 - 1).to(DEV)
    raw = model.raw(pts)
    # One launch for all cells == each cell's network on its own samples.
    cells = model.cell_of(pts)
    for cell in range(model.n_networks):
        mine = cells.ids == cell
        ids = torch.full((int(mine.sum()),), cell, dtype=torch.int32, device=DEV)
        own = model.networks(cells.local[mine] * 0.5, ids)
        assert torch.allclose(raw[mine], own, atol=1e-6)
    # Changing network 5 changes the outputs of cell 5's points only.
    with torch.no_grad():
        model.networks.network.params[5].mul_(-1.5)
    changed = (model.raw(pts) - raw).abs().amax(dim=1) > 1e-6
    assert changed.any()
    assert torch.equal(changed, cells.ids == 5)
    # Outside the box: zero density.
    with torch.no_grad():
        sigma, rgb = model(torch.tensor([[0.5, 0.5, 1.2], [0.5, 0.5, 0.9]], device=DEV))
    assert float(sigma[0]) == 0.0 and float(sigma[1]) > 0.0
    assert rgb.shape == (2, 3) and bool(((rgb > 0) & (rgb < 1)).all())


def test_bad_input():
    lo, hi = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV)
    for grid in (0, 65, 2.5, True):
        with pytest.raises(InputError, match="grid"):
            KiloNeRF(lo, hi, grid=grid)
    with pytest.raises(InputError, match=r"points must have shape \(M, 3\)"):
        cell_of(torch.zeros(4, 2, device=DEV), lo, hi, 4)
    with pytest.raises(InputError, match="points has dtype torch.float64"):
        cell_of(torch.zeros(4, 3, dtype=torch.float64, device=DEV), lo, hi, 4)
    with pytest.raises(InputError, match="box_max must exceed box_min"):
        KiloNeRF(hi, lo, grid=2)
    with pytest.raises(InputError, match="box_min must have 3 entries"):
        KiloNeRF((0.0, 0.0), hi, grid=2)
    model = KiloNeRF(lo, hi, grid=2)
    with pytest.raises(InputError, match=r"points must have shape \(M, 3\)"):
        model(torch.zeros(3, device=DEV))
    with pytest.raises(InputError, match="resolution"):
        OccupancyGrid.from_density(sphere_density((0, 0, 0), 0.5), lo, hi, 0, 1.0)
    with pytest.raises(InputError, match="cubic"):
        OccupancyGrid(torch.zeros(4, 4, 2, dtype=torch.bool, device=DEV), lo, hi)
    with pytest.raises(InputError, match="c2w must be a"):
        render_image(model, torch.eye(3, device=DEV), 4, 4, 4.0)


# ---- occupancy and empty-space skipping ---------------------------------------------------------------

def test_occupancy_grid_of_a_sphere():
    lo, hi = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV)
    centre, radius, res = torch.tensor([0.1, -0.2, 0.05], device=DEV), 0.45, 16
    density = sphere_density(centre.tolist(), radius)
    idx = torch.stack(torch.meshgrid(*[torch.arange(res, device=DEV)] * 3, indexing="ij"), dim=-1).float()
    voxel = 2.0 / res
    centres = lo + (idx + 0.5) * voxel
    centre_inside = (centres - centre).norm(dim=-1) < radius
    # The nearest point of each voxel to the sphere centre: a voxel can only hold density if it is within radius.
    nearest = torch.maximum(torch.minimum(centre, centres + voxel / 2), centres - voxel / 2)
    touches = (nearest - centre).norm(dim=-1) < radius

    exact = OccupancyGrid.from_density(density, lo, hi, res, threshold=1.0, n_jitter=1, dilate=0)
    assert torch.equal(exact.occupied, centre_inside)  # one point per voxel: its centre
    jittered = OccupancyGrid.from_density(density, lo, hi, res, threshold=1.0, n_jitter=16, dilate=0)
    assert bool((jittered.occupied >= centre_inside).all())   # the centre is one of the points
    assert bool((jittered.occupied <= touches).all())         # never a voxel the sphere misses
    assert int(jittered.occupied.sum()) > int(centre_inside.sum())  # boundary voxels found by jitter
    dilated = OccupancyGrid.from_density(density, lo, hi, res, threshold=1.0, n_jitter=1, dilate=1)
    grown = torch.nn.functional.max_pool3d(centre_inside[None, None].float(), 3, 1, 1)[0, 0] > 0
    assert torch.equal(dilated.occupied, grown)
    # Queries and samples agree with the voxels.
    assert exact.query(torch.tensor([[0.1, -0.2, 0.05], [0.9, 0.9, 0.9], [2.0, -0.2, 0.05]], device=DEV)).tolist() == \
        [True, False, False]
    samples = exact.sample(2000, torch.Generator(device=DEV).manual_seed(1))  # draws on the grid's device
    assert bool(exact.query(samples).all())
    assert abs(exact.occupied_fraction() - float(centre_inside.float().mean())) < 1e-7


def test_skipping_leaves_the_image_unchanged():
    """Where the occupancy grid says empty the density is 0: skipping those samples changes nothing."""
    scene_density = sphere_density((0.0, 0.1, -0.1), 0.5, value=8.0)
    field = AnalyticField(scene_density, lambda p: (p * 0.5 + 0.5).clamp(0, 1))
    occ = OccupancyGrid.from_density(scene_density, field.box_min, field.box_max, 16, threshold=0.0, dilate=1)
    c2w = torch.eye(4, device=DEV)
    c2w[2, 3] = 3.0  # on +z looking down -z at the origin
    bg = torch.tensor([1.0, 1.0, 1.0], device=DEV)
    full = render_image(field, c2w, 20, 20, 24.0, n_samples=48, background=bg, occupancy=None, early_stop=0.0)
    skip = render_image(field, c2w, 20, 20, 24.0, n_samples=48, background=bg, occupancy=occ, early_stop=0.0)
    assert torch.allclose(full.rgb, skip.rgb, atol=1e-6)
    assert full.n_evaluated == full.n_candidates and skip.n_candidates == full.n_candidates
    assert 0.5 < skip.skipped_fraction < 1.0
    assert float(full.opacity.amax()) > 0.9 and float(full.opacity.amin()) == 0.0  # both sphere and background


@pytest.mark.parametrize("chunk", [1 << 18, 37])
def test_marched_render_matches_the_dense_sampler_and_early_termination_is_bounded(chunk):
    """render_image (marching kernels, runs, early termination) against render_rays' dense torch sampler with
    occupancy masking on the same rays and samples."""
    from tinn.render import render_rays
    from tinn.render import camera_rays

    scene_density = sphere_density((0.1, 0.0, -0.1), 0.45, value=40.0)   # nearly opaque: rays end early
    field = AnalyticField(scene_density, lambda p: (p * 0.5 + 0.5).clamp(0, 1))
    occ = OccupancyGrid.from_density(scene_density, field.box_min, field.box_max, 16, threshold=0.0, dilate=1)
    c2w = torch.eye(4, device=DEV)
    c2w[0, 3], c2w[2, 3] = 0.3, 2.5
    bg = torch.tensor([0.2, 0.9, 0.4], device=DEV)
    origins, directions = camera_rays(c2w, 24, 20, 22.0)
    want = render_rays(field, origins, directions, 64, bg, occupancy=occ)
    exact = render_image(field, c2w, 24, 20, 22.0, n_samples=64, background=bg, occupancy=occ, chunk=chunk,
                         early_stop=0.0)
    assert torch.allclose(exact.rgb.reshape(-1, 3), want.rgb, atol=1e-6)
    assert torch.allclose(exact.opacity.reshape(-1), want.opacity, atol=1e-6)
    assert exact.n_evaluated == want.n_evaluated and exact.n_candidates == int(want.n_candidates)
    for early_stop, segments in ((1e-2, 4), (1e-4, 8), (1e-4, 64)):
        fast = render_image(field, c2w, 24, 20, 22.0, n_samples=64, background=bg, occupancy=occ, chunk=chunk,
                            early_stop=early_stop, segments=segments)
        assert float((fast.rgb.reshape(-1, 3) - want.rgb).abs().max()) <= early_stop + 1e-6
        assert fast.n_evaluated < 0.8 * want.n_evaluated   # the back halves of the hit rays were never marched
    with pytest.raises(InputError, match="segments"):
        render_image(field, c2w, 4, 4, 22.0, n_samples=8, segments=9)
    with pytest.raises(InputError, match="early_stop"):
        render_image(field, c2w, 4, 4, 22.0, n_samples=8, early_stop=1.0)


# ---- distillation -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_distillation_reduces_student_teacher_error(one_torch_thread):
    scene = ProceduralScene()
    teacher = AnalyticField(scene.density, scene.color)
    occ = OccupancyGrid.from_density(scene.density, teacher.box_min, teacher.box_max, 16, threshold=1.0)
    student = KiloNeRF(teacher.box_min, teacher.box_max, grid=2, n_frequencies=4, occupancy=occ, seed=5)
    distiller = Distiller(student, teacher, occ, step_size=2 * 3 ** 0.5 / 32, batch=4096, learning_rate=1e-2,
                          total_steps=150)
    before = distiller.error()
    for _ in range(150):
        distiller.step()
    after = distiller.error()
    # Measured (student seeds 5-7): alpha RMS 0.40 -> 0.045, colour RMS 0.28-0.33 -> 0.039.
    assert before["alpha_rms"] > 0.3 and before["rgb_rms"] > 0.2
    assert after["alpha_rms"] < 0.07 and after["alpha_rms"] < before["alpha_rms"] / 4
    assert after["rgb_rms"] < 0.07 and after["rgb_rms"] < before["rgb_rms"] / 3


# ---- the demo end to end ---------------------------------------------------------------------------------

def load_demo():
    spec = importlib.util.spec_from_file_location("kilonerf_demo", os.path.join(ROOT, "demos", "kilonerf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = ["--small", "--grid", "4", "--views", "16", "--res", "24", "--test-views", "2", "--samples", "24",
        "--batch-rays", "256", "--teacher-steps", "150", "--distill-steps", "100", "--distill-batch", "4096",
        "--finetune-steps", "60", "--occupancy-res", "16", "--seed", "0"]


@pytest.mark.slow
def test_demo_teacher_distill_finetune(tmp_path):
    summary = load_demo().run(TINY + ["--out", str(tmp_path)])
    # Measured with --seed 0: teacher 28.3 dB, student 24.9 dB after distillation and 27.1 dB after fine-tuning,
    # background only 9.35 dB (seeds 1 and 2: teacher 26.4 / 28.3, student 25.4 / 26.6).
    assert summary["psnr_background"] < 10.0
    assert summary["psnr_teacher"] > 25.5
    assert summary["psnr_student"] > 24.5
    assert summary["psnr_student"] > summary["psnr_student_distilled"]  # fine-tuning through the compositor helps
    assert summary["psnr_student"] > summary["psnr_background"] + 14.0
    assert summary["n_networks"] == 64
    assert 0.3 < summary["skipped_fraction"] < 1.0
    assert summary["param_bytes_student"] == 64 * (24 * 32 + 32 * 32 + 32 * 4) * 4
    for phase in ("teacher", "occupancy", "distill", "finetune"):
        assert summary["time_s"][phase] > 0
    assert all(v > 0 for v in summary["frames_per_second"].values())
    for name in ("heldout_student.png", "heldout_teacher.png", "heldout_truth.png", "summary.json"):
        assert (tmp_path / name).exists()
    assert json.loads((tmp_path / "summary.json").read_text())["psnr_student"] == summary["psnr_student"]


def test_demo_in_the_headless_viewer(tmp_path, monkeypatch):
    monkeypatch.setenv("TINN_VIEWER_BACKEND", "png")
    argv = TINY + ["--teacher-steps", "4", "--distill-steps", "3", "--finetune-steps", "3", "--gui", "--headless",
                   "--frame-every", "5", "--out", str(tmp_path)]
    demo = load_demo()
    seen, render_from = [], demo.KiloNeRFPipeline.render_from

    def spy(pipe, c2w):  # the orbit camera's renders, with the held-out view they start from
        if not seen:  # from the held-out pose, render_from is render()
            assert torch.equal(render_from(pipe, pipe.test.c2w[0]), pipe.render())
        seen.append((c2w.clone(), pipe.test.c2w[0].cpu(), render_from(pipe, c2w).cpu(), pipe.render().cpu()))
        return seen[-1][2]

    monkeypatch.setattr(demo.KiloNeRFPipeline, "render_from", spy)
    summary = demo.run(argv)
    assert summary["viewer"]["steps"] == 10
    assert len(summary["viewer"]["frames"]) >= 2 and all(os.path.exists(f) for f in summary["viewer"]["frames"])
    assert summary["steps"] == {"teacher": 4, "distill": 3, "finetune": 3}
    # Headless frames after the first orbit the scene, 15 degrees each, around the box centre (the origin).
    assert len(seen) == len(summary["viewer"]["frames"]) - 1
    start = OrbitCamera.from_c2w(seen[0][1])
    for c2w, _, image, heldout in seen:
        start.rotate(15.0)
        assert torch.allclose(c2w, start.c2w(), atol=1e-5)
        assert not torch.equal(image, heldout)  # another pose, another picture


def test_demo_rejects_bad_arguments(capsys):
    demo = load_demo()
    for argv, field in ((["--grid", "0"], "--grid"), (["--teacher-steps", "-1"], "--teacher-steps"),
                        (["--hidden-layers", "0"], "--hidden-layers"), (["--finetune-rays", "0"], "--finetune-rays"),
                        (["--finetune-final-lr-factor", "0"], "--finetune-final-lr-factor"),
                        (["--finetune-final-lr-factor", "1.5"], "--finetune-final-lr-factor")):
        with pytest.raises(SystemExit):
            demo.parse_args(argv)
        assert field in capsys.readouterr().err


def test_demo_fine_tunes_with_its_own_rays_depth_and_final_rate(tmp_path):
    demo = load_demo()
    args = demo.parse_args(TINY + ["--teacher-steps", "2", "--distill-steps", "2", "--finetune-steps", "4",
                                   "--hidden-layers", "3", "--finetune-rays", "96", "--finetune-lr", "4e-3",
                                   "--finetune-final-lr-factor", "0.25", "--out", str(tmp_path)])
    demo.start_script(args)
    pipe = demo.KiloNeRFPipeline(args, *demo.load_data(args))
    assert pipe.trainers["teacher"].batch_rays == 256
    # 64 cells, each 24 Frequency features -> 32 -> 32 -> 32 -> 4
    assert pipe.student.networks.memory_bytes() == 64 * (24 * 32 + 2 * 32 * 32 + 32 * 4) * 4
    pipe.run_phase()
    pipe.run_phase()
    tuner = pipe.trainers["finetune"]
    assert tuner.batch_rays == 96
    assert tuner.learning_rate == pytest.approx(4e-3, rel=1e-6)
    pipe.run_phase()
    assert pipe.phase == "done"
    # The rate decays by 0.25^(1/4) before each step after the first (decaying_adam): the 4th used 0.25^(3/4).
    assert tuner.learning_rate == pytest.approx(4e-3 * 0.25 ** 0.75, rel=1e-5)


def test_a_rendered_field_has_no_density_where_its_grid_is_empty():
    """Distillation's teacher: the trained field seen through the grid it trained with."""
    from tinn.scenes.fields import HashGridField, RenderedField

    lo, hi = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV)
    teacher = HashGridField(lo, hi, n_levels=2, log2_hashmap_size=8, base_resolution=4, finest_resolution=8,
                            n_neurons=16, n_hidden_layers=1, seed=3)
    grid = OccupancyGrid.from_density(sphere_density([0.3, 0.0, 0.0], 0.5), lo, hi, 8, threshold=1.0, dilate=0)
    seen = RenderedField(teacher, grid)
    points = torch.rand(4096, 3, device=DEV) * 2.0 - 1.0
    sigma, rgb = teacher(points)
    got_sigma, got_rgb = seen(points)
    inside = grid.query(points)
    assert inside.any() and (~inside).any()
    assert torch.equal(got_sigma[inside], sigma[inside]) and bool((got_sigma[~inside] == 0).all())
    assert torch.equal(got_rgb, rgb) and torch.equal(seen.density(points), got_sigma)
    assert torch.equal(seen.box_min, lo) and torch.equal(seen.box_max, hi)


def test_tracking_within_a_grid_only_sheds_voxels():
    """A student fine-tunes in a grid that tracks it within its teacher's grid: it starts as that grid, never
    evaluates or occupies a voxel outside it, and drops the voxels where the field's density stays faint."""
    lo, hi, res = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV), 8
    solid, faint = sphere_density([-0.4, -0.4, -0.4], 0.45), sphere_density([0.5, 0.5, 0.5], 0.35)
    teacher_grid = OccupancyGrid.from_density(lambda p: solid(p) + faint(p), lo, hi, res, threshold=1.0,
                                              n_jitter=32, dilate=0)
    grid = OccupancyGrid.tracking(lo, hi, res, within=teacher_grid)
    assert torch.equal(grid.occupied, teacher_grid.occupied)
    seen = []

    def student(p):  # solid where the teacher was, faint in the second sphere, dense outside the teacher's grid
        inside = teacher_grid.query(p)
        seen.append(inside)
        return solid(p) + 0.01 * faint(p) + 50.0 * (~inside).float()

    gen = torch.Generator(device=DEV).manual_seed(0)
    for _ in range(6):
        grid.update(student, threshold=1.0, decay=0.5, random_share=1.0, generator=gen)
        assert not bool((grid.occupied & ~teacher_grid.occupied).any())
    assert all(bool(s.all()) for s in seen)  # only voxels of the teacher's grid were evaluated
    solid_grid = OccupancyGrid.from_density(solid, lo, hi, res, threshold=1.0, n_jitter=32, dilate=0)
    assert grid.occupied.any() and bool((grid.occupied <= solid_grid.occupied).all())
    assert int(grid.occupied.sum()) < int(teacher_grid.occupied.sum())  # the faint sphere's voxels are gone
    with pytest.raises(InputError, match="resolution"):
        OccupancyGrid.tracking(lo, hi, res * 2, within=teacher_grid)
    with pytest.raises(InputError, match="box"):
        OccupancyGrid.tracking(lo, 2 * hi, res, within=teacher_grid)
    with pytest.raises(InputError, match="OccupancyGrid"):
        OccupancyGrid.tracking(lo, hi, res, within=teacher_grid.occupied)


def test_tracking_occupancy_follows_a_changing_field():
    """instant-ngp's density grid: every voxel starts occupied, the first update evaluates all of them,
    density a field stops producing decays away, new density is found by the random share."""
    lo, hi, res = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV), 8
    grid = OccupancyGrid.tracking(lo, hi, res)
    assert grid.occupied_fraction() == 1.0
    big = sphere_density([0.0, 0.0, 0.0], 0.9)
    small = sphere_density([0.5, 0.5, 0.5], 0.3)
    gen = torch.Generator(device=DEV).manual_seed(0)  # update draws on the grid's device
    grid.update(big, threshold=1.0, decay=0.5, generator=gen)
    after_big = grid.occupied.clone()
    assert 0.2 < grid.occupied_fraction() < 0.8
    for _ in range(8):  # 10 * 0.5^8 < 1: the big sphere's density has decayed below the threshold
        grid.update(small, threshold=1.0, decay=0.5, random_share=1.0, generator=gen)
    # The voxels the small sphere reaches, exactly (a sampled reference misses the ones it only grazes).
    corner = lo + (hi - lo) / res * torch.stack(torch.meshgrid(*[torch.arange(res, device=DEV)] * 3,
                                                               indexing="ij"), dim=-1)
    centre = torch.tensor([0.5, 0.5, 0.5], device=DEV)
    nearest = torch.minimum(torch.maximum(centre, corner), corner + (hi - lo) / res)
    reference = OccupancyGrid((nearest - centre).norm(dim=-1) < 0.3, lo, hi)
    assert bool((grid.occupied <= reference.occupied).all())   # only voxels the small sphere reaches
    assert grid.occupied.any() and not bool((grid.occupied & ~reference.occupied).any())
    assert int(grid.occupied.sum()) < int(after_big.sum())
    # A young field below the threshold everywhere keeps its denser part (the threshold is capped at the mean).
    young = OccupancyGrid.tracking(lo, hi, res)
    young.update(lambda p: 1e-3 * (p[:, 0] + 1.0), threshold=1.0, generator=gen)
    assert 0.3 < young.occupied_fraction() < 0.7
    with pytest.raises(InputError, match="tracking grid"):
        reference.update(small, threshold=1.0)
    with pytest.raises(InputError, match="decay"):
        young.update(small, threshold=1.0, decay=1.0)


def test_the_teachers_precision_follows_the_demo_option_and_the_settings(tuned):
    """--teacher-precision: a named precision reaches the teacher's network; "auto" is float16 on CUDA unless
    the settings name a precision, and the settings' choice elsewhere."""
    from tinn.scenes.fields import HashGridField
    demo = load_demo()
    lo, hi = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV)
    cuda = tinn.runtime.arch() == "cuda"
    assert demo.teacher_precision("float32") == "float32"
    tuned(precision="auto")
    assert demo.teacher_precision("auto") == ("float16" if cuda else None)
    tuned(precision="float32")
    assert demo.teacher_precision("auto") is None
    for precision in ("float32", None):
        field = HashGridField(lo, hi, n_levels=2, log2_hashmap_size=8, base_resolution=4, finest_resolution=8,
                              n_neurons=16, n_hidden_layers=1, precision=precision)
        assert field.model.network.precision == "float32"
    with pytest.raises(tinn.ConfigError, match="precision"):
        HashGridField(lo, hi, n_levels=2, log2_hashmap_size=8, base_resolution=4, finest_resolution=8,
                      n_neurons=16, n_hidden_layers=1, precision="float64")
