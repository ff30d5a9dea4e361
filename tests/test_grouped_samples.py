"""`tuning.group_by_network`: an encoded array runs its batch grouped by network id (one sort, inputs gathered,
outputs and input gradients put back). The values are those of the caller's order: outputs exactly, gradients to
float32 summation order; float64 references for the grouped path are in test_gradient_paths.py,
test_second_order.py and test_part_contract.py."""
import os

import pytest
import torch

import tinn
from reference import rel_err
from tinn.errors import ConfigError
from tinn.models import NetworkWithInputEncoding
from tinn.trainer import Trainer

DEV = tinn.runtime.device()
GRID = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 9, "base_resolution": 4,
        "per_level_scale": 1.6}
NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
       "output_activation": "None"}


def data(size=3000, n_networks=5, seed=2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(size, 3, generator=gen)
    t = torch.rand(size, 4, generator=gen)
    ids = torch.multinomial(torch.tensor([5.0, 1.0, 0.0, 2.0, 0.5][:n_networks]), size, replacement=True,
                            generator=gen).int()
    return x.to(DEV), t.to(DEV), ids.to(DEV)


def run(grouped, tuned, steps=3):
    tuned(group_by_network=grouped)
    model = NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=5, seed=4)
    assert model.groups_by_network() == grouped
    x, t, ids = data()
    with torch.no_grad():
        first = model(x, ids)
    xg = x.clone().requires_grad_()
    (model(xg, ids) * t).sum().backward()
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    losses = [float(trainer.training_step(x, t, ids)) for _ in range(steps)]
    return first, xg.grad, losses


def test_grouped_batches_give_the_callers_order_outputs_gradients_and_training(tuned):
    plain_y, plain_dx, plain_losses = run(False, tuned)
    grouped_y, grouped_dx, grouped_losses = run(True, tuned)
    assert torch.equal(grouped_y, plain_y)  # each output is its own sample's, whatever the batch order
    assert rel_err(grouped_dx, plain_dx) < 1e-5
    assert grouped_losses == pytest.approx(plain_losses, rel=1e-4) and grouped_losses[-1] < grouped_losses[0]


def test_who_groups_by_default(tuned):
    """Auto: on CUDA, for arrays whose networks own their encodings' tables; never for one network or a
    parameter-free or shared encoding."""
    tuned(group_by_network=None)
    own = NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3)
    shared = NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3, share_encoding=True)
    frequency = NetworkWithInputEncoding(3, 4, {"otype": "Frequency", "n_frequencies": 2}, NET, n_networks=3)
    single = NetworkWithInputEncoding(3, 4, GRID, NET)
    assert own.groups_by_network() == (DEV.type == "cuda")
    assert not shared.groups_by_network() and not frequency.groups_by_network() and not single.groups_by_network()
    tuned(group_by_network=True)
    assert own.groups_by_network() and shared.groups_by_network() and not single.groups_by_network()
    # A model's own choice wins over the tuning's: an octree's samples come along rays, in runs of one node.
    assert not NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3, group_by_network=False).groups_by_network()
    tuned(group_by_network=False)
    assert NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3, group_by_network=True).groups_by_network()
    with pytest.raises(ConfigError, match="group_by_network"):
        NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3, group_by_network="yes")


def test_a_shared_network_decodes_every_ids_own_grid():
    """`share_network=True`: one network, a grid table per id; each id's output is that network over its own grid
    (an id's sample equals the same sample through a single model with that id's grid and the shared network).
    Refused where it would mean one function for all, or with `share_encoding`."""
    from tinn.models import NetworkWithInputEncoding

    shared = NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3, share_network=True)
    assert shared.network.n_networks == 1 and shared.encoding.n_networks == 3
    assert shared.n_params_per_network() == shared.encoding.n_params_per_network()
    with torch.no_grad():
        shared.encoding.params.normal_(0, 0.5)
    x = torch.rand(64, 3, device=DEV, generator=torch.Generator(device=DEV).manual_seed(2))
    ids = torch.arange(64, device=DEV, dtype=torch.int32) % 3
    y = shared(x, ids)
    for net in range(3):
        single = NetworkWithInputEncoding(3, 4, GRID, NET)
        with torch.no_grad():
            single.encoding.params.copy_(shared.encoding.params[net].reshape(single.encoding.params.shape))
            single.network.params.copy_(shared.network.params.reshape(single.network.params.shape))
        rows = ids == net
        assert torch.allclose(single(x[rows]), y[rows], atol=1e-6)
    with pytest.raises(ConfigError, match="without tables"):
        NetworkWithInputEncoding(3, 4, {"otype": "Frequency", "n_frequencies": 2}, NET, n_networks=3,
                                 share_network=True)
    with pytest.raises(ConfigError, match="at most one"):
        NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3, share_network=True, share_encoding=True)
    with pytest.raises(ConfigError, match="share_network"):
        NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=3, share_network="yes")


def test_an_octree_field_keeps_its_rays_order():
    from test_octree import blob_field
    assert blob_field(1).model.group_by_network is False


def test_rows_are_gathered_exactly_whatever_their_width():
    from tinn.models import _rows, _ungrouped
    gen = torch.Generator().manual_seed(3)
    order = torch.randperm(50, generator=gen).to(DEV)
    for width in (1, 3, 4, 16):
        t = torch.rand(50, width, generator=gen).to(DEV)
        rows = _rows(t, order)
        assert rows.is_contiguous() and torch.equal(rows, t[order])
        assert torch.equal(_ungrouped(rows, order), t)
    ids = torch.arange(50, device=DEV)
    assert torch.equal(_rows(ids, order), order) and _rows(None, order) is None and _rows(ids, None) is ids


@pytest.mark.skipif(DEV.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton runs on CUDA, or in its interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_row_gather_copies_rows_exactly(dtype):
    """The GPU's gather (tinn/kernels/row_gather.py): rows of every width, int32 and int64 indices, repeated
    indices, a scale, another output dtype, and an empty index."""
    from tinn.kernels.row_gather import gather_rows
    gen = torch.Generator().manual_seed(5)
    for width in (1, 3, 4, 16, 33):
        t = torch.rand(70, width, generator=gen).to(dtype).to(DEV)
        index = torch.randint(0, 70, (90,), generator=gen).to(DEV)
        for idx in (index, index.int()):
            got = gather_rows(t, idx)
            assert got.dtype == dtype and got.is_contiguous() and torch.equal(got, t[index.long()]), width
        halved = gather_rows(t, index, 0.5, torch.float32)
        assert torch.equal(halved, t[index.long()].float() * 0.5)
    assert gather_rows(t, index[:0]).shape == (0, 33)
    from tinn.kernels.row_gather import scatter_rows
    order = torch.randperm(70, generator=gen).to(DEV)
    for idx in (order, order.int()):
        back = scatter_rows(t[order], idx)
        assert back.dtype == dtype and torch.equal(back, t)
    assert scatter_rows(t[:0], order[:0]).shape == (0, 33)


def test_a_grouped_batch_is_sorted_once(tuned, monkeypatch):
    """The grouping's sort reaches the network's routing (`routing.grouped`): a grouped training step and
    forward sort the ids once, where the network would otherwise sort the grouped ids again."""
    sorts = []
    original = torch.sort
    monkeypatch.setattr(torch, "sort", lambda *a, **k: sorts.append(1) or original(*a, **k))
    x, t, ids = data()
    counts = {}
    for grouped in (True, False):
        tuned(group_by_network=grouped)
        model = NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=5, seed=4)
        trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
        sorts.clear()
        trainer.training_step(x, t, ids)
        model.forward_with_context(x, ids, train=True)
        counts[grouped] = len(sorts)
    assert counts == {True: 2, False: 2}  # one sort per call either way: the grouping's, or the network's


def test_a_grouped_model_runs_under_inference_mode(tuned):
    """torch.inference_mode's tensors keep no version counter: the grouping's hint holds by identity there."""
    tuned(group_by_network=True)
    model = NetworkWithInputEncoding(3, 4, GRID, NET, n_networks=5, seed=4)
    x, _, ids = data(300)
    with torch.no_grad():
        want = model(x, ids)
    with torch.inference_mode():
        got = model(x, ids)
    assert torch.equal(got, want)


def test_the_grouped_hint_holds_for_that_tensor_only():
    from tinn import routing
    ids = torch.tensor([0, 0, 1, 2, 2, 2], dtype=torch.int32, device=DEV)
    order, bounds = routing.sorted_bounds(ids, 3)
    fake = torch.tensor([0, 3, 3, 5], device=DEV)  # not these ids' bounds: shows which path answered
    with routing.grouped(ids, fake):
        hinted_order, hinted = routing.sorted_bounds(ids, 3)
        assert torch.equal(hinted, fake) and torch.equal(hinted_order.cpu(), torch.arange(6, dtype=torch.int32))
        assert torch.equal(routing.sorted_bounds(ids.clone(), 3)[1], bounds)  # equal values, another tensor
        assert torch.equal(routing.sorted_bounds(ids, 4)[1].cpu(), torch.tensor([0, 2, 3, 6, 6]))  # other count
        ids[0] = 1  # changed in place: sorted again
        assert torch.equal(routing.sorted_bounds(ids, 3)[1].cpu(), torch.tensor([0, 1, 3, 6]))
        ids[0] = 0
    assert torch.equal(routing.sorted_bounds(ids, 3)[1], bounds)  # outside the block


@pytest.mark.parametrize("hidden_layers", [1, 4])  # the backward that recomputes the forward; the layer-by-layer one
def test_grouped_ids_let_the_tensor_core_kernels_read_rows_in_order(tuned, hidden_layers):
    """Ids the caller grouped (`routing.grouped`) make the sort order the identity: the tensor-core kernels then read
    and write each row at its position instead of gathering it through the order, with the same results bit for
    bit (inference, the training forward, the backward, and the backward with the loss inside after a forward and
    without one)."""
    from tinn import routing
    from tinn.losses import Loss
    from tinn.networks import NetworkArray

    tuned(precision="float32", kernels="tensor_cores")
    net = NetworkArray(3, 4, dict(NET, n_hidden_layers=hidden_layers), n_networks=5, seed=6)
    assert net.tensor_cores is not None
    x, t, ids = data(size=300)
    ids, _ = torch.sort(ids)
    bounds = torch.searchsorted(ids, torch.arange(6, dtype=ids.dtype, device=DEV))
    dy = t * 0.5 - 0.1

    def results():
        y, ctx = net.forward_with_context(x, ids, train=True)
        dx, (grad,) = net.backward(ctx, dy, need_dx=True)
        y2, ctx2 = net.forward_with_context(x, ids, train=True)
        dx2, (grad2,), value = net.backward_from_loss(ctx2, y2, Loss("L2"), t, need_dx=True)
        dx3, (grad3,), value3 = net.gradients_from_loss(x, ids, Loss("L2"), t, need_dx=True)  # no forward
        return [net.inference(x, ids), y, dx, grad, dx2, grad2, value, dx3, grad3, value3]

    gathered = results()
    assert not net.tensor_cores._routing(ids, x.device, train=True)[0].in_order
    with routing.grouped(ids, bounds):
        assert all(r.in_order for r in net.tensor_cores._routing(ids, x.device, train=True))
        in_order = results()
    for a, b in zip(gathered, in_order):
        assert torch.equal(a, b)
