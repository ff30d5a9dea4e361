"""tcnn's parameter layout: flat params in and out, the flat view, tcnn state_dicts."""
import pytest
import torch

import tinn
import tinn.torch as tcnn
from reference import activation, rel_err

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
       "output_activation": "None"}


def dev():
    return tinn.runtime.device()


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
    assert torch.equal(tcnn.export_params(model).cpu().double(), flat)  # padded output rows kept, as tcnn
    assert torch.equal(model.params.detach().cpu().double(), flat)       # tcnn's flat params, a view
    # a tinn model without tcnn's padding exports its output rows padded with zeros, and drops them again
    plain = tinn.NetworkArray(4, 3, NET)
    out = tcnn.export_params(plain)
    assert out.numel() == 16 * 4 + 16 * 16 and not out[16 * 4 + 3 * 16:].any()
    tcnn.import_params(plain, out * 2)
    assert torch.equal(tcnn.export_params(plain), out * 2)


def test_flat_params_are_a_view_of_both_tables():
    cfg = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 6}
    model = tcnn.NetworkWithInputEncoding(2, 3, cfg, NET)
    flat = model.params
    assert flat.numel() == model.n_params() == tinn.tcnn_layout.n_params(model)
    with torch.no_grad():
        flat.zero_()  # writes reach both tables, as tcnn's params do
    assert not model.network.params.any() and not model.encoding.params.any()
    x = torch.rand(10, 2, device=dev())
    assert not model(x).any()
    with torch.no_grad():
        flat.copy_(torch.rand(flat.shape, generator=torch.Generator().manual_seed(0)).to(dev()) - 0.5)
    before = flat.clone()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)  # both tables train; the flat view follows them
    model(x).square().sum().backward()
    opt.step()
    n_net = model.network.params.numel()
    assert not torch.equal(flat[:n_net], before[:n_net]) and not torch.equal(flat[n_net:], before[n_net:])
    assert torch.equal(flat[:n_net], model.network.params.detach().reshape(-1))


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


