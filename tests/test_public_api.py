"""The supported names: `tinn.__all__` and every subpackage's `__all__` resolve, subpackages are reachable as
attributes after `import tinn`, and the public classes and functions carry their own docstrings."""
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

import tinn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBPACKAGES = sorted(m.name for m in pkgutil.iter_modules(tinn.__path__) if m.ispkg)


def test_every_name_in_tinn_all_resolves_and_is_documented():
    assert len(tinn.__all__) == len(set(tinn.__all__))
    for name in tinn.__all__:
        value = getattr(tinn, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"tinn.{name} has no docstring"
    assert set(tinn.__all__) <= set(dir(tinn))


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_every_subpackage_lists_names_that_resolve(package):
    module = importlib.import_module(f"tinn.{package}")
    names = getattr(module, "__all__", None)
    assert isinstance(names, list), f"tinn.{package} has no __all__"
    for name in names:
        assert hasattr(module, name) or importlib.import_module(f"tinn.{package}.{name}"), name


def test_subpackages_are_attributes_after_import_tinn_alone():
    # A fresh process: here the test session has imported them already.
    code = ("import tinn\n"
            "print(tinn.autodiff.AutodiffPart.__name__, tinn.distributed.ShardedPart.__name__,"
            " tinn.encodings.GridEncoding.__name__, tinn.torch.NetworkWithInputEncoding.__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TINN_ARCH="cpu"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-4:] == ["AutodiffPart", "ShardedPart", "GridEncoding", "TcnnNetworkWithInputEncoding"]
    with pytest.raises(AttributeError, match="no attribute 'autodif'"):
        tinn.autodif


def test_trainer_help_shows_its_own_docstring():
    # Without a class docstring, help() and inspect.getdoc fall back to the base class's.
    assert inspect.getdoc(tinn.Trainer) != inspect.getdoc(tinn.trainer.LearningRateOf)
    assert inspect.getdoc(tinn.Trainer).startswith("A model, its loss and its optimizer")


@pytest.mark.parametrize("target", [
    "tinn.Trainer", "tinn.Trainer.from_config", "tinn.Trainer.training_step", "tinn.Trainer.load_checkpoint",
    "tinn.NetworkArray", "tinn.NetworkWithInputEncoding", "tinn.encodings.GridEncoding", "tinn.load_config",
    "tinn.init", "tinn.checkpoint.save", "tinn.checkpoint.load", "tinn.checkpoint.restore_trainer",
    "tinn.create_encoding", "tinn.create_optimizer",
])
def test_reference_entries_document_args_and_returns_or_raises(target):
    obj = tinn
    for part in target.split(".")[1:]:
        obj = getattr(obj, part)
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):  # the reference merges __init__'s docstring into the class's
        doc += inspect.getdoc(obj.__init__) or ""
    assert "Args:" in doc, f"{target}: no Args section"
    assert "Returns:" in doc or "Raises:" in doc or inspect.isclass(obj), f"{target}: no Returns/Raises section"


def test_tcnn_padded_classes_say_so_by_name_and_differ_from_tinns_own():
    # tcnn's names exist in tinn.torch only, as aliases of the classes whose names say they pad as tcnn does.
    assert tinn.torch.NetworkWithInputEncoding is tinn.torch.TcnnNetworkWithInputEncoding
    assert tinn.torch.NetworkArray is tinn.torch.TcnnNetworkArray and tinn.torch.Network is tinn.torch.TcnnNetwork
    encoding = {"otype": "Frequency", "n_frequencies": 2}  # 3 inputs -> 12 features, padded to 16 for tcnn
    network = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}
    padded = tinn.torch.NetworkWithInputEncoding(3, 2, encoding, network)
    plain = tinn.NetworkWithInputEncoding(3, 2, encoding, network)
    assert padded.network.kernel_inputs == 16 and plain.network.kernel_inputs == 12
    assert (padded.n_params(), plain.n_params()) == (16 * 16 + 16 * 16, 12 * 16 + 16 * 2)
    x = torch.rand(5, 3, device=tinn.runtime.device())
    with torch.no_grad():  # the same weights where both have them: the padded bias column changes the function
        plain.network.params.copy_(torch.cat([padded.network.weights(0)[:, :, :12].reshape(1, -1),
                                              padded.network.weights(1)[:, :2].reshape(1, -1)], 1))
    assert not torch.allclose(padded(x), plain(x))
    with torch.no_grad():
        padded.network.weights(0)[:, :, 12:] = 0
    torch.testing.assert_close(padded(x), plain(x), rtol=1e-5, atol=1e-6)
