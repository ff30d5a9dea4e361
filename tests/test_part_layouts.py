"""Layout arguments of the part contract: every part's `forward_with_context` refuses an `x_layout` / `y_layout` it does
not declare (`input_layouts` / `output_layouts`), naming the argument and the allowed layouts, instead of
reading a feature-major tensor as if it were sample-major."""
import pytest
import torch

import tinn
import tinn.distributed.sharded  # noqa: F401  (its parts are Part subclasses too)
import tinn.torch as tcnn
from tinn.autodiff import AutodiffPart
from tinn.backend import ti
from tinn.encodings import create_encoding
from tinn.errors import ConfigError
from tinn.models import NetworkWithInputEncoding
from tinn.networks import NetworkArray
from tinn.part import FEATURE_MAJOR, LAYOUTS, SAMPLE_MAJOR, Part

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU"}
GRID = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8,
        "base_resolution": 4, "per_level_scale": 2.0}


@ti.func
def scaled(x: ti.template(), p: ti.template(), b, net, y: ti.template()):
    y[b, 0] = p[net, 0] * x[b, 0] + p[net, 1] * x[b, 1]


# One of every kind of part a user builds, 3 input dims each (built when its test runs).
PARTS = {
    "Identity": lambda: create_encoding(3, {"otype": "Identity"}),
    "Frequency": lambda: create_encoding(3, {"otype": "Frequency", "n_frequencies": 2}),
    "OneBlob": lambda: create_encoding(3, {"otype": "OneBlob", "n_bins": 4}),
    "TriangleWave": lambda: create_encoding(3, {"otype": "TriangleWave", "n_frequencies": 2}),
    "SphericalHarmonics": lambda: create_encoding(3, {"otype": "SphericalHarmonics", "degree": 2}),
    "HashGrid": lambda: create_encoding(3, GRID),
    "Composite": lambda: create_encoding(3, {"otype": "Composite", "nested": [
        {"otype": "Identity", "n_dims_to_encode": 1}, {"otype": "Frequency", "n_frequencies": 2}]}),
    "NetworkArray": lambda: NetworkArray(3, 3, NET, n_networks=2, seed=1),
    "Network": lambda: NetworkArray(3, 3, NET, n_networks=1, seed=1),
    "NetworkWithInputEncoding": lambda: NetworkWithInputEncoding(3, 3, GRID, NET, n_networks=2, seed=1),
    "tcnn.Network": lambda: tcnn.Network(3, 3, NET, seed=1),
    "tcnn.Encoding": lambda: tcnn.Encoding(3, {"otype": "Frequency", "n_frequencies": 2}),
    "tcnn.NetworkWithInputEncoding": lambda: tcnn.NetworkWithInputEncoding(3, 3, GRID, NET, seed=1),
    "AutodiffPart": lambda: AutodiffPart(scaled, 3, 1, 2, n_networks=2),
}


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_part_class_checks_its_layouts():
    """The check sits in the base class: every subclass's forward_with_context (tinn's, and any defined later) is
    wrapped."""
    classes = set(_subclasses(Part))
    assert len(classes) > 15
    for cls in classes:
        # abstract (tcnn.Encoding's adapter builds other classes)
        if cls.forward_with_context is Part.forward_with_context:
            continue
        assert getattr(cls.forward_with_context, "checks_layouts", False), cls.__qualname__

    class Late(Part):
        def forward_with_context(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR):
            return x, None

    late = Late(2, 2)
    x = torch.zeros(3, 2, device=tinn.runtime.device())
    assert late.forward_with_context(x, None, train=False)[0] is x
    with pytest.raises(ConfigError,
                       match=r"Late\.forward_with_context: x_layout='feature_major'.*allowed: \['sample_major'\]"):
        late.forward_with_context(x, None, train=False, x_layout=FEATURE_MAJOR)


@pytest.mark.parametrize("name", list(PARTS))
def test_undeclared_layouts_are_refused_naming_the_argument(name):
    part = PARTS[name]()
    dev = tinn.runtime.device()
    x = torch.rand(8, 3, generator=torch.Generator().manual_seed(0)).to(dev)
    ids = torch.zeros(8, dtype=torch.int32, device=dev)
    for argument, allowed in (("x_layout", part.input_layouts), ("y_layout", part.output_layouts)):
        for wrong in ("anything", "sample-major", "", None):
            allowed_text = ", ".join(map(repr, allowed))
            with pytest.raises(ConfigError, match=rf"{argument}={wrong!r} is not a layout this part .*"
                                                  rf"not a layout at all.*allowed: \[{allowed_text}\]"):
                part.forward_with_context(x, ids, train=True, **{argument: wrong})
        for layout in LAYOUTS:
            if layout not in allowed:
                with pytest.raises(ConfigError, match=rf"{argument}='{layout}' is not a layout this part"):
                    part.forward_with_context(x if layout == SAMPLE_MAJOR else x.t().contiguous(), ids, train=True,
                                              **{argument: layout})
    # The declared layouts run and agree with each other.
    reference, _ = part.forward_with_context(x, ids, train=False)
    for x_layout in part.input_layouts:
        for y_layout in part.output_layouts:
            xin = x if x_layout == SAMPLE_MAJOR else x.t().contiguous()
            y, _ = part.forward_with_context(xin, ids, train=False, x_layout=x_layout, y_layout=y_layout)
            y = y if y_layout == SAMPLE_MAJOR else y.t()
            torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-6)


def test_feature_major_input_to_a_sample_major_part_is_an_error_not_wrong_values():
    """A square batch reads without a shape error in either layout: only the check tells them apart."""
    freq = create_encoding(3, {"otype": "Frequency", "n_frequencies": 2})
    assert freq.input_layouts == (SAMPLE_MAJOR,)
    x = torch.rand(3, 3, generator=torch.Generator().manual_seed(1)).to(tinn.runtime.device())
    with pytest.raises(ConfigError, match=r"FrequencyEncoding\.forward_with_context: x_layout='feature_major' is not a "
                                          r"layout this part reads; allowed: \['sample_major'\]"):
        freq.forward_with_context(x.t().contiguous(), None, train=False, x_layout=FEATURE_MAJOR)
