"""tinn.precompile: one training step and one inference pass fill Taichi's offline cache, so that a later
process with the same config loads every kernel instead of compiling it."""
import json
import os
import subprocess
import sys

import pytest

import tinn
from tinn.precompile import precompile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tinn", "configs", "config_hash.json")


def _cached(path):
    return sorted(f for _, _, files in os.walk(path) for f in files if f.endswith(".tic"))


def _precompile_process(cache):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TI_OFFLINE_CACHE_FILE_PATH", None)
    proc = subprocess.run([sys.executable, "-m", "tinn.precompile", "--arch", "cpu", "--config", CONFIG,
                           "--batch", "256", "--cache-dir", str(cache), "--json"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing_new(tmp_path):
    first = _precompile_process(tmp_path)
    assert first["arch"] == "cpu" and os.path.samefile(first["cache_dir"], tmp_path)
    kernels = first["kernels"]
    for name in ("image_sampling.sample_image_batch", "grid_encoding.grid_forward", "losses.loss_forward",
                 "optimizers.adam_step_pair"):
        assert f"tinn.kernels.{name}" in kernels
    # The table gradient: one task per level on a CPU with no more threads than levels, else per sample.
    assert len([k for k in kernels if k.startswith("tinn.kernels.grid_encoding.grid_backward")]) == 1
    # The demo's single network runs as dense GEMMs on the CPU (tinn/dense_mlp.py): no MLP kernel to compile.
    assert not [k for k in kernels if "mlp_array" in k]
    cached = _cached(tmp_path)
    assert len(cached) >= len(kernels)

    second = _precompile_process(tmp_path)
    assert second["kernels"] == kernels     # the same instances built again in Python ...
    assert _cached(tmp_path) == cached      # ... and every one loaded from the cache, none compiled


def test_precompile_in_process_without_the_image_task(monkeypatch):
    """With image=False the image task is never built, and afterwards the same config's training step and
    inference build no kernel instance the precompile did not (what the cache is filled for)."""
    import torch

    from tinn.precompile import recording
    from tinn.tasks import image
    from tinn.trainer import Trainer

    def no_image_task(*args, **kwargs):
        raise AssertionError("image=False built the image task")

    monkeypatch.setattr(image, "ImageTask", no_image_task)
    config = {"encoding": {"otype": "Frequency", "n_frequencies": 2},
              "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}}
    built = precompile(config, 3, 2, n_networks=4, batch=128, image=False)
    assert isinstance(built, list) and all(name.startswith(("tinn.", "taichi.")) for name in built)
    with pytest.raises(ValueError, match="image=True needs 2 inputs, 3 outputs"):
        precompile(config, 3, 2, n_networks=4, batch=128)
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(9)
    x, target = torch.rand(128, 3, generator=gen).to(dev), torch.rand(128, 2, generator=gen).to(dev)
    ids = torch.randint(0, 4, (128,), generator=gen, dtype=torch.int32).to(dev)
    with recording() as later:
        trainer = Trainer.from_config(config, 3, 2, n_networks=4, seed=5)
        float(trainer.training_step(x, target, ids))
        with torch.no_grad():
            trainer.model(x, ids)
        tinn.runtime.sync()
    assert later == [], f"kernels the precompile missed: {later}"
    # ... and the recording sees a kernel instance built for the first time (so the empty list above means
    # something).
    from tinn.backend import ti

    @ti.kernel
    def fresh(out: ti.types.ndarray(dtype=ti.f32, ndim=1)):
        out[0] = 1.0

    with recording() as first_build:
        fresh(torch.zeros(1, device=dev))
    assert first_build == [f"{__name__}.fresh"]
    assert precompile(config, 3, 2, n_networks=4, batch=128, image=False) == []  # nothing left to build
