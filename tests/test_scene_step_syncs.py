"""KiloNeRF's training steps read no device value on the host (CPU; tests/test_host_sync_cuda.py checks CUDA).

Every read of a device value (`.item()`, `int(t)`, `bool(t)`, `torch.nonzero`, a boolean-mask index, ...)
stalls the host until the device drains, so the host's work and the device's add up instead of overlapping.
The reads are counted with a torch function mode at the points where torch hands a device value to Python.
The student runs on the tensor-core path (Triton's interpreter here), the path it takes on a GPU.
The fine-tuning step reads one count, the number of samples to evaluate, which it drew a step ahead; the
step before a grid update also reads the number of voxels the grid's previous update left occupied (started
by that update). The batches and results are those of updating the grid and drawing each batch in their own
step.
"""
import os
import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode

import tinn
from tinn.render import pending
from tinn.render.fields import shade
from tinn.scenes import ProceduralScene, render_views
from tinn.scenes.acceleration.occupancy import OccupancyGrid
from tinn.scenes.fields.kilonerf import KiloNeRF
from tinn.scenes.training import Distiller
from tinn.scenes.training.photometric import PhotometricTrainer, SceneTrainer

DEV = tinn.runtime.device()
READS = {"item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "tolist", "cpu", "numpy", "unique",
         "masked_select", "argwhere", "_local_scalar_dense"}
TINN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tinn")


class HostReads(TorchFunctionMode):
    """Records (op, tinn call site) of each read of a tensor's values by the host."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        mask_index = (name == "__getitem__" and len(args) > 1 and isinstance(args[1], torch.Tensor)
                      and args[1].dtype == torch.bool)
        if name in READS or mask_index:
            site = next((f"{os.path.relpath(f.filename, TINN)}:{f.name}" for f in reversed(traceback.extract_stack())
                         if f.filename.startswith(TINN)), "?")
            self.reads.append((name, site))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def tensor_core_student(tuned):
    """KiloNeRF's networks on the tensor-core path (a GPU's default for them), run by Triton's interpreter."""
    from tinn.networks.tensor_cores import unavailable_reason

    reason = unavailable_reason(tinn.runtime.arch(), None)
    if reason:
        pytest.skip(reason)
    tuned(kernels="tensor_cores")


@pytest.fixture
def counts_by_step(monkeypatch):
    """PendingCount's reads as (step its count was started in, step it was read in)."""
    clock, log = {"step": 0}, []
    started_init, value = pending.PendingCount.__init__, pending.PendingCount.value

    def init(self, count):
        started_init(self, count)
        self.started_in = clock["step"]

    def read(self):
        log.append((self.started_in, clock["step"]))
        return value(self)

    monkeypatch.setattr(pending.PendingCount, "__init__", init)
    monkeypatch.setattr(pending.PendingCount, "value", read)
    return clock, log


def sphere(p):
    return torch.where((p - 0.1).norm(dim=1) < 0.5, torch.full_like(p[:, 0], 20.0), torch.zeros_like(p[:, 0]))


class Sphere(torch.nn.Module):
    """An analytic teacher."""

    def __init__(self):
        super().__init__()
        self.register_buffer("box_min", torch.full((3,), -1.0, device=DEV))
        self.register_buffer("box_max", torch.full((3,), 1.0, device=DEV))

    def forward(self, points):
        return sphere(points), (points * 0.5 + 0.5).clamp(0.0, 1.0)


def test_distillation_steps_read_nothing_from_the_device(tensor_core_student):
    teacher = Sphere()
    grid = OccupancyGrid.from_density(sphere, teacher.box_min, teacher.box_max, 8, threshold=1.0)
    student = KiloNeRF(teacher.box_min, teacher.box_max, grid=2, n_frequencies=2, n_neurons=16, n_hidden_layers=1,
                       occupancy=grid, seed=3)
    assert student.networks.network.path == "tensor_cores"
    distiller = Distiller(student, teacher, grid, step_size=0.05, batch=256, learning_rate=1e-2)
    first = distiller.step()  # lists the occupied voxels (one read, kept while the grid stays as it is)
    with HostReads() as mode:
        for _ in range(3):
            distiller.step()
    assert mode.reads == []
    later = [float(distiller.step()) for _ in range(20)]  # it trains (one step's batch is noisy: a mean)
    assert sum(later[-5:]) / 5 < float(first)


class OldLoss(PhotometricTrainer):
    """Each step updates the grid when it is due, then draws its own batch and waits for its sample count: the
    plain order of a step, which PhotometricTrainer's step and loss reorder."""

    def step(self):
        if self._updates_at(self.trainer.step):
            with tinn.checks.disabled():
                self.occupancy.update(self.field.density, self.occupancy_threshold, generator=self.generator)
        return SceneTrainer.step(self)

    def loss(self):
        batch = self.draw_batch()
        out = shade(self.field, batch.samples, batch.background)
        return ((out.rgb - batch.colors) ** 2).mean()


def fine_tuning(cls, data, occupancy_every=3, total_steps=None):
    box_min, box_max = data.box_min.to(DEV), data.box_max.to(DEV)
    teacher_grid = OccupancyGrid.from_density(ProceduralScene().density, box_min, box_max, 8, threshold=1.0)
    student = KiloNeRF(box_min, box_max, grid=2, n_frequencies=2, n_neurons=16, n_hidden_layers=1, seed=4)
    grid = OccupancyGrid.tracking(box_min, box_max, 8, within=teacher_grid)
    return cls(student, data, n_samples=12, batch_rays=48, learning_rate=1e-2, occupancy=grid,
               occupancy_threshold=1.0, occupancy_every=occupancy_every, total_steps=total_steps, seed=5)


def test_fine_tuning_steps_read_only_the_count_drawn_a_step_ahead(tensor_core_student, counts_by_step):
    clock, counts = counts_by_step
    data = render_views(ProceduralScene(), 2, 10, 10, seed=1, n_samples=32)
    tuner = fine_tuning(PhotometricTrainer, data)
    assert tuner.field.networks.network.path == "tensor_cores"
    tuner.step()  # compiles; updates the grid (step 0)
    for step in range(1, 7):
        clock["step"] = step
        del counts[:]
        with HostReads() as mode:
            tuner.step()
        # Every step, update steps (3, 6) included, evaluates the batch drawn in the step before.
        if (step + 1) % 3:
            assert mode.reads == [("__int__", "render/pending.py:value")] and counts == [(step - 1, step)]
        else:  # and runs the next step's grid update, which lists the voxels the previous update left occupied
            assert mode.reads == [("__int__", "render/pending.py:value")] * 2
            assert counts == [(step - 1, step), (max(step - 3, 0), step)]
    assert tuner.occupancy.updates == 3  # steps 0, 3 and 6


def test_tracking_updates_only_issue_device_work(counts_by_step):
    """After the grid is built (it lists the voxels `within` allows), an update reads only the count of occupied
    voxels the update before started on its way to the host, evaluates each of those voxels plus a fixed random
    share of the allowed ones, and never one outside `within`."""
    clock, counts = counts_by_step
    lo, hi, res = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV), 8
    teacher_grid = OccupancyGrid.from_density(sphere, lo, hi, res, threshold=1.0, dilate=1)
    grid = OccupancyGrid.tracking(lo, hi, res, within=teacher_grid)
    allowed = teacher_grid.occupied.reshape(-1)
    n_allowed = int(allowed.sum())
    evaluated = []

    def field(p):  # the sphere, moving a little each update
        q, _ = grid.voxel_of(p)
        evaluated.append((q * torch.tensor([res * res, res, 1], device=DEV)).sum(dim=1))
        return sphere(p - 0.05 * clock["step"])

    gen = torch.Generator(device=DEV).manual_seed(0)
    with HostReads() as mode:
        grid.update(field, threshold=1.0, random_share=0.25, generator=gen)
    assert mode.reads == [] and torch.equal(evaluated[0].sort().values, torch.nonzero(allowed).reshape(-1))
    for update in range(1, 4):
        clock["step"] = update
        before = grid.occupied.reshape(-1).clone()
        del evaluated[:], counts[:]
        with HostReads() as mode:
            grid.update(field, threshold=1.0, random_share=0.25, generator=gen)
        assert mode.reads == [("__int__", "render/pending.py:value")] and counts == [(update - 1, update)]
        cells = torch.cat(evaluated)
        assert cells.numel() == int(before.sum()) + round(0.25 * n_allowed)
        assert bool(allowed[cells].all())  # only voxels within the teacher's grid
        assert bool(torch.isin(torch.nonzero(before).reshape(-1), cells).all())  # every occupied voxel
        assert 0 < int(grid.occupied.sum()) < n_allowed
    # A grid edited between updates: its occupied voxels are listed to the allowed count (padded), no read.
    assert not bool(allowed[0])
    grid.occupied[0, 0, 0] = True  # not allowed: never evaluated nor occupied
    edited = grid.occupied.reshape(-1) & allowed
    del evaluated[:]
    with HostReads() as mode:
        grid.update(field, threshold=1.0, random_share=0.25, generator=gen)
    cells = torch.cat(evaluated)
    assert mode.reads == [] and cells.numel() == n_allowed + round(0.25 * n_allowed)
    assert bool(allowed[cells].all()) and bool(torch.isin(torch.nonzero(edited).reshape(-1), cells).all())
    assert not bool(grid.occupied[0, 0, 0])


def test_fine_tuning_drawn_ahead_trains_as_drawn_in_each_step():
    """The same batches, random numbers, grid updates, losses and parameters as updating the grid and drawing
    each step's batch in the step itself, through the planned steps (6) and past them."""
    data = render_views(ProceduralScene(), 2, 10, 10, seed=2, n_samples=32)
    ahead, own = fine_tuning(PhotometricTrainer, data, total_steps=6), fine_tuning(OldLoss, data, total_steps=6)
    for step in range(9):
        assert torch.equal(ahead.step(), own.step()), step
        # The plan's last step leaves the grid as it is (step 6 updates it itself, at its start).
        assert ahead.occupancy.updates == own.occupancy.updates + (step in (2, 8)), step
    for a, b in zip(ahead.field.parameters(), own.field.parameters()):
        assert torch.equal(a, b)
    own.step()  # step 9 updates the grid as the step before did for it
    assert ahead.occupancy.updates == own.occupancy.updates
    assert torch.equal(ahead.occupancy.occupied, own.occupancy.occupied)
    assert torch.equal(ahead.occupancy.density, own.occupancy.density)
    # A grid changed between steps: the batch drawn ahead is dropped, the step samples the new grid.
    ahead.occupancy.occupied[0, 0, 0] = not bool(ahead.occupancy.occupied[0, 0, 0])
    drawn = ahead._ahead
    ahead.step()
    assert drawn is not None and ahead._ahead is not drawn
    # Back to step 0, which updates the grid itself (the update run ahead was for the step before the reset).
    updates = ahead.occupancy.updates
    ahead.reset()
    assert ahead._ahead is None
    ahead.step()
    assert ahead.occupancy.updates == updates + 1


def test_occupied_voxels_are_listed_once_per_grid_state():
    lo, hi = torch.full((3,), -1.0, device=DEV), torch.full((3,), 1.0, device=DEV)
    grid = OccupancyGrid.from_density(sphere, lo, hi, 8, threshold=1.0, dilate=0)
    listed = grid.occupied_voxels()
    assert torch.equal(listed, torch.nonzero(grid.occupied.reshape(-1)).reshape(-1))
    with HostReads() as mode:
        assert grid.occupied_voxels() is listed
        grid.sample(100, torch.Generator(device=DEV).manual_seed(0))
    assert mode.reads == []
    grid.occupied[0, 0, 0] = True  # written in place: listed anew
    assert int(grid.occupied_voxels()[0]) == 0 and grid.occupied_voxels().numel() == listed.numel() + 1
    tracked = OccupancyGrid.tracking(lo, hi, 8)
    fraction = tracked.update(sphere, threshold=1.0, generator=torch.Generator(device=DEV).manual_seed(0))
    assert isinstance(fraction, torch.Tensor) and float(fraction) == tracked.occupied_fraction()
    assert 0.0 < float(fraction) < 1.0
