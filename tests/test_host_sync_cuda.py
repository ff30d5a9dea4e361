"""Training and inference steps on CUDA issue no host sync once the input checks are off.

A sync in a step stalls the host until the GPU has drained, so the next step's kernels reach an idle GPU
late: the step's wall time becomes its GPU time plus the host's issue time, instead of the larger of the two.
torch's sync debug mode raises on every torch operation that waits for the device (`.item()`, `int(t)`, a
tensor built from host data); the steps run under it with checks off, as the demos' training loops do.
"""
import contextlib

import pytest
import torch

import tinn
from tinn.networks import NetworkArray
from tinn.trainer import Trainer

# The steps run in the default precision (float16 for arrays the tensor cores take), whose dynamic gradient
# scaling decides on the device whether to skip a step.
pytestmark = [pytest.mark.skipif(tinn.runtime.arch() != "cuda", reason="host syncs only exist on a GPU"),
              pytest.mark.default_precision]

HASH_CONFIG = {
    "loss": {"otype": "RelativeL2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
    "encoding": {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 12,
                 "base_resolution": 4, "per_level_scale": 1.5},
    "network": {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
                "n_neurons": 16, "n_hidden_layers": 1},
}


@contextlib.contextmanager
def no_host_sync():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with tinn.checks.disabled():
            yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def batch(n_in, n_out, n_networks, size, seed=0):
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(size, n_in, generator=gen).to(dev)
    y = torch.rand(size, n_out, generator=gen).to(dev)
    ids = torch.randint(0, n_networks, (size,), generator=gen, dtype=torch.int32).to(dev)
    return x, y, ids


@pytest.mark.parametrize("n_networks", [1, 7])
def test_array_training_and_inference_steps_do_not_sync(n_networks):
    net = NetworkArray(3, 1, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=n_networks)
    trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    x, y, ids = batch(3, 1, n_networks, 3000)
    first = trainer.training_step(x, y, ids)  # compiles outside the guarded block (compiling may sync)
    trainer.inference(x, ids)
    with no_host_sync():
        for _ in range(3):
            loss = trainer.training_step(x, y, ids)
        out = trainer.inference(x, ids)
    # the steps did train, and inference gives the network's outputs
    assert float(loss) < float(first)
    assert out.shape == (3000, 1) and torch.isfinite(out).all()


def test_grid_network_training_step_does_not_sync():
    """The image demo's model: a hash grid into the fused MLP, one network."""
    trainer = Trainer.from_config(HASH_CONFIG, 2, 3)
    x, y, _ = batch(2, 3, 1, 4096, seed=1)
    first = trainer.training_step(x, y)
    with no_host_sync():
        for _ in range(3):
            loss = trainer.training_step(x, y)
    assert float(loss) < float(first)


@pytest.mark.parametrize("precision,scaling", [("float32", "dynamic"), ("float16", "static"), ("float16", "dynamic")])
def test_replayed_dense_network_step_does_not_sync(precision, scaling, tuned):
    """A hash grid into a 128-wide network: the dense path, its steps replayed as CUDA graphs once captured (the
    capture itself synchronises, once per batch shape). float16's dynamic scaling decides a step's skip on the
    device (tinn/gradient_scaling.py)."""
    tuned(precision=precision, gradient_scaling=scaling)
    config = dict(HASH_CONFIG, network=dict(HASH_CONFIG["network"], n_neurons=128))
    trainer = Trainer.from_config(config, 2, 3)
    x, y, _ = batch(2, 3, 1, 4096, seed=1)
    first = trainer.training_step(x, y)
    trainer.training_step(x, y)  # captures
    assert trainer.model.network.dense and trainer.model.network._step_graphs.shapes
    with no_host_sync():
        for _ in range(3):
            loss = trainer.training_step(x, y)
    assert float(loss) < float(first)


def test_torch_facade_step_does_not_sync():
    """tcnn's PyTorch sample loop through tinn.torch: module call, loss, backward, torch's Adam."""
    import tinn.torch as tcnn

    model = tcnn.NetworkWithInputEncoding(2, 3, HASH_CONFIG["encoding"], HASH_CONFIG["network"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y, _ = batch(2, 3, 1, 4096, seed=2)

    def step():
        opt.zero_grad()
        loss = ((model(x).float() - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    first = step()
    with no_host_sync():
        for _ in range(3):
            loss = step()
    assert float(loss) < float(first)


ADAM = {"otype": "Adam", "learning_rate": 1e-2}
OPTIMIZERS = [
    ADAM,
    {"otype": "SGD", "learning_rate": 1e-1},
    {"otype": "Novograd", "learning_rate": 1e-2},
    {"otype": "Shampoo", "learning_rate": 1e-2},
    {"otype": "EMA", "decay": 0.9, "nested": ADAM},
    {"otype": "Average", "n_samples": 4, "nested": ADAM},
    {"otype": "Lookahead", "alpha": 0.5, "n_steps": 2, "nested": ADAM},
    {"otype": "ExponentialDecay", "decay_start": 1, "decay_interval": 1, "decay_base": 0.99, "nested": ADAM},
    {"otype": "Batched", "batch_size_multiplier": 2, "nested": ADAM},
]


@pytest.mark.parametrize("config", OPTIMIZERS, ids=[c["otype"] for c in OPTIMIZERS])
def test_optimizer_steps_do_not_sync(config):
    """Every optimizer and wrapper, driven by the Trainer over an array of networks: in the default precision
    where the optimizer skips an overflowing step on the device, else in float32 (the others read the skip flag
    on the host, tinn/optimizers/base.py)."""
    net = NetworkArray(3, 1, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=5)
    trainer = Trainer(net, {"otype": "L2"}, config)
    if net.gradient_scaler is not None and not trainer.optimizer.skips_on_device:
        net = NetworkArray(3, 1, {"n_neurons": 16, "n_hidden_layers": 1}, n_networks=5, precision="float32")
        trainer = Trainer(net, {"otype": "L2"}, config)
    x, y, ids = batch(3, 1, 5, 3000, seed=3)
    first = trainer.training_step(x, y, ids)
    for _ in range(3):  # past every wrapper's first period (Lookahead's sync step, Average's window)
        trainer.training_step(x, y, ids)
    with no_host_sync():
        for _ in range(4):
            loss = trainer.training_step(x, y, ids)
    assert float(loss) < float(first)


def test_float16_array_steps_skip_an_overflow_without_a_sync():
    """An array on the tensor cores in the default float16: a step whose gradients overflow is skipped on the
    device, inside the guarded steps, and the next ones train on."""
    net = NetworkArray(3, 1, {"n_neurons": 32, "n_hidden_layers": 2}, n_networks=7)
    if net.tensor_cores is None:
        pytest.skip(f"the tensor-core path does not run here ({net.path})")
    assert net.precision == "float16" and net.gradient_scaler is not None
    weight = [1.0]
    trainer = Trainer(net, lambda pred, target: weight[0] * ((pred - target) ** 2).mean(),
                      {"otype": "Adam", "learning_rate": 1e-2})
    x, y, ids = batch(3, 1, 7, 3000, seed=6)
    first = trainer.training_step(x, y, ids)
    with no_host_sync():
        for w in (1.0, 1e9, 1.0, 1.0):
            weight[0] = w
            loss = trainer.training_step(x, y, ids)
    assert trainer.skipped_steps == 1 and trainer.gradient_scale == 64.0 and trainer.step == 5
    assert trainer.optimizer.step_count == 4 and torch.isfinite(net.params).all()
    assert float(loss) < float(first)


def test_grid_arrays_training_step_does_not_sync():
    """One hash grid per network (an array of grid-and-MLP models), routed by id."""
    trainer = Trainer.from_config(HASH_CONFIG, 2, 3, n_networks=4)
    x, y, ids = batch(2, 3, 4, 4096, seed=4)
    first = trainer.training_step(x, y, ids)
    with no_host_sync():
        for _ in range(3):
            loss = trainer.training_step(x, y, ids)
    assert float(loss) < float(first)


def test_compositing_does_not_sync():
    """Forward and backward of the compositing, with the background given as numbers (the usual call)."""
    from tinn.render.compositing import composite, composite_dense

    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(5)
    n_rays, n_samples = 64, 16
    sigma = (torch.rand(n_rays, n_samples, generator=gen) * 3).to(dev).requires_grad_()
    rgb = torch.rand(n_rays, n_samples, 3, generator=gen).to(dev).requires_grad_()
    deltas = torch.full((n_rays, n_samples), 0.1, device=dev)
    offsets = torch.arange(n_rays + 1, dtype=torch.int32, device=dev) * n_samples
    composite_dense(sigma, rgb, deltas, background=(1.0, 1.0, 1.0))  # the background's one copy, outside
    with no_host_sync():
        dense = composite_dense(sigma, rgb, deltas, background=(1.0, 1.0, 1.0))
        packed = composite(sigma.reshape(-1), rgb.reshape(-1, 3), deltas.reshape(-1), offsets,
                           background=(1.0, 1.0, 1.0))
        (dense.rgb.sum() + packed.rgb.sum()).backward()
    assert torch.equal(dense.rgb, packed.rgb)
    assert sigma.grad is not None and torch.isfinite(sigma.grad).all()


def test_kilonerf_distillation_and_fine_tuning_steps_do_not_sync():
    """KiloNeRF's phases (tinn/scenes/training), with the input checks as the caller left them (on): the phases
    build their own inputs and run without the checks, and fine-tuning reads the number of samples to evaluate a
    step after it was counted (an event the device has passed, not a stream sync). The occupancy grid's updates
    (the one for step 16 runs at the end of step 15) read only the count of occupied voxels the update before
    started, likewise."""
    from tinn.scenes import ProceduralScene, render_views
    from tinn.scenes.acceleration.occupancy import OccupancyGrid
    from tinn.scenes.fields.kilonerf import KiloNeRF
    from tinn.scenes.training import Distiller
    from tinn.scenes.training.photometric import PhotometricTrainer

    scene = ProceduralScene()
    data = render_views(scene, 4, 32, 32, seed=1, n_samples=64)
    box_min, box_max = data.box_min.to(tinn.runtime.device()), data.box_max.to(tinn.runtime.device())
    teacher_grid = OccupancyGrid.from_density(scene.density, box_min, box_max, 32, threshold=1.0)
    student = KiloNeRF(box_min, box_max, grid=4, occupancy=teacher_grid, seed=2)

    class Teacher(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.box_min, self.box_max = box_min, box_max

        def forward(self, points):
            return scene.density(points), scene.color(points)

    distiller = Distiller(student, Teacher(), teacher_grid, step_size=0.02, batch=1 << 14, learning_rate=1e-2)
    first = distiller.step()
    _steps_without_sync(distiller.step, 3)
    later = [float(distiller.step()) for _ in range(20)]  # it trains (one step's batch is noisy: a mean)
    assert sum(later[-5:]) / 5 < float(first)

    grid = OccupancyGrid.tracking(box_min, box_max, 32, within=teacher_grid)
    tuner = PhotometricTrainer(student, data, n_samples=64, batch_rays=1024, learning_rate=2e-3, occupancy=grid,
                               occupancy_threshold=1.0, occupancy_every=16, seed=3)
    first = tuner.step()  # updates the grid (step 0) and compiles
    tuner.step()
    loss = _steps_without_sync(tuner.step, 16)  # steps 2..17
    assert grid.updates == 2
    assert torch.isfinite(loss) and float(loss) < 2 * float(first)


@pytest.mark.parametrize("batches_per_draw,hull", [(1, False), (3, False), (3, True)])
def test_octree_training_steps_do_not_sync(batches_per_draw, hull):
    """An octree step evaluates a batch assigned to nodes at least a step earlier: the number of samples to
    evaluate was counted then, so reading it waits on an event the device has passed, not on the device. Batches
    drawn several at a time: the steps cross draws. A field with a visual hull skips by it without a host read."""
    from tinn.scenes.acceleration.visual_hull import visual_hull
    from tinn.scenes import ProceduralScene, render_views
    from tinn.scenes.acceleration.octree import Octree
    from tinn.scenes.fields.octree_field import OctreeField
    from tinn.scenes.training.octree_training import OctreeTrainer, foreground_points

    data = render_views(ProceduralScene(), 4, 32, 32, seed=1, n_samples=64)
    dev = tinn.runtime.device()
    tree = Octree.build(foreground_points(data, resolution=16, dilate=1), data.box_min.to(dev), data.box_max.to(dev),
                        max_depth=2, min_points=1)
    field = OctreeField(tree, seed=3, hull=visual_hull(data, resolution=16) if hull else None)
    trainer = OctreeTrainer(field, data, pyramid_levels=2, n_samples=32, batch_rays=512, seed=2,
                            batches_per_draw=batches_per_draw)
    first = trainer.step()  # compiles
    trainer.step()
    loss = _steps_without_sync(trainer.step, 7)
    assert torch.isfinite(loss) and float(loss) < 2 * float(first)


def _steps_without_sync(step, n: int):
    """`n` calls of `step` under torch's sync debug mode "error" (any host synchronisation raises); the last
    result."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(n):
            result = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return result
