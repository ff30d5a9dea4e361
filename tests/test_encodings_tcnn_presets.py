"""tcnn encodings beyond its documentation (Empty, NRC / OneBlobFrequency), tcnn's defaults, no caps
tcnn does not have, and grid options tinn cannot honour rejected by name."""
import math

import pytest
import torch

from tinn.encodings import CompositeEncoding, EmptyEncoding, create_encoding
from tinn.errors import ConfigError

from test_encodings import check_against_reference, rand, ref_oneblob, ref_triangle_wave


def test_empty_has_no_outputs_and_a_zero_input_gradient(device):
    enc = create_encoding(3, {"otype": "Empty"})
    assert isinstance(enc, EmptyEncoding) and enc.n_output_dims == 0 and enc.params is None
    x = torch.rand(5, 3, device=device, requires_grad=True)
    y = enc(x)
    assert y.shape == (5, 0)
    (y.sum() + (x * 2).sum()).backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))  # Empty adds exactly zero


def test_empty_inside_a_composite_drops_its_dims(device):
    enc = create_encoding(4, {"otype": "Composite", "nested": [
        {"otype": "Empty", "n_dims_to_encode": 2}, {"otype": "Identity", "scale": 3.0}]})
    x = torch.rand(6, 4, device=device, requires_grad=True)
    y = enc(x)
    assert torch.equal(y, 3.0 * x[:, 2:])
    y.sum().backward()
    assert torch.equal(x.grad[:, :2], torch.zeros(6, 2, device=device))


@pytest.mark.parametrize("otype", ["NRC", "OneBlobFrequency", "nrc"])
def test_nrc_preset_is_tcnns_composite(otype):
    enc = create_encoding(10, {"otype": otype, "n_frequencies": 6, "n_bins": 8})
    assert isinstance(enc, CompositeEncoding)
    assert enc.n_output_dims == 3 * 6 + 5 * 8 + 2
    assert [e.otype for e in enc.nested] == ["TriangleWave", "OneBlob", "Identity"] and enc.begins == [0, 3, 8]

    def ref(x):
        return torch.cat([ref_triangle_wave(x[:, :3], 6), ref_oneblob(x[:, 3:8], 8), x[:, 8:]], dim=1)

    check_against_reference(enc, ref, rand(32, 10), rtol=1e-4, atol_frac=1e-5)


def test_nrc_defaults_and_exactly_eight_dims():
    enc = create_encoding(8, {"otype": "NRC"})  # tcnn: n_frequencies 12, n_bins 4; no dim left for Identity
    assert [e.otype for e in enc.nested] == ["TriangleWave", "OneBlob"]
    assert enc.nested[0].n_frequencies == 12 and enc.nested[1].n_bins == 4 and enc.n_output_dims == 36 + 20


def test_nrc_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"encoding\.otype='NRC'.*n_input_dims >= 8, got 7"):
        create_encoding(7, {"otype": "NRC"})
    with pytest.raises(ConfigError, match=r"encoding\.nested is not an option of 'OneBlobFrequency'"):
        create_encoding(9, {"otype": "OneBlobFrequency", "nested": []})
    with pytest.raises(ConfigError, match=r"encoding\.n_bins=3 must be a power of two"):
        create_encoding(9, {"otype": "NRC", "n_bins": 3})


def test_encoding_otype_defaults_to_oneblob_like_tcnn():
    enc = create_encoding(2, {"n_bins": 8})
    assert enc.otype == "OneBlob" and enc.n_bins == 8
    assert create_encoding(2, {}).otype == "OneBlob"
    assert create_encoding(2, None).otype == "Identity"  # no encoding given at all: tinn passes inputs through


@pytest.mark.parametrize("otype, slope", [("Frequency", lambda k: 2.0 ** k * math.pi),
                                          ("TriangleWave", lambda k: 2.0 ** (k + 1))])
def test_frequencies_past_24_are_exact_powers_of_two(otype, slope, device):
    # tcnn has no cap; frequency 2^31 overflowed a 32-bit shift before. At x = 0 the derivative of
    # Frequency's sin feature of band k is 2^k pi; TriangleWave's slope has magnitude 2^(k+1).
    n = 32
    enc = create_encoding(1, {"otype": otype, "n_frequencies": n})
    per_band = 2 if otype == "Frequency" else 1
    assert enc.n_output_dims == per_band * n
    for k in (0, 23, 30, 31):
        x = torch.full((1, 1), 0.0 if otype == "Frequency" else 1e-9, device=device, requires_grad=True)
        enc(x)[0, per_band * k].backward()
        assert abs(x.grad.item()) == pytest.approx(slope(k), rel=1e-6), k


def test_grid_options_tinn_cannot_honour_are_rejected_by_name():
    base = {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 10}
    create_encoding(2, {**base, "fixed_point_pos": False, "stochastic_interpolation": False})
    with pytest.raises(ConfigError, match=r"encoding\.fixed_point_pos=true .*JIT"):
        create_encoding(2, {**base, "fixed_point_pos": True})
