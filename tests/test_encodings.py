"""Parameter-free encodings (Identity, Frequency, TriangleWave, OneBlob, SphericalHarmonics) and Composite,
checked against float64 PyTorch references written here; derivatives (first and second order) against
torch autograd on those references."""
import math

import numpy as np
import pytest
import torch
from numpy.polynomial import legendre, polynomial

import tinn
from tinn.encodings import GridEncoding, create_encoding
from tinn.errors import ConfigError

DEV = tinn.runtime.device()


# ---------------------------------------------------------------------------------------------------------
# References (float64, plain torch)
# ---------------------------------------------------------------------------------------------------------
def ref_identity(x, scale=1.0, offset=0.0):
    return x * scale + offset


def ref_frequency(x, n):
    cols = []
    for d in range(x.shape[1]):
        for k in range(n):
            arg = (2.0**k) * math.pi * x[:, d]
            cols += [torch.sin(arg), torch.cos(arg)]
    return torch.stack(cols, dim=1)


def ref_triangle_wave(x, n):
    cols = []
    for d in range(x.shape[1]):
        for k in range(n):
            v = x[:, d] * 2.0 ** (k - 1) + 0.25 * k
            cols.append((v - torch.floor(v) - 0.5).abs() * 4 - 1)
    return torch.stack(cols, dim=1)


def _quartic_cdf(t, n_bins):
    u = t * n_bins
    return torch.clamp(15 / 16 * u * (1 - 2 / 3 * u**2 + u**4 / 5) + 0.5, 0.0, 1.0)


def ref_oneblob(x, n_bins):
    def wrapped(t):
        return _quartic_cdf(t, n_bins) + _quartic_cdf(t - 1, n_bins) + _quartic_cdf(t + 1, n_bins)

    cols = []
    for d in range(x.shape[1]):
        for k in range(n_bins):
            cols.append(wrapped((k + 1) / n_bins - x[:, d]) - wrapped(k / n_bins - x[:, d]))
    return torch.stack(cols, dim=1)


def ref_sh(x, degree):
    """Real SH (Condon-Shortley phase) as polynomials of v = 2x - 1, from Legendre polynomial derivatives:
    Y_lm = N_lm (-1)^m P_l^(m)(z) Re/Im((x + iy)^m), index l^2 + l + m."""
    vx, vy, vz = (2 * x - 1).unbind(1)
    re, im = [torch.ones_like(vx)], [torch.zeros_like(vx)]
    for _ in range(degree):
        re, im = re + [re[-1] * vx - im[-1] * vy], im + [re[-1] * vy + im[-1] * vx]
    out = [None] * degree**2
    for l in range(degree):
        p_l = legendre.leg2poly([0] * l + [1])  # power-series coefficients of P_l
        for m in range(l + 1):
            coef = (-1) ** m * polynomial.polyder(p_l, m) if m else p_l
            q = sum(float(c) * vz**i for i, c in enumerate(coef))
            n = math.sqrt((2 * l + 1) / (4 * math.pi) * math.factorial(l - m) / math.factorial(l + m))
            if m == 0:
                out[l * l + l] = n * q
            else:
                out[l * l + l + m] = math.sqrt(2) * n * q * re[m]
                out[l * l + l - m] = math.sqrt(2) * n * q * im[m]
    return torch.stack(out, dim=1)


# ---------------------------------------------------------------------------------------------------------
# Helpers: first- and second-order comparisons against the reference
# ---------------------------------------------------------------------------------------------------------
def close(a, b, rtol, atol_frac, what):
    a, b = a.detach(), b.detach().to(a.dtype)
    atol = atol_frac * max(float(b.abs().max()), 1e-12)
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def check_against_reference(enc, ref, x, rtol=1e-5, atol_frac=1e-5, second_order=True):
    """Forward, d/dx, and the gradients of an eikonal-style loss on d/dx (w.r.t. x and an upstream head)."""
    xr = x.double().requires_grad_(True)
    x1 = x.clone().requires_grad_(True)
    y, yr = enc(x1), ref(xr)
    assert y.shape == yr.shape == (x.shape[0], enc.n_output_dims)
    close(y, yr, rtol, atol_frac, "forward")

    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(x.device)
    gx, = torch.autograd.grad((y * w.float()).sum(), x1)
    gxr, = torch.autograd.grad((yr * w).sum(), xr)
    close(gx, gxr, rtol * 10, atol_frac * 10, "d/dx")
    if not second_order:
        return

    def eikonal(encode, x_, head):
        out = (encode(x_).to(head.dtype) @ head).tanh().sum()
        g, = torch.autograd.grad(out, x_, create_graph=True)
        return (g.norm(dim=1) - 1).square().sum() + (g * 0.5).sum()

    head = torch.randn(enc.n_output_dims, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.3
    head = head.to(x.device)
    x2, h2 = x.clone().requires_grad_(True), head.float().requires_grad_(True)
    eikonal(enc, x2, h2).backward()
    x3, h3 = x.double().requires_grad_(True), head.clone().requires_grad_(True)
    eikonal(ref, x3, h3).backward()
    close(h2.grad, h3.grad, rtol * 100, atol_frac * 100, "second order d/dhead (through dy)")
    close(x2.grad, x3.grad, rtol * 100, atol_frac * 100, "second order d/dx (Hessian term)")
    assert h3.grad.abs().max() > 1e-3


def rand(batch, dims, seed=0):
    return torch.rand(batch, dims, generator=torch.Generator().manual_seed(seed)).to(DEV)


# ---------------------------------------------------------------------------------------------------------
# Individual encodings
# ---------------------------------------------------------------------------------------------------------
def test_identity():
    enc = create_encoding(3, {"otype": "Identity", "scale": 2.5, "offset": -0.5})
    assert enc.n_output_dims == 3
    check_against_reference(enc, lambda x: ref_identity(x, 2.5, -0.5), rand(32, 3) * 4 - 2)
    default = create_encoding(2, {"otype": "Identity"})
    x = rand(4, 2)
    assert torch.equal(default(x), x)


@pytest.mark.parametrize("n", [1, 5])
def test_frequency(n):
    enc = create_encoding(3, {"otype": "Frequency", "n_frequencies": n})
    assert enc.n_output_dims == 3 * 2 * n
    check_against_reference(enc, lambda x: ref_frequency(x, n), rand(64, 3), rtol=1e-4, atol_frac=1e-5)
    assert create_encoding(2, {"otype": "Frequency"}).n_output_dims == 2 * 2 * 12  # tcnn default: 12


def test_triangle_wave():
    n = 6
    enc = create_encoding(3, {"otype": "TriangleWave", "n_frequencies": n})
    assert enc.n_output_dims == 3 * n
    check_against_reference(enc, lambda x: ref_triangle_wave(x, n), rand(64, 3), rtol=1e-4, atol_frac=1e-5)
    # known values: x = 0 gives v = k/4 -> 4|k/4 mod 1 - 1/2| - 1 = 1, 0, -1, 0, 1, 0 for k = 0..5
    assert enc(torch.zeros(1, 3, device=DEV))[0, :n].tolist() == [1.0, 0.0, -1.0, 0.0, 1.0, 0.0]
    assert create_encoding(1, {"otype": "TriangleWave"}).n_output_dims == 12


@pytest.mark.parametrize("n_bins", [4, 16])
def test_oneblob(n_bins):
    enc = create_encoding(2, {"otype": "OneBlob", "n_bins": n_bins})
    assert enc.n_output_dims == 2 * n_bins
    x = rand(64, 2)
    check_against_reference(enc, lambda x: ref_oneblob(x, n_bins), x, rtol=1e-4, atol_frac=1e-5)
    y = enc(x)
    # the wrapped blob integrates to one over the bins of each dim, and every bin is in [0, 1]
    torch.testing.assert_close(y.view(64, 2, n_bins).sum(-1), torch.ones(64, 2, device=DEV), rtol=0, atol=1e-5)
    assert y.min() >= -1e-6 and y.max() <= 1 + 1e-6
    # a point at a bin centre far from the edges puts most mass in its bin (quartic kernel, radius 1/n_bins)
    centre = torch.full((1, 2), (n_bins // 2 + 0.5) / n_bins, device=DEV)
    assert enc(centre)[0, n_bins // 2].item() == pytest.approx(2 * 15 / 16 * (0.5 - 2 / 3 * 0.125 + 0.2 * 0.03125),
                                                             rel=1e-5)


def test_oneblob_needs_power_of_two_bins():
    with pytest.raises(ConfigError, match=r"encoding\.n_bins=12 must be a power of two"):
        create_encoding(2, {"otype": "OneBlob", "n_bins": 12})
    assert create_encoding(1, {"otype": "OneBlob"}).n_output_dims == 16  # tcnn default


@pytest.mark.parametrize("degree", [1, 2, 4, 8])
def test_spherical_harmonics(degree):
    enc = create_encoding(3, {"otype": "SphericalHarmonics", "degree": degree})
    assert enc.n_output_dims == degree**2
    x = rand(48, 3)  # off the unit sphere too: tcnn evaluates the polynomials without normalising
    check_against_reference(enc, lambda x: ref_sh(x, degree), x, rtol=1e-4, atol_frac=1e-5,
                            second_order=degree > 1)


def test_spherical_harmonics_known_values():
    enc = create_encoding(3, {"otype": "SphericalHarmonics", "degree": 4})
    unit_vectors = [[0.6, -0.8, 0.0], [0.0, 0.0, 1.0], [0.48, 0.6, 0.64]]
    d = torch.tensor(unit_vectors, dtype=torch.float64, device=DEV)
    y = enc(((d + 1) / 2).float())
    x, yy, z = d.unbind(1)
    sp = math.sqrt(math.pi)
    expected = {
        0: torch.full_like(x, 1 / (2 * sp)),
        1: -math.sqrt(3) / (2 * sp) * yy, 2: math.sqrt(3) / (2 * sp) * z, 3: -math.sqrt(3) / (2 * sp) * x,
        4: math.sqrt(15) / (2 * sp) * x * yy, 6: math.sqrt(5) / (4 * sp) * (3 * z * z - 1),
        8: math.sqrt(15) / (4 * sp) * (x * x - yy * yy), 9: math.sqrt(70) / (8 * sp) * yy * (yy * yy - 3 * x * x),
        12: math.sqrt(7) / (4 * sp) * z * (5 * z * z - 3), 15: math.sqrt(70) / (8 * sp) * x * (3 * yy * yy - x * x),
    }
    for j, ref in expected.items():
        torch.testing.assert_close(y[:, j].double(), ref, rtol=1e-5, atol=1e-6, msg=f"basis {j}")
    # on the unit sphere the first degrees are orthonormal: sum of squares of band l is (2l+1)/(4 pi)
    for l in range(4):
        band = y[:, l * l:(l + 1) ** 2].double().square().sum(1)
        torch.testing.assert_close(band, torch.full_like(band, (2 * l + 1) / (4 * math.pi)), rtol=1e-5, atol=1e-6)


def test_spherical_harmonics_errors():
    with pytest.raises(ConfigError, match=r"encoding\.degree=9 is out of range"):
        create_encoding(3, {"otype": "SphericalHarmonics", "degree": 9})
    with pytest.raises(ConfigError, match="3D directions"):
        create_encoding(2, {"otype": "SphericalHarmonics"})


# ---------------------------------------------------------------------------------------------------------
# Composite
# ---------------------------------------------------------------------------------------------------------
def test_composite_nrc_example_concatenates_nested_encodings():
    cfg = {"otype": "Composite", "nested": [
        {"n_dims_to_encode": 3, "otype": "TriangleWave", "n_frequencies": 12},
        {"n_dims_to_encode": 5, "otype": "OneBlob", "n_bins": 4},
        {"otype": "Identity"},  # the remaining dim
    ]}
    enc = create_encoding(9, cfg)
    assert enc.n_output_dims == 36 + 20 + 1

    def ref(x):
        return torch.cat([ref_triangle_wave(x[:, :3], 12), ref_oneblob(x[:, 3:8], 4), x[:, 8:]], dim=1)

    check_against_reference(enc, ref, rand(32, 9), rtol=1e-4, atol_frac=1e-5)


def test_composite_reductions_and_explicit_ranges():
    x = rand(16, 3)
    nested = [{"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 1, "dims_to_encode_begin": 2},
              {"otype": "Frequency", "n_frequencies": 2, "n_dims_to_encode": 1, "dims_to_encode_begin": 0}]
    for reduction, combine in (("Sum", torch.add), ("Product", torch.mul)):
        enc = create_encoding(3, {"otype": "Composite", "reduction": reduction, "nested": nested})
        assert enc.n_output_dims == 4

        def ref(x_, combine=combine):
            return combine(ref_frequency(x_[:, 2:3], 2), ref_frequency(x_[:, 0:1], 2))

        check_against_reference(enc, ref, x, rtol=1e-4, atol_frac=1e-5)
    concat = create_encoding(3, {"otype": "Composite", "nested": [
        {"otype": "Identity", "n_dims_to_encode": 1, "dims_to_encode_begin": 2},
        {"otype": "Identity", "n_dims_to_encode": 2, "dims_to_encode_begin": 0}]})
    assert torch.equal(concat(x), x[:, [2, 0, 1]])


def test_composite_owns_one_parameter_table_for_nested_grids(grid_path, request):
    # The nested grids look up and differentiate their columns of the shared table (an offset into each row) on
    # both launch paths.
    launches = request.getfixturevalue("triton_grid_launches") if grid_path == "triton" else None
    grid_cfg = {"otype": "HashGrid", "n_levels": 3, "log2_hashmap_size": 8, "base_resolution": 4}
    cfg = {"otype": "Composite", "nested": [
        dict(grid_cfg, n_dims_to_encode=3),
        {"otype": "SphericalHarmonics", "degree": 3, "n_dims_to_encode": 3},
        dict(grid_cfg, n_dims_to_encode=2, n_features_per_level=4),
    ]}
    n = 3
    enc = create_encoding(8, cfg, n_networks=n, seed=5)
    g1, sh, g2 = enc.nested
    p1, p2 = g1.n_params_per_network(), g2.n_params_per_network()
    assert enc.params.shape == (n, p1 + p2) and g1.params is None and g2.params is None
    assert [p for p in enc.parameters()] == [enc.params]
    assert enc.n_output_dims == 6 + 9 + 12
    rep = enc.memory_report()
    assert rep["total_bytes"] == enc.memory_bytes() == n * (p1 + p2) * 4
    assert [r.get("bytes_per_network") for r in rep["nested"]] == [p1 * 4, None, p2 * 4]

    with torch.no_grad():
        enc.params.copy_(torch.rand(enc.params.shape, generator=torch.Generator().manual_seed(0)) * 2 - 1)
    x = rand(40, 8, seed=2)
    ids = torch.randint(0, n, (40,), generator=torch.Generator().manual_seed(3), dtype=torch.int32).to(DEV)
    x1 = x.clone().requires_grad_(True)
    y = enc(x1, ids)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(DEV)
    (y * w).sum().backward()

    # the same thing from standalone encodings holding the column ranges of the shared table
    kw = dict(n_levels=3, log2_hashmap_size=8, base_resolution=4, n_networks=n)
    s1, s2 = GridEncoding(3, **kw), GridEncoding(2, n_features_per_level=4, **kw)
    s_sh = create_encoding(3, {"otype": "SphericalHarmonics", "degree": 3})
    with torch.no_grad():
        s1.params.copy_(enc.params[:, :p1])
        s2.params.copy_(enc.params[:, p1:])
    x2 = x.clone().requires_grad_(True)
    y2 = torch.cat([s1(x2[:, :3], ids), s_sh(x2[:, 3:6]), s2(x2[:, 6:8], ids)], dim=1)
    torch.testing.assert_close(y, y2, rtol=0, atol=0)
    (y2 * w).sum().backward()
    torch.testing.assert_close(enc.params.grad, torch.cat([s1.params.grad, s2.params.grad], dim=1), rtol=1e-6,
                               atol=1e-6)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
    # The table gradient alone (no input gradient), the training case.
    enc.params.grad = None
    (enc(x, ids) * w).sum().backward()
    torch.testing.assert_close(enc.params.grad, torch.cat([s1.params.grad, s2.params.grad], dim=1), rtol=1e-6,
                               atol=1e-6)
    if launches is not None:
        assert "grid_forward" in launches and "grid_backward_table" in launches, launches


@pytest.mark.parametrize("cfg,pattern", [
    ({"nested": []}, r"encoding\.nested must be a non-empty JSON array"),
    ({"nested": [{"otype": "Identity"}, {"otype": "Identity"}]}, r"encoding\.nested\[1\]\.n_dims_to_encode is missing"),
    ({"nested": [{"otype": "Identity", "n_dims_to_encode": 5}]}, r"encode 5 dims but the composite has 3"),
    ({"reduction": "Sum", "nested": [{"otype": "Identity", "n_dims_to_encode": 1},
                                     {"otype": "Identity", "n_dims_to_encode": 2}]}, r"equal output width"),
    ({"reduction": "Max", "nested": [{"otype": "Identity"}]}, r"encoding\.reduction='Max'.*Concatenation"),
    ({"nested": [{"otype": "Fourier"}]}, r"encoding\.nested\[0\]\.otype='Fourier' is not supported"),
    ({"nested": [{"otype": "TriangleWave", "n_frequencies": 0}]}, r"encoding\.nested\[0\]\.n_frequencies=0"),
])
def test_composite_config_errors(cfg, pattern):
    with pytest.raises(ConfigError, match=pattern):
        create_encoding(3, {"otype": "Composite", **cfg})


def test_encodings_without_params_ignore_net_ids():
    enc = create_encoding(3, {"otype": "SphericalHarmonics", "degree": 2}, n_networks=8)
    assert enc.params is None and enc.n_params_per_network() == 0 and enc.memory_bytes() == 0
    x = rand(5, 3)
    assert torch.equal(enc(x), enc(x, torch.arange(5, dtype=torch.int32, device=DEV)))
