"""Grid encodings (Hash / Dense / Tiled), single and as arrays of grids, against a float64 reference.

The reference below is an independent plain-PyTorch implementation of tcnn's rules (level scale,
+0.5 staggering, dense index with uint32 wraparound, coherent prime hash, N-linear / smoothstep
weights); its derivatives come from torch autograd, including the second-order ones.
"""
import math

import numpy as np
import pytest
import torch

import tinn
from tinn.encodings import GridEncoding, create_encoding
from tinn.encodings.grid_layout import default_per_level_scale, grid_layout
from tinn.errors import ConfigError, InputError

M32 = 0xFFFFFFFF
MAX_DENSE = {2: 0xFFFF, 3: 0x659, 4: 0xFF}
COHERENT = (1, 2654435761, 805459861, 3674653429)
DEV = tinn.runtime.device()


# ---------------------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------------------
def ref_entry(coords: np.ndarray, res: int, size: int, grid_type: str) -> np.ndarray:
    """Table entry of integer lattice coords (B, D) following tcnn's grid_index."""
    d = coords.shape[1]
    c = (coords.astype(np.int64) & M32).astype(np.uint64)
    if res <= MAX_DENSE[d]:
        idx = np.zeros(len(c), dtype=np.uint64)
        for k in range(d):
            idx = (idx + c[:, k] * np.uint64(res**k)) & np.uint64(M32)
        stride = res**d
    else:
        idx, stride = np.zeros(len(c), dtype=np.uint64), M32
    if grid_type == "Hash" and size < stride:
        idx = np.zeros(len(c), dtype=np.uint64)
        for k in range(d):
            idx ^= (c[:, k] * np.uint64(COHERENT[k])) & np.uint64(M32)
    return (idx % np.uint64(size)).astype(np.int64)


def ref_grid(enc: GridEncoding, x: torch.Tensor, params: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """float64 lookup, differentiable (twice) in x and params through torch autograd."""
    d, f = enc.n_input_dims, enc.n_features_per_level
    outs = []
    for lv in enc.layout.levels:
        # The cell is chosen in float32 like the kernel does (a float64 floor can pick the neighbour cell
        # when x * scale lands within rounding of an integer); the interpolation itself is float64.
        cell = torch.floor(x.detach().float() * np.float32(lv.scale) + 0.5).long()
        t = x * lv.scale + 0.5 - cell
        s = t * t * (3 - 2 * t) if enc.interpolation == "Smoothstep" else t
        corners = [0] if enc.interpolation == "Nearest" else range(1 << d)
        acc = 0
        for c in corners:
            bits = torch.tensor([(c >> k) & 1 for k in range(d)], device=x.device)
            w = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
            if enc.interpolation != "Nearest":
                for k in range(d):
                    w = w * (s[:, k] if bits[k] else 1 - s[:, k])
            e = torch.from_numpy(ref_entry((cell + bits).cpu().numpy(), lv.resolution, lv.size, enc.grid_type))
            cols = lv.offset * f + e.to(x.device)[:, None] * f + torch.arange(f, device=x.device)
            acc = acc + w[:, None] * params[ids.long()[:, None], cols]
        outs.append(acc)
    return torch.cat(outs, dim=1)


def make(n_dims, n_networks=1, seed=0, **kw):
    enc = GridEncoding(n_dims, n_networks=n_networks, **kw)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # O(1) table values so interpolation errors are visible
        enc.params.copy_(torch.rand(enc.params.shape, generator=gen) * 2 - 1)  # copy_ moves it to the device
    return enc


def inputs(enc, batch, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, enc.n_input_dims, generator=gen)
    ids = torch.randint(0, enc.n_networks, (batch,), generator=gen, dtype=torch.int32)
    return x.to(DEV), ids.to(DEV)


def assert_close(a, b, rtol=1e-5, atol_frac=1e-5, what=""):
    """Compare against the reference; atol scales with the reference magnitude."""
    a, b = a.detach(), b.detach().to(a.dtype)
    atol = atol_frac * max(float(b.abs().max()), 1e-12)
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


CONFIGS = [
    # (n_dims, kwargs, n_networks) -- mixes dense levels and hashed levels, all storage types and interpolations
    (3, dict(n_levels=6, n_features_per_level=2, log2_hashmap_size=10, base_resolution=4, per_level_scale=1.7), 3),
    (3, dict(n_levels=3, n_features_per_level=4, base_resolution=3, per_level_scale=1.5, grid_type="Dense",
             interpolation="Smoothstep"), 2),
    (2, dict(n_levels=4, n_features_per_level=1, base_resolution=4, per_level_scale=2.0, grid_type="Tiled",
             interpolation="Nearest"), 2),
    (2, dict(n_levels=3, n_features_per_level=8, log2_hashmap_size=6, base_resolution=5, per_level_scale=2.3,
             interpolation="Smoothstep"), 1),
    (4, dict(n_levels=3, n_features_per_level=2, log2_hashmap_size=8, base_resolution=3, per_level_scale=1.6), 2),
]
IDS = [f"{d}d-{kw.get('grid_type', 'Hash')}-{kw.get('interpolation', 'Linear')}-F{kw['n_features_per_level']}"
       for d, kw, _ in CONFIGS]


# ---------------------------------------------------------------------------------------------------------
# Layout: level resolutions and offsets on known values
# ---------------------------------------------------------------------------------------------------------
def test_level_resolutions_and_sizes_known_values():
    # instant-ngp style: 3D, base 16, scale 2 -> resolutions 16 * 2^l; sizes res^3 capped at 2^19
    lay = grid_layout(3, 16, 2, 19, 16, 2.0, "Hash")
    assert [lv.resolution for lv in lay.levels] == [16 * 2**l for l in range(16)]
    assert [lv.size for lv in lay.levels[:4]] == [4096, 32768, 262144, 524288]
    assert lay.n_params == 2 * (4096 + 32768 + 262144 + 13 * 524288) == 14229504
    assert [lay.level_is_hashed(i) for i in range(4)] == [False, False, False, True]

    # tcnn's config_hash.json (2D image sample): base 16, scale 1.5, 2^15 entries per level
    lay = grid_layout(2, 16, 2, 15, 16, 1.5, "Hash")
    assert [lv.resolution for lv in lay.levels[:7]] == [16, 24, 36, 54, 81, 122, 183]
    # res^2 rounded up to a multiple of 8 (2916 -> 2920, 6561 -> 6568, 14884 -> 14888), then capped at 2^15
    assert [lv.size for lv in lay.levels[:7]] == [256, 576, 1296, 2920, 6568, 14888, 32768]
    assert [lv.offset for lv in lay.levels[:4]] == [0, 256, 832, 2128]
    assert lay.n_params == 2 * (256 + 576 + 1296 + 2920 + 6568 + 14888 + 10 * 32768) == 708368

    # Tiled: each level has at most base_resolution^D entries
    lay = grid_layout(2, 3, 1, 19, 8, 2.0, "Tiled")
    assert [lv.resolution for lv in lay.levels] == [8, 16, 32]
    assert [lv.size for lv in lay.levels] == [64, 64, 64]
    # Dense: never capped, rounded to multiples of 8 (5^3 = 125 -> 128)
    lay = grid_layout(3, 2, 1, 2, 5, 2.0, "Dense")
    assert [lv.resolution for lv in lay.levels] == [5, 10] and [lv.size for lv in lay.levels] == [128, 1000]


def test_otype_aliases_and_defaults():
    hashed = create_encoding(3, {"otype": "HashGrid", "n_levels": 2, "log2_hashmap_size": 8})
    assert hashed.grid_type == "Hash" and hashed.per_level_scale == 2.0 and hashed.n_output_dims == 4
    dense = create_encoding(3, {"otype": "DenseGrid", "n_levels": 4, "base_resolution": 8})
    assert dense.grid_type == "Dense"
    assert dense.per_level_scale == pytest.approx(math.exp(math.log(256 / 8) / 3), rel=1e-6)
    assert default_per_level_scale("Dense", 4, 8) == pytest.approx(32 ** (1 / 3), rel=1e-6)
    assert create_encoding(2, {"otype": "TiledGrid", "n_levels": 2}).grid_type == "Tiled"
    grid = create_encoding(2, {"otype": "Grid", "type": "Dense", "n_levels": 2, "base_resolution": 4})
    assert grid.grid_type == "Dense"
    # tcnn's alternative spelling: n_features (total) instead of n_levels
    alt = create_encoding(3, {"otype": "HashGrid", "n_features": 8, "n_features_per_level": 4, "log2_hashmap_size": 8})
    assert alt.n_levels == 2 and alt.n_output_dims == 8
    full = create_encoding(3, {"otype": "HashGrid"})  # all tcnn defaults
    assert (full.n_levels, full.n_features_per_level, full.log2_hashmap_size, full.base_resolution) == (16, 2, 19, 16)
    assert full.interpolation == "Linear" and full.n_params_per_network() == 14229504


# ---------------------------------------------------------------------------------------------------------
# Hash / index on known values: tables hold their own entry numbers, Nearest lookups read them back
# ---------------------------------------------------------------------------------------------------------
def _entry_numbered(enc):
    with torch.no_grad():
        enc.params.copy_(torch.arange(enc.params.numel(), dtype=torch.float32, device=DEV).view_as(enc.params))


def _at_vertex(coords, scale):
    # x * scale + 0.5 = coords + 0.5 -> the nearest vertex is exactly `coords`
    return torch.tensor(coords, dtype=torch.float32, device=DEV) / scale


def test_coherent_prime_hash_known_values(grid_path):
    # level 0: 8^3 = 512 dense entries; level 1: scale 8*8-1 = 63, 64^3 > 2^10 -> hashed into 1024 entries
    enc = GridEncoding(3, n_levels=2, n_features_per_level=1, log2_hashmap_size=10, base_resolution=8,
                       per_level_scale=8.0, interpolation="Nearest")
    lv0, lv1 = enc.layout.levels
    assert (lv0.size, lv1.offset, lv1.resolution, lv1.size) == (512, 512, 64, 1024)
    assert not enc.layout.level_is_hashed(0) and enc.layout.level_is_hashed(1)
    _entry_numbered(enc)
    x = torch.stack([_at_vertex([1, 2, 3], 63.0), _at_vertex([0, 0, 7], 63.0), _at_vertex([0, 3, 0], 63.0),
                     _at_vertex([63, 63, 63], 63.0)])
    y = enc(x)
    # (1*1) ^ (2*2654435761 mod 2^32 = 1013904226) ^ (3*805459861 = 2416379583) = 2892625372; mod 1024 = 476
    assert y[0, 1].item() == 512 + 476
    # (0,0,7) -> 7*805459861 mod 2^32 = 1343251731; (0,3,0) -> 3*2654435761 mod 2^32 = 3668339987; both = 275 mod 1024
    assert y[1, 1].item() == y[2, 1].item() == 512 + 275
    # the dense level at the same points: vertex round(coords * 7 / 63), strides 1, 8, 64
    assert y[0, 0].item() == 0 and y[3, 0].item() == 7 + 7 * 8 + 7 * 64
    # colliding vertices share one table entry: its gradient is the sum of both samples' gradients
    x.requires_grad_(True)
    enc.params.grad = None
    dy = torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 5.0], [0.0, 0.0]], device=DEV)
    (enc(x) * dy).sum().backward()
    g = enc.params.grad[0]
    assert g[512 + 275].item() == 7.0 and g[512 + 476].item() == 1.0
    assert g[512:].sum().item() == 8.0 and torch.count_nonzero(g[512:]) == 2
    assert torch.count_nonzero(x.grad) == 0  # nearest lookups are piecewise constant


def test_dense_and_tiled_index_known_values(grid_path):
    dense = GridEncoding(2, n_levels=1, n_features_per_level=1, base_resolution=16, grid_type="Dense",
                         interpolation="Nearest")
    _entry_numbered(dense)
    assert dense(_at_vertex([[3, 5], [15, 15]], 15.0)).flatten().tolist() == [3 + 5 * 16, 15 + 15 * 16]
    # Tiled: level 1 has resolution 32 but only 8^2 = 64 entries: index (30 + 5 * 32) mod 64 = 62
    tiled = GridEncoding(2, n_levels=2, n_features_per_level=1, base_resolution=8, per_level_scale=4.0,
                         grid_type="Tiled", interpolation="Nearest")
    assert tiled.layout.levels[1].resolution == 32 and tiled.layout.levels[1].size == 64
    _entry_numbered(tiled)
    assert tiled(_at_vertex([[30, 5]], 31.0))[0, 1].item() == 64 + 62
    # features of one entry are contiguous: entry e, feature f lives at level_offset*F + e*F + f
    f4 = GridEncoding(2, n_levels=1, n_features_per_level=4, base_resolution=16, grid_type="Dense",
                      interpolation="Nearest")
    _entry_numbered(f4)
    assert f4(_at_vertex([[3, 5]], 15.0))[0].tolist() == [332.0, 333.0, 334.0, 335.0]


def test_4d_hash_matches_reference_entries(grid_path):
    enc = GridEncoding(4, n_levels=2, n_features_per_level=1, log2_hashmap_size=7, base_resolution=4,
                       per_level_scale=4.0, interpolation="Nearest")
    assert enc.layout.level_is_hashed(1)
    _entry_numbered(enc)
    coords = np.array([[1, 1, 1, 1], [3, 0, 9, 14], [15, 2, 7, 4]])
    y = enc(_at_vertex(coords.tolist(), enc.layout.levels[1].scale))
    expected = ref_entry(coords, 16, 128, "Hash")
    # 1 ^ 2654435761 ^ 805459861 ^ 3674653429 = 1966337232 -> mod 128 = 80
    assert expected[0] == (1 ^ 2654435761 ^ 805459861 ^ 3674653429) % 128 == 80
    assert y[:, 1].tolist() == (enc.layout.levels[1].offset + expected).tolist()


# tcnn's other grid hashes, re-implemented on Python integers (exact uint32 / uint64 wraparound by masking)
PCG_MULT, PCG_INC, M64 = 0x5851F42D4C957F2D, 3, (1 << 64) - 1


def ref_pcg32_after(delta: int, seed: int = 1337) -> int:
    """PCG32 (stream 1) seeded with `seed`, stepped `delta` times one by one is too slow for big jumps, so:
    the LCG's affine map composed `delta` times by binary powering, then one XSH-RR output."""
    state = ((((0 * PCG_MULT + PCG_INC) & M64) + seed) * PCG_MULT + PCG_INC) & M64
    mult, plus = 1, 0                              # the map s -> mult * s + plus after `done` steps
    step_mult, step_plus = PCG_MULT, PCG_INC       # the map of 2^k steps
    while delta:
        if delta & 1:
            mult, plus = (mult * step_mult) & M64, (plus * step_mult + step_plus) & M64
        step_mult, step_plus = (step_mult * step_mult) & M64, (step_plus * (step_mult + 1)) & M64
        delta >>= 1
    state = (mult * state + plus) & M64
    xorshifted = (((state >> 18) ^ state) >> 27) & M32
    rot = state >> 59
    return ((xorshifted >> rot) | (xorshifted << ((32 - rot) & 31))) & M32


def ref_hash(coords, hash_type: str) -> int:
    d = len(coords)
    if hash_type == "BaseConvert":
        k = 0
        for c in coords:
            k = ((k + c) * 2531011) & M32
        return k
    if hash_type == "Rng":
        step = 0
        for i, c in enumerate(coords):
            step ^= (c & M32) << (i * (64 // d))
        return ref_pcg32_after(step & M64)
    primes = {"Prime": (1958374283, 2654435761, 805459861, 3674653429),
              "ReversedPrime": (2165219737, 1434869437, 2097192037, 3674653429),
              "CoherentPrime": COHERENT}[hash_type]
    h = 0
    for c, p in zip(coords, primes):
        h ^= (c * p) & M32
    return h


def test_pcg32_reference_matches_stepping_one_by_one():
    """The jump-ahead reference against PCG32 stepped one step at a time (the generator's definition)."""
    state = ((((0 * PCG_MULT + PCG_INC) & M64) + 1337) * PCG_MULT + PCG_INC) & M64
    for delta in range(40):
        xorshifted = (((state >> 18) ^ state) >> 27) & M32
        rot = state >> 59
        assert ref_pcg32_after(delta) == ((xorshifted >> rot) | (xorshifted << ((32 - rot) & 31))) & M32
        state = (state * PCG_MULT + PCG_INC) & M64


@pytest.mark.parametrize("hash_type", ["Rng", "BaseConvert", "Prime", "ReversedPrime"])
@pytest.mark.parametrize("n_dims", [2, 3, 4])
def test_hash_types_match_reference_entries(hash_type, n_dims, grid_path):
    """Each hash's table entries at known vertices of a hashed level (tables numbered by entry, Nearest
    lookups read the entry back)."""
    enc = GridEncoding(n_dims, n_levels=2, n_features_per_level=1, log2_hashmap_size=7, base_resolution=4,
                       per_level_scale=4.0, interpolation="Nearest", hash=hash_type)
    lv = enc.layout.levels[1]
    assert enc.layout.level_is_hashed(1) and lv.size == 128
    _entry_numbered(enc)
    gen = np.random.default_rng(n_dims)
    coords = gen.integers(0, lv.resolution, size=(32, n_dims))
    coords[0] = lv.resolution - 1
    y = enc(_at_vertex(coords.tolist(), lv.scale))
    expected = [lv.offset + ref_hash([int(c) for c in row], hash_type) % lv.size for row in coords]
    assert y[:, 1].tolist() == expected
    # the hashes differ from each other (a kernel that ignored the hash type would pass the above only for one)
    assert len({ref_hash([1, 2, 3, 4][:n_dims], h) % 128 for h in ("Rng", "BaseConvert", "Prime")}) > 1


def test_hash_known_values():
    # BaseConvert of (1, 2): ((0 + 1) * B + 2) * B with B = 2531011, mod 2^32
    assert ref_hash([1, 2], "BaseConvert") == ((2531011 + 2) * 2531011) % (1 << 32)
    # Rng of (0, 0): no jump, the generator's first number after seeding with 1337
    assert ref_hash([0, 0], "Rng") == ref_pcg32_after(0) == 634364130


def ref_pcg32_float(delta: int) -> np.float32:
    """tcnn's next_float: the top 23 bits of the 32-bit number as a mantissa of [1, 2), minus 1."""
    bits = np.array([(ref_pcg32_after(delta) >> 9) | 0x3F800000], dtype=np.uint32)
    return bits.view(np.float32)[0] - np.float32(1.0)


def ref_stochastic_table_gradient(enc, x, ids, dy):
    """float64 table gradient of tcnn's stochastic interpolation: per level and sample, draw u (seed 1337,
    jump sample + level * batch); along each dim the upper vertex where u < s; the whole dy goes there."""
    x32 = x.cpu().numpy().astype(np.float32)
    grad = np.zeros((enc.n_networks, enc.layout.n_params), dtype=np.float64)
    f, batch = enc.n_features_per_level, x32.shape[0]
    for level, lv in enumerate(enc.layout.levels):
        p = x32 * np.float32(lv.scale) + np.float32(0.5)
        cell = np.floor(p)
        t = (p - cell).astype(np.float32)
        s = t * t * (np.float32(3.0) - np.float32(2.0) * t) if enc.interpolation == "Smoothstep" else t
        for b in range(batch):
            u = ref_pcg32_float(b + level * batch)
            corner = (cell[b] + (u < s[b])).astype(np.int64)
            e = ref_entry(corner[None], lv.resolution, lv.size, enc.grid_type)[0]
            cols = (lv.offset + e) * f + np.arange(f)
            grad[int(ids[b]), cols] += dy[b, level * f:(level + 1) * f].double().cpu().numpy()
    return torch.from_numpy(grad)


@pytest.mark.parametrize("interpolation,n_networks", [("Linear", 1), ("Smoothstep", 3)])
def test_stochastic_interpolation_sends_each_gradient_to_the_drawn_corner(interpolation, n_networks):
    """Features and the input gradient stay N-linear (float64 reference); the table gradient of each level and
    sample goes whole to the corner tcnn's generator draws (float64 / numpy reference of the draw)."""
    enc = create_encoding(3, {"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 7,
                              "base_resolution": 4, "per_level_scale": 2.0, "interpolation": interpolation,
                              "stochastic_interpolation": True}, n_networks=n_networks)
    assert enc.stochastic_interpolation
    x, ids = inputs(enc, 150)
    dy = torch.randn(150, enc.n_output_dims, generator=torch.Generator().manual_seed(3)).to(DEV)
    xg = x.clone().requires_grad_(True)
    y = enc(xg, ids if n_networks > 1 else None)
    (y * dy).sum().backward()
    xr = x.double().requires_grad_(True)
    yr = ref_grid(enc, xr, enc.params.detach().double(), ids)
    (yr * dy.double()).sum().backward()
    assert_close(y, yr, what="features")
    assert_close(xg.grad, xr.grad, rtol=1e-4, atol_frac=1e-4, what="dx")
    expected = ref_stochastic_table_gradient(enc, x, ids, dy)
    assert_close(enc.params.grad, expected.to(DEV), what="stochastic table gradient")
    # Unlike the N-linear gradient: each sample's gradient sits on one entry per level and feature.
    plain = create_encoding(3, {"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 2, "log2_hashmap_size": 7,
                                "base_resolution": 4, "per_level_scale": 2.0, "interpolation": interpolation},
                            n_networks=n_networks)
    assert not torch.allclose(enc.params.grad, plain.backward(plain.forward_with_context(x, ids, train=True)[1], dy,
                                                              need_dx=False)[1][0])


# ---------------------------------------------------------------------------------------------------------
# Forward / backward / double backward against the reference
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lanes,level_tasks,triton", [(True, False, False), (False, False, False),
                                                      (False, True, False), (None, None, True)],
                         ids=["feature-lanes", "sample-threads", "level-tasks", "triton"])
@pytest.mark.parametrize("n_dims,kw,n_networks", CONFIGS, ids=IDS)
def test_forward_and_backward_match_reference(n_dims, kw, n_networks, lanes, level_tasks, triton, tuned, request):
    # Every kernel family of the table gradient: one thread per (level, sample, feature), one per (level,
    # sample), on the CPU one task per level walking the samples without atomics, and the Triton launches of
    # the lookup and the table gradient (CUDA's default; Triton's interpreter on the CPU).
    tuned(feature_lanes=lanes, level_tasks=level_tasks, triton_grid_kernels=triton)
    launches = request.getfixturevalue("triton_grid_launches") if triton else None
    enc = make(n_dims, n_networks, **kw)
    if triton:
        x, ids = inputs(enc, 96)
        (enc(x, ids) * 1.0).sum().backward()
        assert launches == ["grid_forward", "grid_backward_table"], launches
        enc.params.grad = None
        launches.clear()
        run_checks(n_dims, kw, enc)
        assert "grid_forward" in launches
        return
    run_checks(n_dims, kw, enc)
    assert enc.feature_lanes is lanes
    assert enc.level_tasks is (level_tasks and tinn.runtime.arch() == "cpu")


def run_checks(n_dims, kw, enc):
    """The features, the table gradient alone and with the input gradient, and the input gradient, against
    the float64 reference."""
    x, ids = inputs(enc, 96)
    xr = x.double().requires_grad_(True)
    pr = enc.params.detach().double().requires_grad_(True)
    yr = ref_grid(enc, xr, pr, ids)
    w = torch.randn(yr.shape, generator=torch.Generator().manual_seed(3)).to(DEV)
    (yr * w.double()).sum().backward()

    # Parameter gradient alone (the usual training case: positions need no gradient) ...
    y = enc(x, ids)
    assert y.shape == (96, kw["n_levels"] * kw["n_features_per_level"])
    assert_close(y, yr, what="forward")
    (y * w).sum().backward()
    assert_close(enc.params.grad, pr.grad, what="d/dparams")
    # ... and together with the input gradient.
    enc.params.grad = None
    x.requires_grad_(True)
    (enc(x, ids) * w).sum().backward()
    assert_close(enc.params.grad, pr.grad, what="d/dparams with d/dx")
    if kw.get("interpolation") == "Nearest":
        assert torch.count_nonzero(x.grad) == 0  # piecewise constant in x
    else:
        assert_close(x.grad, xr.grad, rtol=1e-4, atol_frac=1e-4, what="d/dx")
        assert x.grad.abs().max() > 0.1


@pytest.mark.parametrize("order", ["rays", "one_cell"])
def test_table_gradient_of_samples_sharing_cells_matches_reference(order, tuned, triton_grid_launches):
    """Samples along rays (neighbours in the batch share a coarse level's cell) and a batch in one cell, as scenes
    send them: the Triton table gradient's atomics then meet on few entries, and the sums must still equal the
    float64 reference, at every level and with several grids interleaved in the batch."""
    tuned(triton_grid_kernels=True)
    enc = make(3, 3, n_levels=5, n_features_per_level=2, log2_hashmap_size=9, base_resolution=2, per_level_scale=2.0)
    gen = torch.Generator().manual_seed(5)
    if order == "rays":
        a, b = torch.rand(6, 1, 3, generator=gen), torch.rand(6, 1, 3, generator=gen)
        x = (a + torch.linspace(0, 1, 40).view(1, -1, 1) * (b - a)).reshape(-1, 3)
        ids = (torch.arange(240) // 80).to(torch.int32)  # two rays a grid
    else:
        x = torch.full((150, 3), 0.3) + 1e-3 * torch.rand(150, 3, generator=gen)
        ids = (torch.arange(150) % 2).to(torch.int32)  # interleaved: a run ends at every sample
        ids[60:] = 2
    x, ids = x.to(DEV), ids.to(DEV)
    w = torch.randn(x.shape[0], enc.n_output_dims, generator=gen).to(DEV)
    (enc(x, ids) * w).sum().backward()
    pr = enc.params.detach().double().requires_grad_(True)
    (ref_grid(enc, x.double(), pr, ids) * w.double()).sum().backward()
    assert_close(enc.params.grad, pr.grad, what="d/dparams")
    assert "grid_backward_table" in triton_grid_launches


# expected: (vector reductions, private copies, corner pairs); ALL: grid_triton.PRIVATE_COPIES, SHARED: the copies
# shared out over an array's grids (grid_triton.private_copies)
ALL, SHARED = "all", "shared"


@pytest.mark.parametrize("dims,n_networks,features,offset,expected", [
    (2, 1, 2, 0, (True, ALL, True)), (3, 1, 2, 0, (True, ALL, True)), (2, 1, 4, 0, (True, ALL, False)),
    (2, 1, 8, 0, (True, ALL, False)), (2, 3, 2, 0, (True, SHARED, True)), (2, 3, 4, 0, (True, SHARED, False)),
    (3, 9, 2, 0, (True, SHARED, True)), (3, 40, 2, 0, (True, 0, True)), (2, 3, 2, 2, (True, SHARED, False)),
    (2, 1, 1, 0, (False, 0, False)), (2, 2, 1, 0, (False, 0, False)), (2, 1, 2, 1, (False, 0, False)),
    (2, 1, 2, 2, (True, ALL, False)), (2, 1, 4, 2, (False, 0, False))],
    ids=["single-F2", "single-F2-3d", "single-F4", "single-F8", "array-F2", "array-F4", "nine-grids-3d",
         "forty-grids-3d", "array-F2-offset-2", "single-F1", "array-F1", "F2-odd-offset", "F2-offset-2",
         "F4-offset-2"])
def test_table_gradient_vector_reductions_and_private_copies_match_reference(dims, n_networks, features, offset,
                                                                            expected, tuned, monkeypatch):
    """The Triton table gradient's variants: a lane per sample adding its features with vector reductions where
    they fit one (2, 4 or 8 features, aligned to the vector), with two features the corners that differ along the
    first axis in one four-word reduction where their entries pair up (16-byte aligned), and for a single grid its
    coarse levels summed in private copies first (here three dense levels private, two hashed ones added to the
    table directly), and for a few grids (an octree's nodes) each its share of the copies. Each against the
    float64 reference, with the variant the launch took. The table sits at
    `offset` values into a larger gradient, as a model's tables may (an odd offset cannot take two-word vectors,
    an offset of two no four-word pairs)."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    tuned(triton_grid_kernels=True)
    from tinn.kernels import grid_triton
    chosen, pairs = [], []
    original, original_pairs = grid_triton.grid_backward_table, grid_triton.paired_corners

    def record(*args, vector=False, copies=0):
        chosen.append((vector, copies))
        return original(*args, vector=vector, copies=copies)

    def record_pairs(*args):
        pairs.append(original_pairs(*args))
        return pairs[-1]

    monkeypatch.setattr(grid_triton, "grid_backward_table", record)
    monkeypatch.setattr(grid_triton, "paired_corners", record_pairs)
    enc = make(dims, n_networks, n_levels=5, n_features_per_level=features,
               log2_hashmap_size=14 if features == 2 else 13, base_resolution=16 if dims == 2 else 4,
               per_level_scale=2.0)
    levels = grid_triton.LevelTable(enc._meta_values(), DEV)
    if features > 1:
        assert 0 < grid_triton.private_levels(levels, features)[0] < enc.n_levels
    x, ids = inputs(enc, 200)
    dy = torch.randn(x.shape[0], enc.n_output_dims, generator=torch.Generator().manual_seed(4)).to(DEV)
    table = enc.params.detach()
    # The grid's values `offset` columns into a wider table, as a model holding several parts in one table has them.
    wide = torch.zeros(n_networks, table.shape[1] + offset, device=DEV)
    wide[:, offset:] = table
    grad = torch.zeros_like(wide)
    enc.lookup_backward(x, ids, wide, offset, dy, grad, False)
    got = grad[:, offset:]
    vector, copies, paired = expected
    want = {ALL: grid_triton.PRIVATE_COPIES, SHARED: grid_triton.private_copies(n_networks)}.get(copies, copies)
    assert chosen == [(vector, want)], chosen
    assert (want > 1) == (copies != 0)
    assert pairs == ([paired] if vector else []), pairs
    pr = table.double().requires_grad_(True)
    (ref_grid(enc, x.double(), pr, ids) * dy.double()).sum().backward()
    assert_close(got, pr.grad, what="d/dparams")
    assert pr.grad.abs().max() > 0.1


@pytest.mark.parametrize("setting,threads_per_level,expected", [
    (None, "few", True), (None, "many", False), (True, "many", True), (False, "few", False)])
def test_level_tasks_where_no_thread_idles(setting, threads_per_level, expected, tuned, monkeypatch):
    """By default the CPU takes one task per level when it runs no more threads than the grid has levels;
    the setting forces either way; on CUDA never (a level per thread would leave the GPU idle)."""
    tuned(level_tasks=setting)
    monkeypatch.setattr(tinn.runtime, "cpu_threads", lambda: 4 if threads_per_level == "few" else 64)
    enc = make(2, 1, n_levels=8, n_features_per_level=2, log2_hashmap_size=10)
    assert enc.level_tasks is (expected and tinn.runtime.arch() == "cpu")


@pytest.mark.skipif(tinn.runtime.arch() != "cpu", reason="level tasks are the CPU's kernel (CUDA keeps atomics)")
def test_level_tasks_sum_in_a_fixed_order(tuned):
    """No atomics: the same batch gives bit-identical table gradients every time."""
    tuned(level_tasks=True)
    enc = make(3, 2, n_levels=4, n_features_per_level=2, log2_hashmap_size=8)
    x, ids = inputs(enc, 4000)
    w = torch.randn(4000, 8, generator=torch.Generator().manual_seed(1)).to(DEV)
    grads = []
    for _ in range(3):
        enc.params.grad = None
        (enc(x, ids) * w).sum().backward()
        grads.append(enc.params.grad.clone())
    assert grads[0].abs().sum() > 0
    assert all(torch.equal(grads[0], g) for g in grads[1:])


SECOND_ORDER = [CONFIGS[0], CONFIGS[1], CONFIGS[4]]


@pytest.mark.parametrize("n_dims,kw,n_networks", SECOND_ORDER, ids=[IDS[0], IDS[1], IDS[4]])
def test_double_backward_matches_reference(n_dims, kw, n_networks):
    """Eikonal-style loss on d(features)/dx, with a learnable head so dy depends on parameters too."""
    enc = make(n_dims, n_networks, **kw)
    x, ids = inputs(enc, 48)
    head = torch.randn(enc.n_output_dims, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(DEV)

    def loss(encode, x_, params, head_):
        y = encode(x_, params)
        sdf = (y.to(head_.dtype) @ head_).sin().sum()
        gx, = torch.autograd.grad(sdf, x_, create_graph=True)
        return (gx.norm(dim=1) - 1).square().sum() + (gx * 0.3).sum()

    x1 = x.clone().requires_grad_(True)
    h1 = head.float().requires_grad_(True)
    loss(lambda x_, p: enc(x_, ids), x1, enc.params, h1).backward()

    xr = x.double().requires_grad_(True)
    pr = enc.params.detach().double().requires_grad_(True)
    hr = head.clone().requires_grad_(True)
    loss(lambda x_, p: ref_grid(enc, x_, p, ids), xr, pr, hr).backward()

    assert_close(enc.params.grad, pr.grad, rtol=1e-4, atol_frac=1e-4, what="d2/dparams")
    assert_close(h1.grad, hr.grad, rtol=1e-4, atol_frac=1e-4, what="d2/dhead (through dy)")
    assert_close(x1.grad, xr.grad, rtol=1e-3, atol_frac=1e-4, what="d2/dx (Hessian term)")
    assert pr.grad.abs().max() > 1e-3 and xr.grad.abs().max() > 1e-3


def test_gradient_of_parameter_gradient():
    """Differentiating through d(loss)/d(params) (e.g. a gradient penalty) reaches x and upstream weights."""
    n_dims, kw, n_networks = CONFIGS[0]
    enc = make(n_dims, n_networks, **kw)
    x, ids = inputs(enc, 32)
    r = torch.randn(enc.params.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(DEV)
    head = torch.randn(enc.n_output_dims, generator=torch.Generator().manual_seed(8), dtype=torch.float64).to(DEV)

    def run(encode, x_, params, head_):
        out = (encode(x_, params).to(head_.dtype) * head_).sin().sum()
        gp, = torch.autograd.grad(out, params, create_graph=True)
        (gp.to(r.dtype) * r).sum().backward()

    x1, h1 = x.clone().requires_grad_(True), head.float().requires_grad_(True)
    run(lambda x_, p: enc(x_, ids), x1, enc.params, h1)
    xr, hr = x.double().requires_grad_(True), head.clone().requires_grad_(True)
    pr = enc.params.detach().double().requires_grad_(True)
    run(lambda x_, p: ref_grid(enc, x_, p, ids), xr, pr, hr)
    assert_close(h1.grad, hr.grad, rtol=1e-4, atol_frac=1e-4, what="d/dhead")
    assert_close(x1.grad, xr.grad, rtol=1e-3, atol_frac=1e-4, what="d/dx")


# ---------------------------------------------------------------------------------------------------------
# Arrays of grids
# ---------------------------------------------------------------------------------------------------------
def test_array_of_grids_equals_separate_grids(grid_path):
    kw = dict(n_levels=4, n_features_per_level=2, log2_hashmap_size=8, base_resolution=4, per_level_scale=2.0)
    n = 5
    array = make(3, n, seed=11, **kw)
    x, ids = inputs(array, 200, seed=12)
    x1 = x.clone().requires_grad_(True)
    y = array(x1, ids)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(13)).to(DEV)
    (y * w).sum().backward()

    dx = torch.zeros_like(x)
    for k in range(n):
        single = GridEncoding(3, **kw)
        with torch.no_grad():
            single.params.copy_(array.params[k:k + 1])
        sel = ids == k
        assert sel.any()
        xk = x[sel].clone().requires_grad_(True)
        yk = single(xk)
        torch.testing.assert_close(y[sel], yk, rtol=0, atol=0)  # identical arithmetic, routed per sample
        (yk * w[sel]).sum().backward()
        torch.testing.assert_close(array.params.grad[k], single.params.grad[0], rtol=1e-6, atol=1e-6)
        dx[sel] = xk.grad
    torch.testing.assert_close(x1.grad, dx, rtol=1e-6, atol=1e-6)


def test_array_routes_each_sample_to_its_own_grid(grid_path):
    enc = GridEncoding(2, n_networks=3, n_levels=2, n_features_per_level=1, base_resolution=4, grid_type="Dense")
    with torch.no_grad():
        enc.params.copy_(torch.tensor([[1.0], [2.0], [3.0]]).expand_as(enc.params))
    x = torch.rand(6, 2, device=DEV)
    ids = torch.tensor([2, 0, 1, 1, 0, 2], dtype=torch.int32, device=DEV)
    # constant tables interpolate to themselves (to rounding: the weights' sum is 1 within an ulp): the output is
    # the table's constant
    routed = torch.tensor([3.0, 1.0, 2.0, 2.0, 1.0, 3.0], device=DEV)
    torch.testing.assert_close(enc(x, ids)[:, 0], routed, rtol=0, atol=1e-6)
    torch.testing.assert_close(enc(x, ids.long())[:, 1], routed, rtol=0, atol=1e-6)  # int64 ids are accepted too
    with pytest.raises(InputError, match="net_ids contains 3"):
        enc(x, torch.full((6,), 3, dtype=torch.int32, device=DEV))
    with pytest.raises(InputError, match="net_ids is required"):
        enc(x)


# ---------------------------------------------------------------------------------------------------------
# Initialisation, memory reporting, configuration errors
# ---------------------------------------------------------------------------------------------------------
def test_initialisation_is_tcnn_uniform_and_reproducible():
    kw = dict(n_levels=3, log2_hashmap_size=9, base_resolution=4)
    a = GridEncoding(3, n_networks=4, seed=42, **kw)
    b = GridEncoding(3, n_networks=4, seed=42, **kw)
    c = GridEncoding(3, n_networks=4, seed=43, **kw)
    assert a.params.shape == (4, a.layout.n_params) and a.params.dtype == torch.float32
    assert a.params.device.type == tinn.runtime.device().type
    assert torch.equal(a.params, b.params) and not torch.equal(a.params, c.params)
    assert a.params.abs().max() <= 1e-4 and a.params.abs().max() > 0.9e-4
    assert abs(a.params.mean().item()) < 2e-6
    assert not torch.equal(a.params[0], a.params[1])  # every grid gets its own draw
    via_factory = create_encoding(3, {"otype": "HashGrid", "n_levels": 3, "log2_hashmap_size": 9,
                                      "base_resolution": 4}, n_networks=4, seed=42)
    assert torch.equal(via_factory.params, a.params)


def test_memory_report_per_grid_and_total():
    enc = GridEncoding(3, n_networks=7, n_levels=5, n_features_per_level=4, log2_hashmap_size=12,
                       base_resolution=8, per_level_scale=2.0)
    rep = enc.memory_report()
    per_grid = enc.layout.n_params * 4
    assert enc.n_params_per_network() == enc.layout.n_params == enc.params.shape[1]
    assert rep["bytes_per_network"] == enc.memory_bytes_per_network() == per_grid
    assert rep["total_bytes"] == enc.memory_bytes() == 7 * per_grid == enc.params.numel() * 4
    assert sum(lv["bytes_per_network"] for lv in rep["levels"]) == per_grid
    # levels: 8^3 = 512, 16^3 = 4096 dense; then capped at 2^12 and hashed
    assert [lv["entries"] for lv in rep["levels"]] == [512, 4096, 4096, 4096, 4096]
    assert [lv["hashed"] for lv in rep["levels"]] == [False, False, True, True, True]
    assert per_grid == (512 + 4 * 4096) * 4 * 4


@pytest.mark.parametrize("cfg,n_dims,pattern", [
    ({"n_features_per_level": 3}, 3, r"encoding\.n_features_per_level=3 is not supported; allowed: \[1, 2, 4, 8\]"),
    ({"interpolation": "Cubic"}, 3, r"encoding\.interpolation='Cubic'.*Nearest.*Linear.*Smoothstep"),
    ({"type": "Sparse"}, 3, r"encoding\.type='Sparse'.*Hash.*Dense.*Tiled"),
    ({"hash": "Murmur"}, 3, r"encoding\.hash='Murmur'.*CoherentPrime.*Rng.*BaseConvert"),
    ({"n_levels": 4, "n_features": 8}, 3, r"exclusive"),
    ({"n_levels": 0}, 3, r"encoding\.n_levels=0 is out of range"),
    ({"stochastic_interpolation": True, "table_dtype": "bfloat16"}, 3, r"stochastic_interpolation=true needs "
                                                                       r"table_dtype='float32'"),
    ({"per_level_scale": 0}, 3, r"encoding\.per_level_scale"),
    ({}, 5, r"2, 3 or 4 input dims"),
    ({}, 1, r"2, 3 or 4 input dims"),
    ({"type": "Dense", "base_resolution": 2048}, 3, r"lower n_levels, base_resolution"),
])
def test_config_errors_name_the_key_and_allowed_values(cfg, n_dims, pattern):
    with pytest.raises(ConfigError, match=pattern):
        create_encoding(n_dims, {"otype": "HashGrid", **cfg})


def test_input_validation():
    enc = GridEncoding(3, n_levels=2, log2_hashmap_size=8)
    with pytest.raises(InputError, match="last dimension 2; expected 3"):
        enc(torch.rand(4, 2, device=DEV))
    with pytest.raises(InputError, match="float32"):
        enc(torch.rand(4, 3, dtype=torch.float64, device=DEV))
    assert enc(torch.rand(0, 3, device=DEV)).shape == (0, 4)
