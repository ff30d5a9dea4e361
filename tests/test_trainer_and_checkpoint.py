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
        out.append((x, y, ids))
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
        trainer.training_step(x, y.index_fill(0, torch.tensor([3]), float("inf")), ids)
    with pytest.raises(InputError, match="targets has last dimension 3; expected 2"):
        trainer.training_step(x, torch.rand(256, 3), ids)
    with pytest.raises(InputError, match="net_ids contains 8"):
        trainer.training_step(x, y, ids + 1)


def test_checkpoint_resumes_bit_exactly(tmp_path):
    data = batches(12)
    a = Trainer.from_config(CONFIG, 2, 2, n_networks=8)
    for b in data[:6]:
        a.training_step(*b)
    path = tmp_path / "run.tinn"
    a.save_checkpoint(path)
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


def test_image_demo_array_mode_reaches_psnr(tmp_path):
    import mlp_learning_an_image as demo

    summary = demo.run(["--arch", "cpu", "--size", "64", "--tiles", "4", "--steps", "200", "--batch", "4096",
                        "--out", str(tmp_path), "--save-at", "100,200", "--log-every", "100"])
    assert summary["n_networks"] == 16
    assert summary["final_psnr"] > 24.0, summary["history"]
    assert summary["history"][0]["psnr"] < summary["final_psnr"]
    assert (tmp_path / "step_000100.png").exists() and (tmp_path / "step_000200.png").exists()


def test_image_demo_single_network_learns(tmp_path):
    import mlp_learning_an_image as demo

    summary = demo.run(["--arch", "cpu", "--size", "64", "--steps", "200", "--batch", "4096",
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
