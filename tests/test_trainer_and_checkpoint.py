"""Trainer steps, the image demo reaching a stated PSNR, and bit-exact atomic checkpoints."""
import os
import sys

import pytest
import torch

import tinn
from tinn.errors import CheckpointError, InputError
from tinn.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))

CONFIG = {
    "loss": {"otype": "L2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2, "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15},
    "encoding": {"otype": "Frequency", "n_frequencies": 4},
    "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU"},
}


def batches(n, batch=256, n_networks=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.rand(batch, 2, generator=gen)
        ids = torch.randint(0, n_networks, (batch,), generator=gen, dtype=torch.int32)
        y = torch.stack([torch.sin(6 * x[:, 0] + ids), torch.cos(4 * x[:, 1]) * ids / n_networks], 1)
        dev = tinn.runtime.device()  # made on the CPU (a seeded generator), used where tinn runs
        out.append((x.to(dev), y.to(dev), ids.to(dev)))
    return out


def test_training_reduces_loss_per_network():
    trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=8, track_per_network_loss=True)
    data = batches(150)
    first = float(trainer.training_step(*data[0]))
    for b in data[1:]:
        last = float(trainer.training_step(*b))
    assert last < 0.1 * first
    assert trainer.per_network_loss.shape == (8,)
    assert torch.all(trainer.per_network_loss > 0)
    assert trainer.step == 150


def test_training_step_rejects_bad_inputs():
    trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    x, y, ids = batches(1)[0]
    with pytest.raises(InputError, match="targets has batch 255 but inputs has batch 256"):
        trainer.training_step(x, y[:255], ids)
    with pytest.raises(InputError, match="inputs contains NaN"):
        trainer.training_step(torch.full_like(x, float("nan")), y, ids)
    with pytest.raises(InputError, match="targets contains NaN or Inf"):
        trainer.training_step(x, y.index_fill(0, torch.tensor([3], device=y.device), float("inf")), ids)
    with pytest.raises(InputError, match="targets has last dimension 3; expected 2"):
        trainer.training_step(x, torch.rand(256, 3, device=x.device), ids)
    with pytest.raises(InputError, match="net_ids contains 8"):
        trainer.training_step(x, y, ids + 1)


def test_training_steps_equal_training_step_per_batch():
    """A model with nothing to route ahead: `training_steps` is `training_step` per batch (the same losses and
    parameters bit for bit, the step count); a batch that is not (inputs, targets, net_ids) is refused by name."""
    data = batches(5)
    one = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    want = [float(one.training_step(*b)) for b in data]
    many = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    got = [float(loss) for loss in many.training_steps(iter(data))]
    assert got == want and many.step == 5
    for (name, p), q in zip(one.model.named_parameters(), many.model.parameters()):
        assert torch.equal(p, q), name
    with pytest.raises(InputError, match=r"training_steps takes batches of \(inputs, targets, net_ids\); got tuple of "
                                         "length 2"):
        next(many.training_steps([data[0][:2]]))
    with pytest.raises(InputError, match="targets has batch 255 but inputs has batch 256"):
        x, y, ids = data[0]
        next(many.training_steps([(x, y[:255], ids)]))


def trained_and_saved(path, data, steps):
    """A trainer of CONFIG after `steps` of `data`, saved to `path`."""
    trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    for b in data[:steps]:
        trainer.training_step(*b)
    trainer.save_checkpoint(path)
    return trainer


def test_checkpoint_resumes_bit_exactly(tmp_path):
    data = batches(12)
    path = tmp_path / "run.tinn"
    a = trained_and_saved(path, data, 6)
    for b in data[6:]:
        a.training_step(*b)

    b_trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=8, seed=999)  # different init on purpose
    b_trainer.load_checkpoint(path)
    assert b_trainer.step == 6
    for b in data[6:]:
        b_trainer.training_step(*b)
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b_trainer.model.named_parameters()):
        assert torch.equal(pa, pb), name
    assert b_trainer.step == a.step == 12


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    path = tmp_path / "run.tinn"
    trainer.save_checkpoint(path)
    before = path.read_bytes()
    trainer.training_step(*batches(1)[0])

    def crash(src, dst):
        raise OSError("disk vanished")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        trainer.save_checkpoint(path)
    assert path.read_bytes() == before  # old checkpoint untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.tinn"]  # no temp file left behind


def test_checkpoint_errors(tmp_path):
    trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    bad = tmp_path / "garbage.tinn"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a tinn checkpoint"):
        trainer.load_checkpoint(bad)
    path = tmp_path / "run.tinn"
    trainer.save_checkpoint(path)
    other = Trainer.from_config(CONFIG, 2, 2, n_networks=4)
    with pytest.raises(CheckpointError, match=r"network\.params is \(8, .*model has \(4, "):
        other.load_checkpoint(path)


@pytest.mark.slow
def test_image_demo_array_mode_reaches_psnr(tmp_path):
    import mlp_learning_an_image as demo

    summary = demo.run(["--arch", tinn.runtime.arch(), "--size", "64", "--tiles", "4", "--steps", "200",
                        "--batch", "4096", "--out", str(tmp_path), "--save-at", "100,200", "--log-every", "100"])
    assert summary["n_networks"] == 16
    assert summary["final_psnr"] > 24.0, summary["history"]
    assert summary["history"][0]["psnr"] < summary["final_psnr"]
    assert (tmp_path / "step_000100.png").exists() and (tmp_path / "step_000200.png").exists()


@pytest.mark.slow
def test_image_demo_single_network_learns(tmp_path):
    import mlp_learning_an_image as demo

    summary = demo.run(["--arch", tinn.runtime.arch(), "--size", "64", "--steps", "200", "--batch", "4096",
                        "--out", str(tmp_path), "--log-every", "100"])
    assert summary["n_networks"] == 1
    assert summary["final_psnr"] > 15.0, summary["history"]


def test_inference_uses_ema_weights_and_restores_live_ones():
    cfg = dict(CONFIG, optimizer={"otype": "EMA", "decay": 0.9,
                                  "nested": {"otype": "Adam", "learning_rate": 1e-2}})
    trainer = Trainer.from_config(cfg, 2, 2, n_networks=8)
    for b in batches(10):
        trainer.training_step(*b)
    x, _, ids = batches(1, seed=5)[0]
    live = trainer.model.inference(x, ids)
    ema = trainer.inference(x, ids)
    assert not torch.allclose(live, ema)
    params = dict(trainer.model.named_parameters())
    with torch.no_grad():
        saved = params["network.params"].clone()
        params["network.params"].copy_(trainer.optimizer.inference_params("network.params"))
        expected = trainer.model.inference(x, ids)
        params["network.params"].copy_(saved)
    assert torch.equal(ema, expected)
    assert torch.equal(trainer.model.inference(x, ids), live)  # live weights are back


def _state(trainer):
    model = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    opt = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in trainer.optimizer.state_dict().items()}
    return model, opt, trainer.step


def _assert_state(trainer, state):
    model, opt, step = state
    now_model, now_opt, now_step = _state(trainer)
    assert now_step == step and now_model.keys() == model.keys() and now_opt.keys() == opt.keys()
    for k in model:
        assert torch.equal(now_model[k], model[k]), k
    for k in opt:
        assert (torch.equal(now_opt[k], opt[k]) if isinstance(opt[k], torch.Tensor) else now_opt[k] == opt[k]), k


def _rewrite(path, out, edit):
    """Load a checkpoint's sections, let `edit` change them, save the result (a valid, checksummed file)."""
    from tinn import checkpoint

    sections, metadata = checkpoint.load(path)
    edit(sections, metadata)
    checkpoint.save(out, sections, metadata)


@pytest.mark.parametrize("edit,message", [
    (lambda s, m: s["optimizer"].__setitem__("m.network.params", s["optimizer"]["m.network.params"][:, :-1]),
     r"optimizer state 'm.network.params' is \(8, \d+\) torch.float32; expected \(8, \d+\) torch.float32"),
    (lambda s, m: s["optimizer"].pop("v.encoding.params", None) or s["optimizer"].pop("v.network.params"),
     r"optimizer state does not match this optimizer \(missing \['v.network.params'\]"),
    (lambda s, m: s["optimizer"].__setitem__("otype", "SGD"), r"optimizer state 'otype' is 'SGD'; this optimizer is 'Adam'"),
    (lambda s, m: s["optimizer"].__setitem__("step_count", "six"), r"optimizer state 'step_count' is 'six'; expected a int"),
    (lambda s, m: s["trainer"].__setitem__("step", -1), r"trainer step is -1; expected an integer >= 0"),
    (lambda s, m: s["trainer"].__setitem__("epoch", 2), r"the trainer section has keys \['epoch', 'step'\]"),
    (lambda s, m: s.pop("trainer"), r"sections \['model', 'optimizer'\]; expected .*missing \['trainer'\]"),
    (lambda s, m: s.__setitem__("extra", {"x": 1}), r"unexpected \['extra'\]"),
    (lambda s, m: s["model"].__setitem__("network.params", s["model"]["network.params"].double()),
     r"network.params is \(8, \d+\) torch.float64, model has \(8, \d+\) torch.float32"),
    (lambda s, m: s["model"].__setitem__("network.bias", torch.zeros(3)), r"unexpected \['network.bias'\]"),
])
def test_failed_load_changes_nothing(tmp_path, edit, message):
    data = batches(6)
    good = tmp_path / "good.tinn"
    src = trained_and_saved(good, data, 3)
    bad = tmp_path / "bad.tinn"
    _rewrite(good, bad, edit)

    dst = Trainer.from_config(CONFIG, 2, 2, n_networks=8, seed=5)
    for b in data[3:]:
        dst.training_step(*b)
    before = _state(dst)
    with pytest.raises(CheckpointError, match=message):
        dst.load_checkpoint(bad)
    _assert_state(dst, before)  # model, optimizer and step untouched
    dst.load_checkpoint(good)  # and a good file still loads afterwards
    _assert_state(dst, _state(src))


@pytest.mark.parametrize("section,key,value,names", [
    ("network", "activation", "Tanh", r"network\.activation: 'ReLU' in the checkpoint, 'Tanh' here"),
    ("encoding", "per_level_scale", 1.7, r"encoding\.per_level_scale: 1\.5 in the checkpoint, 1\.7 here"),
    ("optimizer", "beta2", None, r"optimizer\.beta2: 0\.99 in the checkpoint, absent here"),
])
def test_config_mismatch_is_refused_unless_not_strict(tmp_path, section, key, value, names):
    # Every level hashed into 2^4 entries: another per_level_scale keeps the shapes.
    grid = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 4,
            "base_resolution": 8, "per_level_scale": 1.5}
    saved_cfg = dict(CONFIG, encoding=grid)
    src = Trainer.from_config(saved_cfg, 2, 2, n_networks=2)
    for b in batches(2, n_networks=2):
        src.training_step(*b)
    path = tmp_path / "run.tinn"
    src.save_checkpoint(path)

    other = {k: dict(v) for k, v in saved_cfg.items()}
    if value is None:
        del other[section][key]
    else:
        other[section][key] = value
    dst = Trainer.from_config(other, 2, 2, n_networks=2, seed=3)  # same shapes, other meaning
    before = _state(dst)
    with pytest.raises(CheckpointError, match=names + r".*Pass strict_config=False to load it anyway"):
        dst.load_checkpoint(path)
    _assert_state(dst, before)
    metadata = dst.load_checkpoint(path, strict_config=False)
    assert metadata["config"] == saved_cfg
    _assert_state(dst, _state(src))


@pytest.mark.parametrize("encoding,problem", [
    ({"otype": "Frequency", "n_frequencies": 2}, r"unexpected \['encoding\.params'\]"),
    ({"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 4},
     r"encoding\.params is \(2, \d+\) torch\.float32, model has \(2, \d+\)"),
])
def test_config_mismatch_says_when_shapes_differ_too(tmp_path, encoding, problem):
    """Where the other config also changes a table's shape, the config error says so up front instead of
    suggesting strict_config=False, which would then fail on the shapes."""
    grid = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 4}
    src = Trainer.from_config(dict(CONFIG, encoding=grid), 2, 2, n_networks=2)
    path = tmp_path / "run.tinn"
    src.save_checkpoint(path)
    dst = Trainer.from_config(dict(CONFIG, encoding=encoding), 2, 2, n_networks=2, seed=3)
    before = _state(dst)
    pattern = (r"saved with another config: encoding\..*Its parameters differ in shape too \(.*" + problem
               + r".*strict_config=False cannot load it")
    with pytest.raises(CheckpointError, match=pattern) as e:
        dst.load_checkpoint(path)
    assert "Pass strict_config=False to load it anyway" not in str(e.value)
    with pytest.raises(CheckpointError, match=problem):
        dst.load_checkpoint(path, strict_config=False)
    _assert_state(dst, before)


def test_stale_temporary_files_are_removed(tmp_path):
    import subprocess

    from tinn import checkpoint

    trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    path = tmp_path / "run.tinn"
    prefix = checkpoint._tmp_prefix(str(path))
    # A save killed half-way: its process wrote part of a temporary file and died.
    code = ("import os, sys; open(os.path.join(sys.argv[1], sys.argv[2] + str(os.getpid()) + '-abc'), 'wb')"
            ".write(b'half a checkpoint'); os._exit(9)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path), prefix], check=False)
    dead = [p.name for p in tmp_path.iterdir() if p.name.startswith(prefix)]
    assert len(dead) == 1
    live = tmp_path / f"{prefix}{os.getppid()}-xyz"  # a save of the same target in a running process
    other_target = tmp_path / f"{checkpoint._tmp_prefix(str(tmp_path / 'other.tinn'))}1-abc"
    live.write_bytes(b"in progress")
    other_target.write_bytes(b"not ours")
    trainer.save_checkpoint(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, live.name, other_target.name])

    # The next load cleans up too.
    subprocess.run([sys.executable, "-c", code, str(tmp_path), prefix], check=False)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(prefix)]) == 2
    trainer.load_checkpoint(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, live.name, other_target.name])


def test_v1_checkpoints_still_load_bit_exactly(tmp_path):
    import io
    import json

    import numpy as np

    src = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    for b in batches(3):
        src.training_step(*b)
    # A file as the first format wrote it: an .npz of arrays plus a JSON header of scalars and metadata.
    arrays, scalars = {}, {}
    for prefix, state in (("model", src.model.state_dict()), ("optimizer", src.optimizer.state_dict()),
                          ("trainer", {"step": src.step})):
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                arrays[f"{prefix}/{k}"] = v.cpu().numpy()
            else:
                scalars[f"{prefix}/{k}"] = v
    header = {"format": "tinn-checkpoint-v1", "scalars": scalars, "metadata": {"config": CONFIG}}
    buf = io.BytesIO()
    np.savez(buf, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays)
    path = tmp_path / "old.tinn"
    path.write_bytes(buf.getvalue())

    dst = Trainer.from_config(CONFIG, 2, 2, n_networks=8, seed=11)
    dst.load_checkpoint(path)
    _assert_state(dst, _state(src))
    dst.save_checkpoint(path)  # saving again writes the current format
    assert path.read_bytes()[8:9] == b"{"
