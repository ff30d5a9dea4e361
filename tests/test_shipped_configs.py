"""Configs shipped in the package load by name from any directory; a file of that name here comes first."""
import json
import re
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


def test_nothing_refers_to_the_old_root_configs_folder():
    # The configs moved into the package (tinn/configs); a path to ./configs would fail only when run.
    stale = re.compile(r"(?<![\w/.-])configs/|(?:ROOT|HERE|here|\"\.\.\"), \"configs\"")
    found = []
    for folder in ("demos", "benchmarks", "tests", "tinn", "docs", ".ci"):
        for base, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d not in ("results", "__pycache__")]
            for name in files:
                path = os.path.join(base, name)
                if name.endswith((".py", ".sh", ".md")) and path != os.path.abspath(__file__):
                    with open(path, encoding="utf-8") as f:
                        found += [f"{os.path.relpath(path, ROOT)}:{i}" for i, line in enumerate(f, 1)
                                  if stale.search(line)]
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        found += [f"README.md:{i}" for i, line in enumerate(f, 1) if stale.search(line)]
    assert found == []
