"""The image demo learns with a hash grid per tile, and beats Frequency at equal steps."""
import json
import os
import sys

import pytest

import tinn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demos"))


@pytest.mark.slow
def test_hash_grid_array_beats_frequency_at_equal_steps(tmp_path):
    import mlp_learning_an_image as demo

    # config_hash.json with smaller tables so 16 grids train quickly on 2 CPU cores.
    hash_cfg = tinn.load_config(os.path.join(ROOT, "tinn", "configs", "config_hash.json"))
    hash_cfg["encoding"].update({"n_levels": 8, "log2_hashmap_size": 12})
    hash_path = tmp_path / "hash.json"
    hash_path.write_text(json.dumps(hash_cfg))
    common = ["--arch", tinn.runtime.arch(), "--size", "64", "--tiles", "4", "--steps", "150", "--batch", "4096",
              "--log-every", "150"]
    grid = demo.run(common + ["--config", str(hash_path), "--out", str(tmp_path / "grid")])
    freq = demo.run(common + ["--config", os.path.join(ROOT, "tinn", "configs", "config.json"), "--out", str(tmp_path / "freq")])
    assert grid["n_networks"] == freq["n_networks"] == 16
    assert grid["final_psnr"] > 24.0, grid["history"]
    assert grid["final_psnr"] > freq["final_psnr"] + 2.0, (grid["final_psnr"], freq["final_psnr"])
