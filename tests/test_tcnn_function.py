"""tcnn's function, layout and input handling through `import tinn.torch as tcnn`: input padding as tcnn
pads it, its flat parameter layout in and out, its state_dict, dtypes and devices, tracing."""
import pytest
import torch

import tinn
import tinn.torch as tcnn
from reference import activation, rel_err
from tinn.encodings import create_encoding

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
       "output_activation": "None"}


def dev():
    return tinn.runtime.device()


@pytest.mark.parametrize("encoding,n_in,features,pad,value", [
    ({"otype": "Identity"}, 3, 3, 13, 1.0),                                  # 3 -> 16 with ones (a bias)
    ({"otype": "Frequency", "n_frequencies": 12}, 2, 48, 0, 1.0),           # already a multiple of 16
    ({"otype": "OneBlob", "n_bins": 4}, 3, 12, 4, 1.0),
    ({"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 4, "log2_hashmap_size": 8}, 2, 12, 4, 0.0),
    ({"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 8}, 3, 32, 0, 0.0),
    ({"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": 1},
                                       {"otype": "HashGrid", "n_levels": 5, "n_features_per_level": 2,
                                        "log2_hashmap_size": 8}]}, 3, 11, 5, 0.0),   # the last nested pads
])
def test_encoding_output_is_padded_as_tcnn_pads_it(encoding, n_in, features, pad, value):
    model = tcnn.NetworkWithInputEncoding(n_in, 2, encoding, NET)
    assert model.encoding.n_output_dims == features
    assert model.network.input_padding == (pad, value)
    assert model.network.layer_shapes()[0] == (16, features + pad)


def test_a_network_fits_an_affine_function_through_its_bias_column():
    """tcnn.Network(1, 1) has a ones column: y = x + 1 is in reach (f(0) = 1), which an MLP without
    biases and without padding cannot represent."""
    torch.manual_seed(0)
    net = tcnn.Network(1, 1, NET)
    assert net.input_padding == (15, 1.0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(600):
        x = torch.rand(256, 1, device=dev()) * 2 - 1
        loss = ((net(x) - (x + 1)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 1e-3
    assert abs(float(net(torch.zeros(1, 1, device=dev()))) - 1.0) < 0.05


def _tcnn_reference(flat, enc_features, pad, value, width, n_out, hidden="ReLU"):
    """float64 tcnn network from a flat tcnn-layout vector: padded input, matrices row-major, output rows
    padded to 16 and sliced off."""
    h = torch.cat([enc_features, enc_features.new_full((enc_features.shape[0], pad), value)], dim=1)
    n_in = h.shape[1]
    out_rows = -(-n_out // 16) * 16
    w0 = flat[:width * n_in].reshape(width, n_in)
    w1 = flat[width * n_in:width * n_in + out_rows * width].reshape(out_rows, width)
    return (activation(hidden, h @ w0.t()) @ w1.t())[:, :n_out]


def test_flat_tcnn_parameters_give_tcnn_outputs_and_round_trip():
    model = tcnn.NetworkWithInputEncoding(3, 3, {"otype": "OneBlob", "n_bins": 4}, NET)
    n = tinn.tcnn_layout.n_params(model)
    assert n == 16 * 16 + 16 * 16  # (16 x 16 padded input) + (16 padded output rows x 16)
    flat = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 0.3
    tcnn.import_params(model, flat.half())  # any float dtype
    flat = flat.half().double()
    x = torch.rand(50, 3, generator=torch.Generator().manual_seed(2)).to(dev())
    enc = model.encoding(x).detach().cpu().double()
    ref = _tcnn_reference(flat, enc, 4, 1.0, 16, 3)
    assert rel_err(model(x).detach().cpu(), ref) < 1e-5
    out = tcnn.export_params(model).cpu().double()
    rows = torch.ones(n, dtype=torch.bool)
    rows[16 * 16 + 3 * 16:] = False            # padded output rows come back as zeros
    assert torch.equal(out[rows], flat[rows]) and not out[~rows].any()


def test_tcnn_state_dict_loads_and_saves_with_a_grid():
    cfg = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 6}
    a = tcnn.NetworkWithInputEncoding(2, 3, cfg, NET, seed=1)
    b = tcnn.NetworkWithInputEncoding(2, 3, cfg, NET, seed=2)
    sd = a.tcnn_state_dict()
    assert list(sd) == ["params"] and sd["params"].dim() == 1
    assert sd["params"].numel() == tinn.tcnn_layout.n_params(a)
    # network first, then the grid table (tcnn's order)
    assert torch.equal(sd["params"][-a.encoding.params.numel():], a.encoding.params.detach()[0])
    b.load_state_dict(sd)
    x = torch.rand(40, 2, device=dev())
    assert torch.equal(a(x), b(x))
    with pytest.raises(tinn.InputError, match="tcnn layout is"):
        b.load_state_dict({"params": sd["params"][:-1]})
    b.load_state_dict(a.state_dict())  # tinn's own format still loads


def test_arrays_export_one_row_per_network():
    arr = tcnn.NetworkArray(4, 2, NET, n_networks=3)
    flat = tcnn.export_params(arr)
    assert flat.shape == (3, 16 * 16 + 16 * 16)
    other = tcnn.NetworkArray(4, 2, NET, n_networks=3, seed=9)
    tcnn.import_params(other, flat)
    x = torch.rand(30, 4, device=dev())
    ids = torch.randint(0, 3, (30,), device=dev())
    assert torch.equal(arr(x, ids), other(x, ids))


def test_tcnn_input_handling():
    model = tcnn.NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 2}, NET)
    x = torch.rand(20, 2, device=dev())
    y = model(x)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):  # any float dtype, cast as tcnn does
        assert torch.allclose(model(x.to(dtype)), y, atol=1e-2)
    assert model(x.double()).dtype == torch.float32  # tcnn's output is its module dtype
    # tinn's own classes stay strict
    with pytest.raises(tinn.InputError, match="dtype torch.float64"):
        tinn.NetworkArray(2, 3, NET)(x.double())
    with pytest.raises(tinn.TinnError, match="cannot be traced"):
        torch.jit.trace(model, x)
    with pytest.raises(tinn.InputError, match="float32 parameters"):
        model.double()(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="moving CPU inputs needs a CUDA runtime")
def test_cpu_inputs_move_to_the_gpu_with_a_warning():
    if tinn.runtime.arch() != "cuda":
        pytest.skip("tinn runs on the CPU here")
    model = tcnn.Network(2, 3, NET)
    with pytest.warns(UserWarning, match="moved from the CPU"):
        y = model(torch.rand(10, 2))
    assert y.is_cuda
