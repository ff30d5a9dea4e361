"""The Trainer's step replayed from CUDA graphs (tinn/step_graphs.py) against the same steps issued op by op.

On the CPU: Adam's step counts taken from the device while a step is captured (Triton's interpreter), and the host
side of capture, replay, recapture and refusal with a stand-in graph. On CUDA: replayed training equals eager
training (parameters, losses, step counts, gradient scales), a changed learning rate captures again, a step with a
Taichi launch falls back to eager steps without a trace, checkpoints round-trip.
"""
import pytest
import torch

import tinn
from tinn import step_graphs
from tinn.trainer import Trainer

DEV = tinn.runtime.device()
CUDA = tinn.runtime.arch() == "cuda"
cuda_only = pytest.mark.skipif(not CUDA, reason="CUDA graphs need the CUDA arch")

GRID_CONFIG = {
    "loss": {"otype": "RelativeL2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15,
                  "l2_reg": 1e-6},
    "encoding": {"otype": "HashGrid", "n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 12,
                 "base_resolution": 8, "per_level_scale": 1.5},
    "network": {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
                "n_hidden_layers": 2},
}


def image_batches(n, batch=4096, n_networks=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.rand(batch, 2, generator=gen)
        y = torch.stack([torch.sin(9 * x[:, 0]) * torch.cos(7 * x[:, 1]), x[:, 0] * x[:, 1],
                         torch.cos(5 * x[:, 0] + 3 * x[:, 1])], 1)
        ids = torch.randint(0, n_networks, (batch,), generator=gen, dtype=torch.int32) if n_networks > 1 else None
        out.append((x.to(DEV), y.to(DEV), None if ids is None else ids.to(DEV)))
    return out


def train(tuned, graphs: bool, data, n_networks=1, lr_change_at=None, **network):
    """A trainer of GRID_CONFIG run over `data`; `network`: the MLP's `kernels` and `precision` settings."""
    tuned(step_graphs=graphs, **network)
    trainer = Trainer.from_config(GRID_CONFIG, 2, 3, n_networks=n_networks)
    losses = []
    for i, (x, y, ids) in enumerate(data):
        if i == lr_change_at:
            trainer.learning_rate = 3e-3
        losses.append(trainer.training_step(x, y, ids))
    return trainer, torch.stack(losses)


def distance(a, b) -> dict:
    """Per parameter, the norm of the difference relative to the norm of `a`'s."""
    return {name: float((pa.detach() - pb.detach()).norm() / pa.detach().norm())
            for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters())}


def assert_same_training(a, b, losses_a, losses_b, rtol=2e-3, spread=None):
    """b trained as a did: the same counts and gradient scale, losses within `rtol`, and parameters within `rtol`
    (relative norm), or where `spread` is given (the distance between two runs of a: float atomics sum in no fixed
    order, and Adam with epsilon 1e-15 turns an entry's near-zero gradient into a full step either way) within a
    few times that, or 0.5%. A step taken with a wrong count moves every entry by a wrong bias correction (15% apart
    between the second and third count), far past that."""
    assert a.step == b.step
    assert a.optimizer.step_count == b.optimizer.step_count
    assert a.gradient_scale == b.gradient_scale
    torch.testing.assert_close(losses_a, losses_b, rtol=rtol, atol=0)
    for name, d in distance(a, b).items():
        bound = rtol if spread is None else max(4 * spread[name], 5e-3)
        assert d <= bound, (name, d, bound)


def test_adam_takes_step_counts_from_the_device_while_capturing(tuned):
    """While a step is captured, Adam's count of a tensor counted as a whole comes from a device copy that is filled
    before each replay; the update equals the eager one, through skipped steps too (their pending count)."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    tuned(triton_step_kernels=True)
    from tinn.optimizers import create_optimizer
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(3, 40, generator=gen)
    table = torch.randn(1, 64, generator=gen)
    grads = [(torch.randn(3, 40, generator=gen), torch.randn(1, 64, generator=gen) * (torch.rand(1, 64, generator=gen)
                                                                                     > 0.5)) for _ in range(6)]
    skips = [0, 0, 1, 0, 0, 0]
    results = []
    for device_counts in (False, True):
        w = torch.nn.Parameter(weights.clone().to(DEV))
        e = torch.nn.Parameter(table.clone().to(DEV))
        opt = create_optimizer({"otype": "Adam", "learning_rate": 1e-2, "beta2": 0.999},
                               [("network.params", w), ("encoding.params", e)])
        assert opt.graph_key(DEV) is not None
        for (gw, ge), skip in zip(grads, skips):
            w.grad, e.grad = gw.to(DEV), ge.to(DEV)
            if device_counts:
                # As a replay sees it: counts moved on the host by the capture, their device copies filled.
                opt.begin_capture(DEV)
                for name, count in opt._graph_counts.items():
                    count.fill_(opt.scalars[f"steps.{name}"])  # this step's count less one
                opt.step(skip=torch.tensor([skip], dtype=torch.int32, device=DEV))
                opt.end_capture()
            else:
                opt.step(skip=torch.tensor([skip], dtype=torch.int32, device=DEV))
        assert list(opt._graph_counts) == (["network.params"] if device_counts else [])
        results.append((w.detach().clone(), e.detach().clone(), opt.step_count))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)
    assert results[0][2] == results[1][2] == 5


def test_optimizers_that_read_host_values_every_step_are_not_captured():
    """Only Adam on its Triton kernel without host-side bounds gives a key; SGD and AdaBound do not."""
    from tinn.optimizers import create_optimizer
    p = torch.nn.Parameter(torch.zeros(2, 8, device=DEV))
    assert create_optimizer({"otype": "SGD"}, [("network.params", p)]).graph_key(DEV) is None
    assert create_optimizer({"otype": "Adam", "adabound": True}, [("network.params", p)]).graph_key(DEV) is None


@cuda_only
@pytest.mark.parametrize("n_networks,precision", [(1, "float16"), (1, "bfloat16"), (6, "float16")])
def test_replayed_steps_equal_eager_steps(n_networks, precision, tuned):
    """A grid and an MLP on the tensor cores: 30 steps replayed from a graph (captured at the second) against the
    same steps issued op by op; losses kept across steps stay each step's own."""
    data = image_batches(30, n_networks=n_networks)
    network = {"kernels": "tensor_cores", "precision": precision}
    eager, losses_eager = train(tuned, False, data, n_networks, **network)
    again, _ = train(tuned, False, data, n_networks, **network)
    replayed, losses_replayed = train(tuned, True, data, n_networks, **network)
    assert replayed.step_graph_status.startswith("captured 1 time(s)"), replayed.step_graph_status
    assert replayed._step_graphs.replays == 29 - (1 + step_graphs.TRIAL_STEPS)  # the trial's steps op by op
    assert eager.step_graph_status == "steps issued op by op"
    assert_same_training(eager, replayed, losses_eager, losses_replayed, rtol=2e-2, spread=distance(eager, again))
    assert float(losses_replayed[-1]) < 0.5 * float(losses_replayed[0])
    assert len(set(losses_replayed.tolist())) == 30


@cuda_only
def test_a_new_learning_rate_captures_again(tuned):
    data = image_batches(16)
    network = {"kernels": "tensor_cores", "precision": "float16"}
    eager, losses_eager = train(tuned, False, data, lr_change_at=8, **network)
    again, _ = train(tuned, False, data, lr_change_at=8, **network)
    replayed, losses_replayed = train(tuned, True, data, lr_change_at=8, **network)
    assert replayed.step_graph_status.startswith("captured 2 time(s)"), replayed.step_graph_status
    assert_same_training(eager, replayed, losses_eager, losses_replayed, rtol=2e-2, spread=distance(eager, again))


@cuda_only
def test_a_step_with_a_taichi_launch_falls_back_to_eager_steps(tuned):
    """The grid on Taichi's kernels (the MLP on the tensor cores, which takes the loss): the capture is refused, and
    the step taken after it equals the eager one (the host counts put back, nothing half done)."""
    data = image_batches(8)
    network = {"kernels": "tensor_cores", "precision": "float16", "triton_grid_kernels": False}
    eager, losses_eager = train(tuned, False, data, **network)
    again, _ = train(tuned, False, data, **network)
    replayed, losses_replayed = train(tuned, True, data, **network)
    assert replayed.step_graph_status.startswith("not captured: NotCapturable"), replayed.step_graph_status
    assert_same_training(eager, replayed, losses_eager, losses_replayed, rtol=2e-2, spread=distance(eager, again))


@cuda_only
def test_checkpoints_of_replayed_training_round_trip(tuned, tmp_path):
    """Saved after replayed steps, loaded into a fresh trainer that replays too: the continuation equals the
    original's, step counts and gradient scale included."""
    data = image_batches(20)
    network = {"kernels": "tensor_cores", "precision": "float16"}
    tuned(step_graphs=True, **network)
    config = GRID_CONFIG
    first = Trainer.from_config(config, 2, 3)
    for x, y, ids in data[:10]:
        first.training_step(x, y, ids)
    first.save_checkpoint(tmp_path / "ckpt")
    second = Trainer.from_config(config, 2, 3)
    second.load_checkpoint(tmp_path / "ckpt")
    for x, y, ids in data[10:]:
        first.training_step(x, y, ids)
        second.training_step(x, y, ids)
    assert second.step_graph_status.startswith("captured"), second.step_graph_status
    assert_same_training(first, second, torch.zeros(1), torch.zeros(1), rtol=5e-2)



def test_a_capture_is_this_threads_alone():
    """While one thread captures, another thread's Taichi launches go on and its stream ordering is as always (a
    viewer rendering beside a trainer's thread); the capturing thread's Taichi launches are refused, and everything
    is back as before afterwards."""
    import threading

    from tinn import runtime, step_graphs
    from tinn.kernels import gradient_scaling as kernels
    values = torch.tensor([1.0, float("inf")], device=DEV)
    seen = {}

    def other_thread():
        found = torch.zeros(1, device=DEV)
        kernels.record_non_finite(values, found)  # a Taichi launch, not refused here
        seen["found"], seen["capturing"] = float(found), runtime.capturing()

    # Compiled here first: Taichi compiles on the thread that initialised it (another thread's first launch of a
    # kernel would turn the lean launch path off for the rest of the process).
    kernels.record_non_finite(values, torch.zeros(1, device=DEV))
    with step_graphs.refusing_taichi_launches(), runtime.capturing_step():
        assert runtime.capturing()
        with pytest.raises(step_graphs.NotCapturable, match="record_non_finite"):
            kernels.record_non_finite(values, torch.zeros(1, device=DEV))
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert seen == {"found": 1.0, "capturing": False}
    assert not runtime.capturing()
    found = torch.zeros(1, device=DEV)
    kernels.record_non_finite(values, found)  # refused no more
    assert float(found) == 1.0


class _StandInGraph:
    """`torch.cuda.CUDAGraph` for the bookkeeping test on the CPU: the 'capture' runs the step (its body executes as
    it is issued) and a replay does nothing on the device; the host side of every step is the real one."""
    replays = 0

    def replay(self):
        _StandInGraph.replays += 1


def _stand_in_cuda(monkeypatch):
    import contextlib

    monkeypatch.setattr(step_graphs.StepGraphs, "wanted", staticmethod(lambda device: True))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _StandInGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **kw: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    _StandInGraph.replays = 0


def _stand_in_trainer(tuned):
    """A two-network array on the tensor-core kernels (Triton's interpreter) with Adam's Triton launch, step graphs
    on, and one fixed batch: (net, trainer, x, y, ids)."""
    from tinn.networks import NetworkArray
    tuned(kernels="tensor_cores", precision="float32", triton_step_kernels=True, step_graphs=True)
    net = NetworkArray(2, 3, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=2, seed=1)
    trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(32, 2, generator=gen).to(DEV), torch.rand(32, 3, generator=gen).to(DEV)
    ids = torch.randint(0, 2, (32,), generator=gen, dtype=torch.int32).to(DEV)
    return net, trainer, x, y, ids


@pytest.mark.skipif(CUDA, reason="the stand-in graph replaces CUDA's; on CUDA the real graphs are tested above")
def test_replay_bookkeeping_with_a_stand_in_graph(tuned, monkeypatch):
    """The host side of replayed steps (an array on the tensor-core kernels, Triton's interpreter, Adam's Triton
    launch): captured at the second step, then each replay moves the trainer's and the optimizer's counts as an
    eager step would and fills Adam's device count; a new learning rate captures again; a learning rate changed
    every step stops capturing after four captures; a step that launches a Taichi kernel is refused with its counts
    put back."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    _stand_in_cuda(monkeypatch)
    net, trainer, x, y, ids = _stand_in_trainer(tuned)
    eager = 1 + step_graphs.TRIAL_STEPS  # the trial's steps op by op, right after the capture
    n = 2 + eager + 3
    for _ in range(n):
        trainer.training_step(x, y, ids)
    graphs = trainer._step_graphs
    assert trainer.step_graph_status == "captured 1 time(s)", trainer.step_graph_status
    assert (graphs.replays, _StandInGraph.replays) == (4, 4)  # the capture's own, then the trial's first three
    assert trainer.step == n and trainer.optimizer.step_count == n
    assert trainer.optimizer.scalars["steps.params"] == n
    assert int(trainer.optimizer._graph_counts["params"]) == n - 1  # the last replay's count, less one
    assert net.params.grad is not None
    trainer.learning_rate = 5e-3
    for _ in range(3):
        trainer.training_step(x, y, ids)
    assert trainer.step_graph_status == "captured 2 time(s)" and trainer.step == n + 3
    for i in range(4):  # a schedule on the host: every step a new key
        trainer.learning_rate = 1e-3 * (i + 1)
        trainer.training_step(x, y, ids)
    assert graphs.disabled and "captures within 64 steps" in trainer.step_graph_status
    assert trainer.step == n + 7 and trainer.optimizer.step_count == n + 7


@pytest.mark.skipif(CUDA, reason="the stand-in graph replaces CUDA's; on CUDA the real graphs are tested above")
def test_a_refused_capture_puts_the_counts_back(tuned, monkeypatch):
    """A step with a Taichi launch (here Adam's Taichi kernel after the tensor-core backward) is refused at its
    capture: the trainer's and the optimizer's counts are as after eager steps alone, and the parameters equal those
    of a trainer that never tried (the refused step then ran eagerly)."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    from tinn.networks import NetworkArray
    from tinn.optimizers.adam import Adam
    _stand_in_cuda(monkeypatch)
    monkeypatch.setattr(Adam, "graph_key", lambda self, device: ("stand-in",))  # (Taichi's Adam gives none)
    results = []
    for graphs in (False, True):
        tuned(kernels="tensor_cores", precision="float32", triton_step_kernels=False, step_graphs=graphs)
        net = NetworkArray(2, 3, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=2,
                           seed=1)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
        gen = torch.Generator().manual_seed(0)
        for _ in range(4):
            x, y = torch.rand(32, 2, generator=gen).to(DEV), torch.rand(32, 3, generator=gen).to(DEV)
            ids = torch.randint(0, 2, (32,), generator=gen, dtype=torch.int32).to(DEV)
            trainer.training_step(x, y, ids)
        results.append((net.params.detach().clone(), trainer.step, trainer.optimizer.step_count,
                        trainer.optimizer.scalars["steps.params"], trainer.step_graph_status))
    assert results[1][4].startswith("not captured: NotCapturable"), results[1][4]
    assert results[0][1:4] == results[1][1:4] == (4, 4, 4)
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)



@pytest.mark.skipif(CUDA, reason="the stand-in graph replaces CUDA's; on CUDA the real graphs are tested above")
def test_host_values_of_the_loss_and_the_model_capture_again(tuned, monkeypatch):
    """A replay reads what the capture saw: a loss's plain attribute changed, a module's attribute changed, a
    module's buffer and an optimizer state tensor replaced by other tensors each capture again; a buffer changed in
    place does not need to."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    from tinn.networks import NetworkArray
    _stand_in_cuda(monkeypatch)
    tuned(kernels="tensor_cores", precision="float32", triton_step_kernels=True, step_graphs=True)
    net = NetworkArray(2, 3, {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=2, seed=1)
    net.register_buffer("user_scale", torch.ones(1, device=DEV))
    trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(32, 2, generator=gen).to(DEV), torch.rand(32, 3, generator=gen).to(DEV)
    ids = torch.randint(0, 2, (32,), generator=gen, dtype=torch.int32).to(DEV)

    def steps(n=2):
        for _ in range(n):
            trainer.training_step(x, y, ids)
        return len(trainer._step_graphs.captures)

    assert steps(3) == 1
    net.user_scale.fill_(2.0)  # in place: the captured storage holds the new value
    assert steps() == 1
    net.user_scale = torch.full((1,), 3.0, device=DEV)  # another tensor: captured again
    assert steps() == 2
    net.user_progress = 0.5  # a plain attribute a part's launch might take
    assert steps() == 3
    trainer.loss.user_weight = 2.0
    assert steps() == 4
    # An optimizer state tensor replaced by a copy (its values kept): captured again, after the window of four.
    for _ in range(64):
        trainer.training_step(x, y, ids)
    key = next(k for k in trainer.optimizer.state if k.startswith("m."))
    trainer.optimizer.state[key] = trainer.optimizer.state[key].clone()
    assert steps() == 5 and not trainer._step_graphs.disabled


@pytest.mark.skipif(CUDA, reason="the stand-in graph replaces CUDA's; on CUDA the real graphs are tested above")
@pytest.mark.parametrize("slow_replay", [False, True])
def test_a_shape_keeps_whichever_of_graph_and_op_by_op_measured_faster(tuned, monkeypatch, slow_replay):
    """After a shape's capture, TRIAL_STEPS steps op by op and TRIAL_STEPS replays are timed: a graph whose replays
    are slower (as where the batch's copy into the graph costs more than the host time saved) is released and the
    shape steps op by op from then on; a faster one keeps replaying. Counts move as in eager steps either way. The
    trial's clock is a stand-in: a step op by op takes 1 s, a replay 2 s or nothing."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    _stand_in_cuda(monkeypatch)
    clock = [0.0]
    monkeypatch.setattr(step_graphs.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(_StandInGraph, "replay", lambda self: clock.__setitem__(0, clock[0] + 2.0 * slow_replay))
    regression_step = Trainer._regression_step

    def timed_eager(self, *a, **kw):
        clock[0] += 1.0
        return regression_step(self, *a, **kw)
    monkeypatch.setattr(Trainer, "_regression_step", timed_eager)
    net, trainer, x, y, ids = _stand_in_trainer(tuned)
    run = 1 + step_graphs.TRIAL_STEPS  # each way's run: an untimed step, then the timed ones
    for _ in range(2 + 2 * run + 3):  # eager, capture, the trial, three steps after it
        trainer.training_step(x, y, ids)
    graphs = trainer._step_graphs
    assert trainer.step == trainer.optimizer.step_count == 2 + 2 * run + 3
    if slow_replay:
        assert "faster than their graph's replays" in trainer.step_graph_status, trainer.step_graph_status
        assert "(1.000 against 2.000 ms" not in trainer.step_graph_status  # seconds on the stand-in clock
        assert "(1000.000 against 2000.000 ms a step)" in trainer.step_graph_status
        assert graphs.replays == 1 + run and not graphs.captured  # the capture's own and the trial's; released
    else:
        assert trainer.step_graph_status.startswith("captured 1 time(s) (replays 0.000 ms a step, op by op "
                                                    "1000.000)"), trainer.step_graph_status
        assert graphs.replays == 1 + run + 3 and not graphs.trials


def test_a_capture_key_holds_plain_values_and_tensors_by_storage():
    """What a capture's key reads of an object: numbers (subclasses too), strings, None and tuples of them by value,
    tensors (parameters and buffers included) by storage, shape and dtype; containers, modules and tuples holding
    anything else are left out."""
    import enum

    import numpy as np

    class Level(enum.IntEnum):
        ONE = 1

    class Holder:
        pass

    h = Holder()
    h.count, h.rate, h.scale, h.name, h.none, h.level = 3, 0.5, np.float64(2.0), "a", None, Level.ONE
    h.pair, h.mixed, h.table, h.child = (1, None, "b"), (1, [2]), {"x": 1}, torch.nn.Linear(2, 2)
    h.tensor = torch.zeros(3)
    values = dict(step_graphs._plain_values(h))
    assert set(values) == {"count", "rate", "scale", "name", "none", "level", "pair", "tensor"}
    assert values["scale"] == 2.0 and values["pair"] == (1, None, "b") and values["level"] == 1
    assert values["tensor"] == (h.tensor.data_ptr(), h.tensor.shape, h.tensor.dtype)
    module = torch.nn.Linear(2, 2)
    module.register_buffer("user_scale", torch.ones(1))
    module.progress = 0.25
    names = dict(step_graphs._plain_values(module))
    assert names["progress"] == 0.25 and names["training"] is True
    assert names["buffer user_scale"] == (module.user_scale.data_ptr(), module.user_scale.shape, torch.float32)
