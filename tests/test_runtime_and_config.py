"""Runtime initialisation and tcnn config loading/validation."""
import json
import os
import subprocess
import sys

import pytest
import torch

import tinn
from tinn.config import Section, load_config, loads
from tinn.errors import ConfigError
from tinn.models import NetworkWithInputEncoding
from tinn.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_init_is_idempotent_and_refuses_switching():
    arch = tinn.runtime.arch()
    assert arch == tinn.runtime._resolve(os.environ["TINN_ARCH"])  # conftest's init follows TINN_ARCH
    assert tinn.init() == arch
    assert tinn.init(arch) == arch
    assert tinn.runtime.device().type == arch
    with pytest.raises(ConfigError, match=f"already initialised with arch='{_other(arch)}'; cannot switch to '{arch}'"):
        _switch()


def _other(arch):
    return "cuda" if arch == "cpu" else "cpu"


def _switch():
    # Asking for another arch after init must fail loudly. A machine may have only one of them, so the state
    # is faked to the other arch and this process's arch is asked for.
    old = tinn.runtime._state["arch"]
    tinn.runtime._state["arch"] = _other(old)
    try:
        tinn.init(old)
    finally:
        tinn.runtime._state["arch"] = old


def test_bad_arch_names_allowed_values():
    with pytest.raises(ConfigError, match="allowed"):
        tinn.runtime._resolve("tpu")


def test_kernel_before_init_gives_clear_error():
    code = ("import tinn, torch\n"
            "from tinn.kernels import mlp_array\n"
            "try:\n"
            "    tinn.runtime.device()\n"
            "except tinn.NotInitializedError as e:\n"
            "    print('OK', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "OK tinn is not initialised: call tinn.init()" in out.stdout, out.stderr


@pytest.mark.slow
def test_tinn_arch_environment_variable():
    code = "import tinn; print('ARCH', tinn.init())"
    env = dict(os.environ, TINN_ARCH="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "ARCH cpu" in out.stdout, out.stderr
    env["TINN_ARCH"] = "metal"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "arch='metal' is not supported" in out.stderr


def test_comments_in_json_like_commentjson():
    text = """
    // line comment
    {
        "a": "http://not-a-comment", # hash comment
        /* block
           comment */
        "b": [1, 2, 3],
        "c": "/* kept */"
    }"""
    assert loads(text) == {"a": "http://not-a-comment", "b": [1, 2, 3], "c": "/* kept */"}


def test_invalid_json_reports_line():
    with pytest.raises(ConfigError, match="line 3"):
        loads('{\n"a": 1,\n"b": }')


def test_shipped_configs_load_and_build():
    for name in sorted(os.listdir(os.path.join(ROOT, "tinn", "configs"))):
        if name.startswith("config") and name.endswith(".json"):  # full tcnn-style configs
            cfg = load_config(os.path.join(ROOT, "tinn", "configs", name))
            assert {"loss", "optimizer", "encoding", "network"} <= set(cfg), name
            trainer = Trainer.from_config(cfg, 2, 3, n_networks=2)
            assert trainer.model.network.n_networks == 2


@pytest.mark.parametrize("section,patch,message", [
    ("network", {"otype": "Transformer"}, r"network\.otype='Transformer' is not supported; allowed: \['FullyFusedMLP', 'CutlassMLP', 'MLP', 'MegakernelMLP'\]"),
    ("network", {"n_neurons": 100}, r"network\.n_neurons=100 is not supported; allowed: \[16, 32, 64, 128\]"),
    ("network", {"n_hidden_layers": -1}, r"network\.n_hidden_layers=-1 is out of range"),
    ("encoding", {"otype": "Fourier"}, r"encoding\.otype='Fourier' is not supported; allowed: \["),
    ("encoding", {"n_frequencies": 0}, r"encoding\.n_frequencies=0 is out of range"),
    ("loss", {"otype": "Huber"}, r"loss\.otype"),
    ("optimizer", {"otype": "RMSprop"}, r"optimizer\.otype"),
    ("optimizer", {"learning_rate": -1}, r"optimizer\.learning_rate"),
])
def test_config_errors_name_the_key(section, patch, message):
    cfg = load_config(os.path.join(ROOT, "tinn", "configs", "config.json"))
    cfg[section] = dict(cfg[section], **patch)
    with pytest.raises(ConfigError, match=message):
        Trainer.from_config(cfg, 2, 3)


def test_missing_network_section():
    with pytest.raises(ConfigError, match="network is missing"):
        Trainer.from_config({"loss": {"otype": "L2"}}, 2, 3)


def test_section_accessors():
    s = Section({"n": 3, "x": 0.5, "flag": True, "name": "relu"}, "net")
    assert s.integer("n", lo=1) == 3 and s.number("x") == 0.5 and s.boolean("flag") is True
    assert s.choice("name", ["ReLU", "Tanh"]) == "ReLU"
    with pytest.raises(ConfigError, match=r"net\.n=3 is out of range; allowed: >= 4"):
        s.integer("n", lo=4)
    with pytest.raises(ConfigError, match=r"net\.x=0.5 must be an integer"):
        s.integer("x")
    with pytest.raises(ConfigError, match=r"net\.flag=True must be a finite number"):
        s.number("flag")
    with pytest.raises(ConfigError, match=r"net\.missing is missing"):
        s.number("missing")


_NETWORK = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}


def _relative_l2(pred, target):
    p, t = pred.double(), target.double()
    return float(((p - t) ** 2 / (p ** 2 + 0.01)).mean())


@pytest.mark.parametrize("config", [
    {"network": _NETWORK},                                                   # sections absent
    {"loss": {}, "encoding": {"n_bins": 4}, "optimizer": {}, "network": _NETWORK},   # present, no otype
])
def test_sections_without_otype_take_tcnns_defaults(config):
    """tcnn's create_from_config: RelativeL2 loss, OneBlob encoding, Adam optimizer where `otype` is absent."""
    trainer = Trainer.from_config(config, 2, 3)
    assert type(trainer.model.encoding).__name__ == "OneBlobEncoding"
    assert type(trainer.optimizer).__name__ == "Adam"
    gen = torch.Generator().manual_seed(0)
    pred, target = (torch.randn(64, 3, generator=gen).to(tinn.runtime.device()) for _ in range(2))
    value = float(trainer.loss.evaluate(pred, target).value)
    assert value == pytest.approx(_relative_l2(pred, target), rel=1e-5)
    assert value != pytest.approx(float(((pred - target) ** 2).mean()), rel=1e-3)  # not L2


def test_a_loss_dict_without_otype_is_relative_l2_and_no_loss_is_l2():
    model = NetworkWithInputEncoding(2, 3, {"otype": "Identity"}, _NETWORK)
    assert Trainer(model, loss={}).loss.otype == "RelativeL2"
    assert Trainer(model).loss.otype == "L2"  # tinn's own constructor default


def test_tcnn_facade_names_the_encoding_it_built():
    import tinn.torch as tcnn
    assert tcnn.Encoding(2, {"n_bins": 4}).otype == "OneBlob"
    assert tcnn.NetworkWithInputEncoding(2, 3, {}, _NETWORK).encoding.otype == "OneBlob"
    assert tcnn.Encoding(2, None).otype == "Identity"
