"""Initial weights per activation: tcnn's distributions (Xavier uniform, SIREN for Sine)."""
import math

import pytest
import torch

import tinn
from tinn.initialisation import initial_weights, weight_bounds
from tinn.networks import NetworkArray

SHAPES = [(64, 16), (64, 64), (64, 64), (16, 64)]  # (fan_out, fan_in): padded input and output, as tcnn stores them


def _blocks(w, shapes):
    off = 0
    for o, i in shapes:
        yield w[:, off:off + o * i]
        off += o * i


@pytest.mark.parametrize("activation", ["ReLU", "Tanh", "SiLU", "None"])
def test_xavier_uniform_bounds(activation):
    w = initial_weights(SHAPES, activation, "None", torch.Generator().manual_seed(0), n_networks=8)
    assert w.shape == (8, sum(o * i for o, i in SHAPES)) and w.dtype == torch.float32
    for block, (o, i) in zip(_blocks(w, SHAPES), SHAPES):
        bound = math.sqrt(6.0 / (o + i))
        assert block.abs().max() <= bound
        assert block.abs().max() > 0.98 * bound  # the range is used, not a narrower one
        # Uniform on [-b, b]: mean 0, variance b^2 / 3.
        assert abs(block.mean().item()) < 0.02 * bound
        assert block.var().item() == pytest.approx(bound * bound / 3, rel=0.05)


def test_sine_uses_siren_bounds():
    bounds = weight_bounds(SHAPES, "Sine")
    assert bounds == pytest.approx([30.0 / 16, math.sqrt(6.0 / 64), math.sqrt(6.0 / 64), math.sqrt(6.0 / 64)])
    w = initial_weights(SHAPES, "Sine", "None", torch.Generator().manual_seed(1), n_networks=4)
    for block, bound in zip(_blocks(w, SHAPES), bounds):
        assert bound * 0.98 < block.abs().max() <= bound


def test_output_activation_does_not_change_the_draw():
    a = initial_weights(SHAPES, "ReLU", "None", torch.Generator().manual_seed(2))
    b = initial_weights(SHAPES, "ReLU", "Sigmoid", torch.Generator().manual_seed(2))
    assert torch.equal(a, b)
    with pytest.raises(KeyError):
        initial_weights(SHAPES, "ReLU", "Nope", torch.Generator())


def test_network_reset_parameters_uses_it(device):
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Sine"}
    net = NetworkArray(3, 2, cfg, n_networks=5, seed=7)
    expected = initial_weights(net.layer_shapes(), "Sine", "None", torch.Generator().manual_seed(7), 5)
    assert torch.equal(net.params.detach().cpu(), expected)
    assert net.params.detach()[:, :16 * 3].abs().max().item() <= 30.0 / 3
