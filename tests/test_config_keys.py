"""Every config section rejects unknown keys (full key path, allowed keys, closest match), and count
arguments refuse bools, in JSON and in constructors alike."""
import copy

import numpy as np
import pytest
import torch

import tinn
from tinn.config import Section
from tinn.encodings import ENCODINGS, FrequencyEncoding, GridEncoding, create_encoding, register_encoding
from tinn.encodings.basic import IdentityEncoding
from tinn.errors import ConfigError
from tinn.losses import LOSSES, create_loss
from tinn.models import NetworkWithInputEncoding
from tinn.networks import NetworkArray
from tinn.optimizers import OPTIMIZERS, create_optimizer
from tinn.trainer import Trainer

SMALL_GRID = {"n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8, "base_resolution": 4}
CONFIG = {
    "loss": {"otype": "L2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
    "encoding": {"otype": "HashGrid", **SMALL_GRID, "per_level_scale": 2.0},
    "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU"},
}
GRID_KEYS = ['base_resolution', 'fixed_point_pos', 'hash', 'interpolation', 'log2_hashmap_size', 'n_features',
             'n_features_per_level',
             'n_grid_features', 'n_levels', 'otype', 'per_level_scale', 'stochastic_interpolation', 'table_dtype',
             'type']


def with_key(section, key, value):
    cfg = copy.deepcopy(CONFIG)
    cfg[section][key] = value
    return cfg


@pytest.mark.parametrize("section,key,message", [
    ("network", "n_neuron", r"^network\.n_neuron is not an option of 'FullyFusedMLP'; allowed: \['activation', "
                            r"'n_hidden_layers', 'n_neurons', 'otype', 'output_activation'\]; did you mean 'n_neurons'\?$"),
    ("network", "n_hidden_layer", r"^network\.n_hidden_layer is not an option.*did you mean 'n_hidden_layers'\?$"),
    ("encoding", "n_level", r"^encoding\.n_level is not an option of 'HashGrid'; allowed: "
                            + r"\[" + ", ".join(f"'{k}'" for k in GRID_KEYS) + r"\]; did you mean 'n_levels'\?$"),
    ("encoding", "log2_hashmap", r"^encoding\.log2_hashmap is not an option.*did you mean 'log2_hashmap_size'\?$"),
    ("encoding", "otyp", r"^encoding\.otyp is not an option.*did you mean 'otype'\?$"),
    ("loss", "weight", r"^loss\.weight is not an option of 'L2'; allowed: \['otype'\]$"),
    ("optimizer", "learnig_rate", r"^optimizer\.learnig_rate is not an option of 'Adam'.*did you mean 'learning_rate'\?$"),
])
def test_unknown_keys_name_path_allowed_and_closest(section, key, message):
    with pytest.raises(ConfigError, match=message):
        Trainer.from_config(with_key(section, key, 3), 2, 3)


def test_unknown_top_level_section():
    cfg = dict(copy.deepcopy(CONFIG), netwrk={"n_neurons": 16})
    with pytest.raises(ConfigError, match=r"^netwrk is not an option of a trainer config; allowed: \['encoding', "
                                          r"'loss', 'network', 'optimizer'\]; did you mean 'network'\?$"):
        Trainer.from_config(cfg, 2, 3)


def test_no_suggestion_when_nothing_is_close():
    with pytest.raises(ConfigError) as e:
        Trainer.from_config(with_key("network", "zzz", 1), 2, 3)
    assert "did you mean" not in str(e.value)


# A valid config of every encoding otype (the unknown-key test below adds a key to each).
ENCODING_CONFIGS = {
    "Identity": {"scale": 2.0, "offset": 0.5},
    "Frequency": {"n_frequencies": 2},
    "TriangleWave": {"n_frequencies": 2},
    "OneBlob": {"n_bins": 4},
    "SphericalHarmonics": {"degree": 2},
    "Composite": {"nested": [{"otype": "Frequency", "n_dims_to_encode": 1, "n_frequencies": 2},
                             {"otype": "OneBlob", "n_bins": 4}]},
    **{g: dict(SMALL_GRID, stochastic_interpolation=False) for g in ("Grid", "HashGrid", "DenseGrid", "TiledGrid")},
    "Empty": {},
    "NRC": {"n_frequencies": 4, "n_bins": 4},
    "OneBlobFrequency": {"n_frequencies": 4, "n_bins": 4},
}
INPUT_DIMS = {"NRC": 8, "OneBlobFrequency": 8}  # the NRC presets encode 3 + 5 dims


def test_every_encoding_otype_is_covered():
    assert set(ENCODING_CONFIGS) == set(ENCODINGS)


@pytest.mark.parametrize("otype", sorted(ENCODING_CONFIGS))
def test_every_encoding_accepts_its_keys_and_rejects_others(otype):
    dims = INPUT_DIMS.get(otype, 3)
    cfg = {"otype": otype, **ENCODING_CONFIGS[otype]}
    enc = create_encoding(dims, cfg, n_networks=2)
    assert enc.n_input_dims == dims
    with pytest.raises(ConfigError, match=rf"^encoding\.n_networks is not an option of '{otype}'; allowed: \[.*'otype'"):
        create_encoding(dims, dict(cfg, n_networks=2))


def test_composite_nested_items_are_checked_with_their_path():
    cfg = {"otype": "Composite", "nested": [{"otype": "Frequency", "n_dims_to_encode": 1, "n_frequencies": 2},
                                            {"otype": "Composite", "nested": [{"otype": "OneBlob", "n_bin": 4}]}]}
    with pytest.raises(ConfigError, match=r"^encoding\.nested\[1\]\.nested\[0\]\.n_bin is not an option of 'OneBlob'; "
                                          r"allowed: \['dims_to_encode_begin', 'n_bins', 'n_dims_to_encode', "
                                          r"'otype'\]; did you mean 'n_bins'\?$"):
        create_encoding(3, cfg)
    # The composite's own keys are not allowed at the top of a plain encoding.
    with pytest.raises(ConfigError, match=r"^encoding\.n_dims_to_encode is not an option of 'Frequency'"):
        create_encoding(3, {"otype": "Frequency", "n_dims_to_encode": 3})


def test_every_loss_rejects_unknown_keys():
    for otype in LOSSES:
        assert create_loss({"otype": otype}).otype == otype
        with pytest.raises(ConfigError, match=rf"^loss\.reduction is not an option of '{otype}'; allowed: \['otype'\]$"):
            create_loss({"otype": otype, "reduction": "mean"})


def _params():
    model = NetworkWithInputEncoding(2, 2, {"otype": "HashGrid", **SMALL_GRID},
                                     {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}, n_networks=2)
    return list(model.named_parameters())


def _optimizer_config(otype):
    if otype == "Composite":
        return {"otype": otype, "nested": [{"params": "encoding", "otype": "Adam"}, {"params": "network", "otype": "SGD"}]}
    if "nested" in OPTIMIZERS[otype].OPTIONS:
        return {"otype": otype, "nested": {"otype": "Adam"}}
    return {"otype": otype}


@pytest.mark.parametrize("otype", sorted(OPTIMIZERS))
def test_every_optimizer_rejects_unknown_keys(otype):
    params = _params()
    assert create_optimizer(_optimizer_config(otype), params).otype == otype
    with pytest.raises(ConfigError, match=rf"^optimizer\.momentum is not an option of '{otype}'; allowed: \["):
        create_optimizer(dict(_optimizer_config(otype), momentum=0.9), params)


def test_nested_optimizers_are_checked_with_their_path():
    params = _params()
    cfg = {"otype": "EMA", "nested": {"otype": "ExponentialDecay", "nested": {"otype": "Adam", "beta_1": 0.9}}}
    with pytest.raises(ConfigError, match=r"^optimizer\.nested\.nested\.beta_1 is not an option of 'Adam'.*"
                                          r"did you mean 'beta1'\?$"):
        create_optimizer(cfg, params)
    cfg = {"otype": "Composite", "nested": [{"params": "encoding", "otype": "Adam"},
                                            {"param": "network", "otype": "SGD"}]}
    with pytest.raises(ConfigError, match=r"^optimizer\.nested\[1\]\.param is not an option of 'SGD'; allowed: "
                                          r"\['l2_reg', 'learning_rate', 'n_params_to_optimize', 'otype', 'params'\]; "
                                          r"did you mean 'params'\?$"):
        create_optimizer(cfg, params)


@pytest.mark.parametrize("build", [
    lambda: Trainer.from_config(CONFIG, 2, 3, n_networks=True),
    lambda: Trainer.from_config(CONFIG, True, 3),
    lambda: Trainer.from_config(CONFIG, 2, True),
    lambda: NetworkArray(4, 2, {"n_neurons": 16}, n_networks=True),
    lambda: NetworkArray(4, False, {"n_neurons": 16}),
    lambda: FrequencyEncoding(2, n_frequencies=True),
    lambda: IdentityEncoding(2, n_networks=True),
    lambda: GridEncoding(2, n_levels=True),
    lambda: GridEncoding(2, log2_hashmap_size=True),
    lambda: create_encoding(True, {"otype": "Frequency"}),
    lambda: NetworkWithInputEncoding(2, 3, {"otype": "Frequency"}, {"n_neurons": 16}, n_networks=True),
    lambda: Trainer.from_config(with_key("network", "n_hidden_layers", True), 2, 3),
    lambda: Trainer.from_config(with_key("encoding", "n_levels", True), 2, 3),
])
def test_counts_refuse_bools(build):
    with pytest.raises(ConfigError, match=r"=(True|False) must be an integer"):
        build()


def test_counts_accept_numpy_integers():
    net = NetworkArray(np.int64(4), np.int32(2), {"n_neurons": 16}, n_networks=np.int64(3))
    assert (net.n_input_dims, net.n_output_dims, net.n_networks) == (4, 2, 3)
    assert type(net.n_networks) is int
    with pytest.raises(ConfigError, match=r"n_networks=0 is out of range; allowed: >= 1 and <= 1048576"):
        NetworkArray(4, 2, {"n_neurons": 16}, n_networks=0)
    with pytest.raises(ConfigError, match=r"n_networks=2.0 must be an integer"):
        NetworkArray(4, 2, {"n_neurons": 16}, n_networks=2.0)


def test_reading_an_undeclared_key_is_a_programming_error():
    class Sloppy(IdentityEncoding):
        otype = "Sloppy"
        OPTIONS = ("scale",)

        @classmethod
        def from_config(cls, n_input_dims, cfg, n_networks=1, seed=1337):
            return cls(n_input_dims, cfg.number("scale", 1.0), cfg.number("offset", 0.0), n_networks)

    class Undeclared(IdentityEncoding):
        otype = "Undeclared"
        OPTIONS = None

    register_encoding("Sloppy", Sloppy)
    register_encoding("Undeclared", Undeclared)
    try:
        with pytest.raises(TypeError, match=r"encoding\.offset is read but not declared: add 'offset' to the OPTIONS"):
            create_encoding(2, {"otype": "Sloppy"})
        with pytest.raises(TypeError, match="Undeclared must declare OPTIONS"):
            create_encoding(2, {"otype": "Undeclared"})
    finally:
        del ENCODINGS["Sloppy"], ENCODINGS["Undeclared"]


def test_section_expect_keys_directly():
    s = Section({"alpha": 1, "bta": 2}, "opt", extra_keys=("params",))
    with pytest.raises(ConfigError, match=r"^opt\.bta is not an option of 'X'; allowed: \['alpha', 'beta', 'otype', "
                                          r"'params'\]; did you mean 'beta'\?$"):
        s.expect_keys(("otype", "alpha", "beta"), "'X'")
    ok = Section({"alpha": 1, "params": "a"}, "opt", extra_keys=("params",))
    ok.expect_keys(("otype", "alpha"), "'X'")
    assert ok.integer("alpha") == 1


def test_trainer_from_config_still_builds_and_trains():
    """What the config says is built (grid, network, loss, optimizer), and one step trains it: the loss is the L2
    formula on the model's output, the gradients are a float64 reference's, and Adam's first step moves each
    weight by the learning rate against its gradient's sign."""
    from reference import mlp_array
    from test_encodings_grid import ref_grid

    trainer = Trainer.from_config(CONFIG, 2, 3, n_networks=2)
    model = trainer.model
    assert type(model.encoding).__name__ == "GridEncoding" and model.encoding.grid_type == "Hash"
    assert (model.encoding.n_levels, model.encoding.n_features_per_level, model.encoding.n_networks) == (2, 2, 2)
    assert (model.network.width, model.network.n_layers, model.network.n_networks) == (16, 2, 2)
    assert trainer.loss.otype == "L2" and type(trainer.optimizer).__name__ == "Adam"
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(64, 2, generator=gen).to(dev)
    t = torch.rand(64, 3, generator=gen).to(dev)
    ids = torch.randint(0, 2, (64,), dtype=torch.int32, generator=gen).to(dev)
    before = [p.detach().clone() for p in model.parameter_tables()]
    enc64, net64 = (p.double().requires_grad_(True) for p in before)
    y64 = mlp_array(model.network, net64, ref_grid(model.encoding, x.double(), enc64, ids), ids, "ReLU", "None")
    ref_loss = ((y64 - t.double()) ** 2).mean()
    ref_loss.backward()

    loss = trainer.training_step(x, t, ids)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    for p, p0, ref, l2_reg in zip(model.parameter_tables(), before, (enc64.grad, net64.grad), (0.0, 1e-8)):
        torch.testing.assert_close(p.grad.double(), ref, rtol=1e-3, atol=1e-4 * float(ref.abs().max()))
        # tcnn's first Adam step (beta2 0.999, epsilon 1e-8, l2_reg on the network's weights only):
        # lr * sqrt(1 - beta2) * g / (sqrt(1 - beta2) * |g| + epsilon), about lr * sign(g)
        g = ref + l2_reg * p0.double()
        root = (1 - 0.999) ** 0.5
        moved = ref.abs() > 1e-3 * float(ref.abs().max())
        assert moved.sum() > 10
        expected = -1e-2 * root * g / (root * g.abs() + 1e-8)
        torch.testing.assert_close((p.detach() - p0).double()[moved], expected[moved], rtol=2e-3, atol=1e-7)
