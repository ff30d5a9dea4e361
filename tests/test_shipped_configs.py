"""Configs shipped in the package load by name from any directory; a file of that name here comes first."""
import json
import os

import pytest

from tinn.config import load_config, shipped_config_names, shipped_config_path
from tinn.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_shipped_names_are_the_package_configs():
    on_disk = sorted(n for n in os.listdir(os.path.join(ROOT, "tinn", "configs")) if n.endswith(".json"))
    assert shipped_config_names() == on_disk
    assert {"config.json", "config_hash.json"} <= set(on_disk)


def test_a_bare_name_loads_the_shipped_config_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    by_path = load_config(os.path.join(ROOT, "tinn", "configs", "config_hash.json"))
    assert load_config("config_hash.json") == by_path
    assert load_config("config_hash") == by_path  # ".json" optional
    assert by_path["encoding"]["otype"] == "HashGrid"
    assert os.path.samefile(shipped_config_path("config_hash"), os.path.join(ROOT, "tinn", "configs", "config_hash.json"))


def test_a_file_of_that_name_here_comes_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"network": {"otype": "CutlassMLP", "n_neurons": 8}}))
    assert load_config("config.json") == {"network": {"otype": "CutlassMLP", "n_neurons": 8}}


def test_an_unknown_name_lists_the_shipped_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'confg\.json': no such file here.*shipped configs: config\.json, "):
        load_config("confg.json")
    with pytest.raises(FileNotFoundError):  # a path with a directory is a path, never a shipped name
        load_config(os.path.join("configs", "config.json"))
