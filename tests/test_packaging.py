"""The wheel: built from the sources, installed apart from the checkout, its console scripts and shipped
configs work (the configs once lived outside the package, and an installed tinn could not find them)."""
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and starts five interpreters: about 40 s on two cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("tinn-image", "tinn-viewer", "tinn-precompile")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, install target) for a wheel built from a copy of the sources (the checkout stays clean)
    and installed without dependencies: torch and the backend come from this interpreter's environment."""
    pytest.importorskip("setuptools", minversion="61", reason="the test extra installs it; the wheel is built with it")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(os.path.join(ROOT, "tinn"), src / "tinn", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    # No build isolation: the setuptools already installed builds it, so nothing is downloaded.
    subprocess.run(pip + ["wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(base / "dist")],
                   check=True, cwd=base)
    (wheel,) = (base / "dist").glob("*.whl")
    target = base / "site"
    subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                   check=True, cwd=base)
    return wheel, target


def run_installed(target, argv, cwd):
    env = dict(os.environ, PYTHONPATH=str(target))  # the installed copy first, the checkout nowhere
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_wheel_has_distribution_name_configs_and_scripts(installed):
    wheel, _ = installed
    assert os.path.basename(wheel).startswith("tinn_arrays-")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in os.listdir(os.path.join(ROOT, "tinn", "configs")) if n.endswith(".json"))
    assert shipped and all(f"tinn/configs/{n}" in names for n in shipped), names
    # Every module and config of the package (a folder without __init__.py would be left out).
    sources = [os.path.relpath(os.path.join(folder, f), ROOT).replace(os.sep, "/")
               for folder, dirs, files in os.walk(os.path.join(ROOT, "tinn")) if "__pycache__" not in folder
               for f in files if f.endswith((".py", ".json"))]
    assert sorted(set(sources) - set(names)) == []
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script in SCRIPTS:
        assert f"{script} = " in text, text


@pytest.mark.parametrize("script", SCRIPTS)
def test_installed_console_script_runs(installed, script, tmp_path):
    _, target = installed
    result = run_installed(target, [str(target / "bin" / script), "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"usage: {script}" in result.stdout


def test_installed_package_loads_its_shipped_configs_by_name(installed, tmp_path):
    _, target = installed
    code = (
        "import tinn, tinn.precompile, tinn.viewer.__main__ as viewer, tinn.tasks.image_demo as demo\n"
        "print('>', tinn.__file__)\n"
        "for name in (viewer.parse_args([]).config, demo.parse_args([]).config, 'config_hash'):\n"
        "    cfg = tinn.load_config(name)\n"
        "    print('>', name, cfg['encoding']['otype'], cfg['network']['otype'])\n"
        "print('>', ' '.join(tinn.config.shipped_config_names()))\n")
    result = run_installed(target, [sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line[2:] for line in result.stdout.splitlines() if line.startswith("> ")]  # not Taichi's banner
    assert lines[0].startswith(str(target)), lines[0]  # the installed copy, not the checkout
    assert lines[1].split()[:2] == ["config.json", "Frequency"]
    assert lines[3].split()[:2] == ["config_hash", "HashGrid"]
    assert "optimizer_composite.json" in lines[4].split()
