"""A loop of tinn.torch modules captured by the caller as one CUDA graph (`torch.cuda.graph`), PyTorch's own way to
take a host-bound loop off the host: the forward, torch's loss, the backward and a `capturable` torch optimizer.

On CUDA: replayed training equals the same steps issued op by op (one network and an array, tcnn's float16 on the
tensor cores), and a module that launches Taichi kernels is refused with NotCapturable, leaving the module usable.
On the CPU: what a part call does while a caller's capture is reported (the report stood in): the checks that read
the device are skipped, no cache keeps a tensor made in the graph, a Taichi launch raises, and all of it ends with
the call.
"""
import pytest
import torch

import tinn
import tinn.torch as tcnn
from tinn import checks, runtime, step_graphs

from test_step_graphs import image_batches as batches

DEV = tinn.runtime.device()
CUDA = tinn.runtime.arch() == "cuda"
cuda_only = pytest.mark.skipif(not CUDA, reason="CUDA graphs need the CUDA arch")

ENCODING = {"otype": "HashGrid", "n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 12,
            "base_resolution": 8, "per_level_scale": 1.5}
NETWORK = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 64,
           "n_hidden_layers": 2}
WARMUP = 3  # eager steps before the capture, as torch's documentation asks (kernels compiled, caches filled)


def relative_l2(out, target):
    """tcnn's sample loss."""
    return ((out - target) ** 2 / (out.detach() ** 2 + 0.01)).mean()


def train(data, captured: bool, n_networks=1):
    """tcnn's sample loop through tinn.torch over `data`: every step op by op, or WARMUP steps op by op and the rest
    replayed from one graph captured after them. Returns (model, losses)."""
    model = tcnn.NetworkWithInputEncoding(2, 3, ENCODING, NETWORK, seed=7, n_networks=n_networks)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-15, capturable=True)

    def step(x, y, ids):
        loss = relative_l2(model(x) if ids is None else model(x, ids), y)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        return loss.detach()

    losses = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up on a side stream, as torch's documentation does it
        for x, y, ids in data[:WARMUP]:
            losses.append(step(x, y, ids).clone())
    torch.cuda.current_stream().wait_stream(side)
    if not captured:
        losses += [step(x, y, ids).clone() for x, y, ids in data[WARMUP:]]
        return model, torch.stack(losses)
    static = [t.clone() if t is not None else None for t in data[WARMUP]]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(*static)
    for x, y, ids in data[WARMUP:]:
        for buffer, value in zip(static, (x, y, ids)):
            if buffer is not None:
                buffer.copy_(value)
        graph.replay()
        losses.append(static_loss.clone())
    return model, torch.stack(losses)


def distance(a, b) -> dict:
    return {name: float((pa.detach() - pb.detach()).norm() / pa.detach().norm())
            for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters())}


@cuda_only
@pytest.mark.parametrize("n_networks", [1, 6])
def test_a_captured_torch_loop_trains_as_the_loop_op_by_op(n_networks, tuned):
    """20 steps of tcnn's loop in float16 on the tensor cores: replayed from the caller's graph against op by op,
    parameters within a few times the spread of two op-by-op runs (float atomics sum in no fixed order)."""
    tuned(precision="float16", step_graphs=False)
    data = batches(20, n_networks=n_networks)
    eager, losses_eager = train(data, False, n_networks)
    again, _ = train(data, False, n_networks)
    replayed, losses_replayed = train(data, True, n_networks)
    torch.testing.assert_close(losses_replayed, losses_eager, rtol=2e-2, atol=0)
    spread = distance(eager, again)
    for name, d in distance(eager, replayed).items():
        assert d <= max(4 * spread[name], 5e-3), (name, d, spread[name])
    assert len(set(losses_replayed.tolist())) == len(data)  # each replay's own loss, not the capture's
    assert float(losses_replayed[-1]) < 0.5 * float(losses_replayed[0])
    assert model_still_runs_op_by_op(replayed, data[0], n_networks)


def model_still_runs_op_by_op(model, batch, n_networks) -> bool:
    x, y, ids = batch
    with torch.no_grad():
        out = model(x) if n_networks == 1 else model(x, ids)
    return bool(torch.isfinite(out).all())


@cuda_only
def test_a_module_on_taichi_kernels_is_refused_with_a_clear_error(tuned):
    """float32 keeps a single network on Taichi's kernels, which launch outside any graph: the capture stops at the
    first such launch with NotCapturable, and the module runs op by op afterwards."""
    tuned(precision="float32")
    model = tcnn.NetworkWithInputEncoding(2, 3, ENCODING, NETWORK, seed=7)
    (x, y, _), = batches(1)
    model(x).sum().backward()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(step_graphs.NotCapturable, match="Taichi kernel"):
        with torch.cuda.graph(graph):
            model(x)
    torch.cuda.synchronize()
    out = model(x)
    assert torch.isfinite(out).all() and out.shape == (x.shape[0], 3)


@pytest.fixture
def callers_capture_reported(monkeypatch):
    """This thread is told a caller's capture runs (what `torch.cuda.is_current_stream_capturing` reports on CUDA),
    except inside tinn's own capture flag, as the real report is."""
    monkeypatch.setattr(runtime, "callers_capture", lambda: not runtime.capturing())


def test_checks_that_read_the_device_are_skipped_in_a_callers_capture(callers_capture_reported):
    assert checks._enabled["sync_checks"]
    assert not checks.sync_checks_enabled()
    nan = torch.full((4, 2), float("nan"), device=DEV)
    x, _ = checks.part_inputs("Network", nan, None, 2, 1)  # would raise "contains NaN or Inf" outside a capture
    assert x.shape == (4, 2)


def test_caches_keep_nothing_made_in_a_callers_capture(callers_capture_reported):
    cache = {}
    value = torch.zeros(3, device=DEV)
    assert runtime.keep(cache, "k", value) is value and cache == {}
    batch = 12345
    ids = checks.zero_ids(batch)
    assert ids.shape == (batch,) and (batch, DEV) not in checks._ZERO_IDS


@pytest.mark.skipif(CUDA, reason="on CUDA the real capture is tested above")
def test_a_taichi_launch_in_a_callers_capture_raises_and_the_call_ends_it(callers_capture_reported, monkeypatch):
    """A part on Taichi's kernels called in a reported capture raises NotCapturable naming the kernel, twice in a
    row (the lock and the refusal are released), and runs again once the report ends."""
    model = tcnn.NetworkWithInputEncoding(2, 3, ENCODING, NETWORK, seed=7)
    x = torch.rand(64, 2, device=DEV)
    for _ in range(2):
        with pytest.raises(step_graphs.NotCapturable, match="Taichi kernel"):
            model(x)
    assert not runtime.capturing()
    monkeypatch.setattr(runtime, "callers_capture", lambda: False)
    out = model(x)
    out.sum().backward()
    assert torch.isfinite(out).all() and model.encoding.params.grad is not None


def test_no_callers_capture_is_reported_off_cuda_or_on_the_default_stream():
    assert not runtime.callers_capture()
    assert not runtime.stream_capturing()
    assert checks.sync_checks_enabled()


def test_tinn_optimizers_and_the_trainer_refuse_a_callers_capture(callers_capture_reported):
    """Their host step counts would be replayed unchanged (Adam's bias correction of the captured step, every
    replay): refused before anything is issued, naming what to use instead."""
    from tinn.optimizers import create_optimizer
    from tinn.trainer import Trainer
    table = torch.nn.Parameter(torch.zeros(4, 3, device=DEV))
    table.grad = torch.ones_like(table)
    adam = create_optimizer({"otype": "Adam", "learning_rate": 1e-2}, [("table", table)])
    with pytest.raises(step_graphs.NotCapturable, match="capturable=True"):
        adam.step()
    assert adam.step_count == 0 and float(table.detach().abs().max()) == 0.0
    trainer = Trainer.from_config({"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam"},
                                   "encoding": {"otype": "Identity"}, "network": NETWORK}, 2, 3)
    x, y, _ = batches(1, batch=64)[0]
    with pytest.raises(step_graphs.NotCapturable, match="outside it"):
        trainer.training_step(x, y)
    with pytest.raises(step_graphs.NotCapturable, match="outside it"):
        trainer.optimize(lambda: trainer.model(x).square().mean())
    assert trainer.step == 0
