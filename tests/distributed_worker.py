"""One rank of the 2-process gloo tests (tests/test_distributed.py starts two of these).

    python tests/distributed_worker.py SCENARIO OUT_DIR       (RANK, WORLD_SIZE, MASTER_* in the environment)

Scenarios write what they computed to OUT_DIR/rank<r>.pt (or an error description) for the test to
compare with the unsharded array in its own process.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

N_NETWORKS = 6
ENCODING = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 6,
            "base_resolution": 4, "per_level_scale": 2.0}
NETWORK = {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "Tanh",
           "output_activation": "None"}
BATCH = 40


def factory(share_encoding=False, network=NETWORK, group_by_network=None, share_network=False):
    from tinn.models import NetworkWithInputEncoding

    return lambda n: NetworkWithInputEncoding(2, 3, ENCODING, network, n_networks=n, seed=11,
                                              share_encoding=share_encoding, group_by_network=group_by_network,
                                              share_network=share_network)


# scenario_equal's models: a grid and a network per id, one grid shared by all, one network shared by all.
EQUAL_MODES = {"sharded": {}, "shared": {"share_encoding": True}, "shared_network": {"share_network": True}}


def batch(rank: int, step: int, size: int = BATCH, skew: bool = False):
    """Rank `rank`'s batch at `step`; with skew 90% of the samples go to network 1 (owned by rank 0)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.rand(size, 2, generator=g)
    ids = torch.randint(0, N_NETWORKS, (size,), generator=g, dtype=torch.int32)
    if skew:
        ids[torch.rand(size, generator=g) < 0.9] = 1
    target = torch.rand(size, 3, generator=g)
    weight = torch.randn(size, 3, generator=g)
    return x, ids, target, weight


def autograd_pass(model, x, ids, weight):
    x = x.clone().requires_grad_()
    for p in model.parameters():
        p.grad = None
    y = model(x, ids)
    (y * weight).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def scenario_equal(rank, out):
    import tinn.distributed as td
    from tinn.trainer import Trainer

    res = {}
    for tag, sharing in EQUAL_MODES.items():
        model = td.ShardedPart(factory(**sharing), N_NETWORKS, config={"shared": tag})
        res[f"{tag}/init"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        res[f"{tag}/grouped"] = model.local.groups_by_network()  # (tuning.group_by_network, from TINN_SETTINGS)
        x, ids, _, w = batch(rank, 0)
        res[f"{tag}/autograd"] = autograd_pass(model, x, ids, w)
        x, ids, _, w = batch(rank, 1, skew=True)
        res[f"{tag}/skew"] = autograd_pass(model, x, ids, w)
        # A rank with no samples (rank 1) while rank 0 has a ragged batch.
        x, ids, _, w = batch(rank, 2, size=BATCH if rank == 0 else 0)
        res[f"{tag}/empty"] = autograd_pass(model, x, ids, w)
        with torch.no_grad():
            res[f"{tag}/inference"] = model(*batch(rank, 3)[:2])
        trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
        losses = []
        for step in range(3):
            x, ids, t, _ = batch(rank, 10 + step)
            losses.append(float(trainer.training_step(x, t, ids)))
        res[f"{tag}/trained"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        res[f"{tag}/losses"] = losses
        # The trainer with an empty batch on rank 1 (its step goes through autograd, rank 0's through the contract).
        x, ids, t, _ = batch(rank, 20, size=BATCH if rank == 0 else 0)
        trainer.training_step(x, t, ids, run_optimizer=False)
        res[f"{tag}/trainer_empty_grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    res["owned"] = model.owned
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))


# The pipelined / uneven / empty-bucket scenario: (name, ShardedPart keywords). UNEVEN gives rank 0 two
# networks (the first and the last) and rank 1 four.
UNEVEN = [0, 1, 1, 1, 1, 0]
PIPELINE_CASES = {"chunks1": {}, "chunks3": {"chunks": 3}, "triton2": {"chunks": 2, "exchange_kernels": "triton"},
                  "uneven3": {"chunks": 3, "assignment": UNEVEN}}


def pipeline_batches(rank: int, owned0: list[int], device="cpu"):
    """(name, batch) of the pipeline scenario: a plain batch, and one whose samples all go to rank 0's networks
    (rank 1 receives nothing) with rank 1's batch 2 samples long (some of its chunks are empty)."""
    plain = batch(rank, 0)
    x, ids, t, w = batch(rank, 1, size=BATCH if rank == 0 else 2)
    ids = torch.tensor(owned0, dtype=torch.int32)[ids.long() % len(owned0)]
    return {name: tuple(v.to(device) for v in b) for name, b in (("plain", plain), ("to_rank0", (x, ids, t, w)))}


def _on_host(value):
    """Results as CPU tensors (the test process compares them wherever its own tinn runs)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    return value


def scenario_pipeline(rank, out):
    """Chunked (pipelined) exchanges, the Triton bucketing kernels (Triton's interpreter), uneven ownership and a
    rank that receives nothing, each through autograd (outputs, dx, every table's gradient); the contract's
    dx announcement; the phase profile of trainer steps; a Replicated part's all-reduced gradients."""
    import tinn
    import tinn.distributed as td
    from tinn.distributed import buckets as B
    from tinn.distributed.profile import PhaseTimer
    from tinn.errors import ConfigError
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    res = {}
    dev = tinn.runtime.device()
    for shared in (False, True):
        for name, kw in PIPELINE_CASES.items():
            model = td.ShardedPart(factory(shared), N_NETWORKS, config={"case": name, "shared": shared}, **kw)
            tag = f"{'shared' if shared else 'sharded'}/{name}"
            res[f"{tag}/owned"] = model.owned
            res[f"{tag}/triton"] = B.use_triton(model.exchange_kernels, dev, N_NETWORKS)
            for case, (x, ids, _, w) in pipeline_batches(rank, model.ownership.owned(0), dev).items():
                res[f"{tag}/{case}"] = autograd_pass(model, x, ids, w)
    model = td.ShardedPart(factory(), N_NETWORKS, chunks=2)
    x, ids, t, w = (v.to(dev) for v in batch(rank, 5))
    y, ctx = model.forward_with_context(x, ids, train=True)
    try:
        model.backward(ctx, w, need_dx=True)
        res["unannounced"] = "no error"
    except ConfigError as e:
        res["unannounced"] = str(e)
    y, ctx = model.forward_with_context(x, ids, train=True, need_dx=True)  # the ranks are still in step
    dx, grads = model.backward(ctx, w, need_dx=True)
    names = {id(p): n for n, p in model.named_parameters()}
    res["announced"] = {"y": y, "dx": dx, "grads": {names[id(t)]: g for t, g in zip(model.parameter_tables(), grads)}}
    res["announced_autograd"] = autograd_pass(model, x, ids, w)
    timer = PhaseTimer(cuda=dev.type == "cuda")
    model.profiler = timer
    trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    timer.start()
    for step in range(2):
        trainer.training_step(x, t, ids)
    timer.mark("other")
    res["profile"] = timer.collect(2)
    res["profile_marks"] = [phase for phase, _, _ in timer._marks]
    rep = td.Replicated(NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS, seed=3))
    res["replicated"] = autograd_pass(rep, x, ids, w)
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


REDUCE_DTYPES = ("float32", "bfloat16", "float16")


def replicated_factory():
    """A part of two tables (grid + MLP), so that the all-reduce fills a bucket from both."""
    from tinn.models import NetworkWithInputEncoding

    return NetworkWithInputEncoding(2, 3, ENCODING, NETWORK, n_networks=N_NETWORKS, seed=11)


def scenario_replicated(rank, out):
    """Replicated (data-parallel) parts: autograd gradients with the all-reduce in each reduce_dtype, Trainer
    steps through the contract, and a bad reduce_dtype."""
    import tinn
    import tinn.distributed as td
    from tinn.errors import ConfigError
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    res = {}
    dev = tinn.runtime.device()
    x, ids, _, w = (v.to(dev) for v in batch(rank, 6))
    for dtype in REDUCE_DTYPES:
        res[dtype] = autograd_pass(td.Replicated(replicated_factory(), reduce_dtype=dtype), x, ids, w)
    model = td.Replicated(NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS, seed=3))
    trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    res["losses"] = []
    for step in range(2):
        x, ids, t, _ = (v.to(dev) for v in batch(rank, 60 + step))
        res["losses"].append(float(trainer.training_step(x, t, ids)))
    res["trained"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    # An empty batch on rank 1: both ranks' Trainers take the same path (the contract), and the reduced gradient
    # is half rank 0's (the optimizer unsplit, so that the tables hold the reduced gradient).
    model = td.Replicated(NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS, seed=3), optimizer_split=False)
    trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    x, ids, t, _ = (v.to(dev) for v in batch(rank, 70, size=BATCH if rank == 0 else 0))
    trainer.training_step(x, t, ids, run_optimizer=False)
    res["empty_grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    try:
        td.Replicated(replicated_factory(), reduce_dtype="int8")
        res["bad_dtype"] = "no error"
    except ConfigError as e:
        res["bad_dtype"] = str(e)
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


# Steps of the pieces scenario's Trainers (a part with collectives steps op by op, also where step graphs are on).
PIECE_STEPS = 3


def scenario_pieces(rank, out):
    """Replicated tensor-core arrays with the all-reduce cut by network (`tuning.reduce_pieces`) and in one
    bucket: autograd gradients of an array and of a grid + array (its grid in the bucket), Trainer steps in each
    reduce dtype, and an empty batch on rank 1 (whose backward hands nothing over, so it issues the plan's
    ranges itself). Counts the ranges handed over during backwards and the reductions issued."""
    import tinn
    import tinn.distributed as td
    from tinn import settings
    from tinn.distributed import piece_reduction, sharded
    from tinn.models import NetworkWithInputEncoding
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    counts = {"handed": 0, "reductions": 0}
    ready, reduction = piece_reduction.PieceReduction._ready, sharded._Reduction

    def counting_ready(self, *a):
        counts["handed"] += 1
        return ready(self, *a)

    class CountingReduction(reduction):
        def __init__(self, grads, *a, **kw):
            counts["reductions"] += any(g is not None for g in grads)
            super().__init__(grads, *a, **kw)
    piece_reduction.PieceReduction._ready = counting_ready
    sharded._Reduction = CountingReduction
    base = settings.installed().replace(kernels="tensor_cores", precision="float16")
    dev = tinn.runtime.device()
    res = {}
    # (pieces, step graphs on or off): a part with collectives steps op by op either way without
    # `tuning.replicated_step_graphs` (the captured scenario takes it).
    for pieces, graphs in ((1, True), (4, True), (4, False)):
        settings.install(base.replace(reduce_pieces=pieces, step_graphs=graphs, replicated_step_graphs=False))
        if not graphs:
            pieces = "4 eager"
        x, ids, _, w = (v.to(dev) for v in batch(rank, 6))
        for name, build in (("array", lambda: NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS, seed=3)),
                            ("grid+array", lambda: NetworkWithInputEncoding(2, 3, ENCODING, NETWORK,
                                                                            n_networks=N_NETWORKS, seed=11))):
            counts.update(handed=0, reductions=0)
            res[(pieces, name)] = autograd_pass(td.Replicated(build()), x, ids, w)
            res[(pieces, name)]["counts"] = dict(counts)
        for dtype in REDUCE_DTYPES:
            model = td.Replicated(NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS, seed=3), reduce_dtype=dtype,
                                  optimizer_split=False)
            trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
            counts.update(handed=0, reductions=0)
            losses = []
            for step in range(PIECE_STEPS):
                x, ids, t, _ = (v.to(dev) for v in batch(rank, 60 + step))
                losses.append(float(trainer.training_step(x, t, ids)))
            res[(pieces, "trained", dtype)] = {"losses": losses, "counts": dict(counts),
                                               "graphs": trainer.step_graph_status,
                                               "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
        model = td.Replicated(NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS, seed=3), optimizer_split=False)
        trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
        x, ids, t, _ = (v.to(dev) for v in batch(rank, 70, size=BATCH if rank == 0 else 0))
        counts.update(handed=0, reductions=0)
        trainer.training_step(x, t, ids, run_optimizer=False)
        res[(pieces, "empty")] = {"grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                                  "counts": dict(counts)}
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


# Steps of the captured scenario's Trainers: on CUDA over NCCL a step op by op, the capture, the step graphs' trial
# (1 + TRIAL_STEPS op by op, as many replayed), replays. Each rank's batch size changes at CAPTURED_SWITCH (a second
# shape: a step op by op, its capture) and differs from the other rank's (each rank captures its own shapes, at the
# same steps).
CAPTURED_STEPS, CAPTURED_SWITCH = 16, 14
CAPTURED_SIZES = ((BATCH, BATCH // 2), (BATCH - 7, BATCH + 5))  # [rank][before, after the switch]
# (optimizer split, reduce_pieces) of the captured scenario.
CAPTURED_CASES = ((False, 1), (False, 4), (True, 1))


def scenario_captured(rank, out):
    """Replicated tensor-core arrays' Trainer steps with `tuning.replicated_step_graphs` on against off: the
    all-reduce in one bucket and in 4 ranges, and the split optimizer (reduce-scatter, Adam on the slice,
    all-gather). Each step's loss is read on the host, as a loop that prints it does. On CUDA over NCCL the steps
    are captured with their collectives and replayed; over gloo they run op by op either way."""
    import tinn
    import tinn.distributed as td
    from tinn import settings
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    base = settings.installed().replace(kernels="tensor_cores", precision="float16")
    dev = tinn.runtime.device()
    res = {}
    for graphs in (False, True):
        for split, pieces in CAPTURED_CASES:
            settings.install(base.replace(replicated_step_graphs=graphs, reduce_pieces=pieces))
            model = td.Replicated(NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS, seed=3), optimizer_split=split)
            trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
            losses = []
            for step in range(CAPTURED_STEPS):
                size = CAPTURED_SIZES[rank][step >= CAPTURED_SWITCH]
                x, ids, t, _ = (v.to(dev) for v in batch(rank, 60 + step, size=size))
                losses.append(float(trainer.training_step(x, t, ids)))
            graph_steps = trainer._step_graphs
            res[(graphs, split, pieces)] = {
                "losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "status": trainer.step_graph_status, "replays": 0 if graph_steps is None else graph_steps.replays,
                "captures": [] if graph_steps is None else list(graph_steps.captures),
                "eager_shapes": {} if graph_steps is None else dict(graph_steps.eager_shapes)}
    settings.install(base)
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


SPLIT_ADAM = {"otype": "Adam", "learning_rate": 1e-2, "l2_reg": 1e-4, "non_matrix_learning_rate_factor": 0.5}
SPLIT_SGD = {"otype": "SGD", "learning_rate": 0.1}
# (model, optimizer, reduce dtype) of the split scenario; each is trained with the split on and off.
SPLIT_CASES = {"two_tables/adam/float32": ("two_tables", SPLIT_ADAM, "float32"),
               "two_tables/adam/bfloat16": ("two_tables", SPLIT_ADAM, "bfloat16"),
               "two_tables/sgd/float32": ("two_tables", SPLIT_SGD, "float32"),
               "one_table/adam/float32": ("one_table", SPLIT_ADAM, "float32")}
SPLIT_STEPS = 3


def split_model(kind: str):
    """The split scenario's parts: grid + MLP (the split cuts the grid's table mid-row), or one MLP table (its
    slices are whole rows, all-gathered in place)."""
    from tinn.networks import NetworkArray

    return replicated_factory() if kind == "two_tables" else NetworkArray(2, 3, NETWORK, n_networks=N_NETWORKS,
                                                                          seed=3)


def split_lr_scale(n_rows: int):
    return torch.linspace(0.5, 1.5, n_rows)


def scenario_split(rank, out):
    """Replicated parts whose optimizer is split over the ranks (ZeRO stage 1) against the all-reduce and the
    whole optimizer on every rank: Trainer steps, checkpoints of the split state, the overflow agreement, and
    bad options."""
    import tinn
    import tinn.distributed as td
    from tinn.distributed.optimizer_split import SplitOptimizer
    from tinn.errors import CheckpointError, ConfigError
    from tinn.gradient_scaling import GradientScaler
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    res = {}

    def trained(kind, optimizer, reduce_dtype, split, steps=SPLIT_STEPS):
        model = td.Replicated(split_model(kind), reduce_dtype=reduce_dtype, optimizer_split=split)
        trainer = Trainer(model, optimizer=optimizer)
        last = list(model.named_parameters())[-1]
        trainer.optimizer.set_lr_scale(last[0], split_lr_scale(last[1].shape[0]).to(dev))
        losses = []
        for step in range(steps):
            x, ids, t, _ = (v.to(dev) for v in batch(rank, 70 + step))
            losses.append(float(trainer.training_step(x, t, ids)))
        return model, trainer, losses

    for case, (kind, optimizer, reduce_dtype) in SPLIT_CASES.items():
        for split in (False, True):
            model, trainer, losses = trained(kind, optimizer, reduce_dtype, split)
            entry = {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "losses": losses,
                     "split": isinstance(trainer.optimizer, SplitOptimizer)}
            if entry["split"]:
                opt = trainer.optimizer
                entry["pieces"] = [(p.name, tuple(p.view.shape), p.flat_lo, p.flat_hi) for p in opt.split.pieces]
                entry["layout"] = (opt.split.numel, opt.split.slice_len)
                entry["state_elements"] = sum(t.numel() for k, t in opt.inner.state.items() if k.startswith("m."))
                # After a backward the tables hold no gradient: the reduced one is the optimizer's slice.
                x, ids, t, _ = (v.to(dev) for v in batch(rank, 79))
                trainer.training_step(x, t, ids, run_optimizer=False)
                entry["grads_after_backward"] = [p.grad for p in model.parameters()]
                entry["grad_slice"] = opt.split.grad.clone()
                trainer.optimizer.zero_grad()
            res[f"{case}/{'split' if split else 'allreduce'}"] = entry

    # The phases of split steps: the reduce-scatter and the all-gather count as "reduce", the slice's update as
    # "optimizer".
    from tinn.distributed.profile import PhaseTimer

    model, trainer, _ = trained("one_table", SPLIT_ADAM, "float32", True, steps=1)
    timer = PhaseTimer(cuda=False)
    model.profiler = timer
    timer.start()
    for step in range(2):
        x, ids, t, _ = (v.to(dev) for v in batch(rank, 80 + step))
        trainer.training_step(x, t, ids)
    timer.mark("other")
    model.profiler = None
    res["profile"] = timer.collect(2)
    res["profile_marks"] = [phase for phase, _, _ in timer._marks]

    # Checkpoints: the gathered (unsplit) state, restored bit for bit into a split and an unsplit trainer.
    a_model, a, _ = trained("two_tables", SPLIT_ADAM, "float32", True, steps=2)
    _, ref, _ = trained("two_tables", SPLIT_ADAM, "float32", False, steps=2)
    path = os.path.join(out, f"split{rank}.tinn")
    a.save_checkpoint(path)  # every rank: the state gather is a collective
    res["saved_state"] = a.optimizer.state_dict()
    res["allreduce_state"] = ref.optimizer.state_dict()
    shared = os.path.join(out, "split0.tinn")  # every rank resumes from rank 0's file
    import torch.distributed as dist

    dist.barrier()
    b_model = td.Replicated(split_model("two_tables"), optimizer_split=True)
    b = Trainer(b_model, optimizer=SPLIT_ADAM)
    b.load_checkpoint(shared)
    res["restored_state"] = b.optimizer.state_dict()
    c = Trainer(td.Replicated(split_model("two_tables"), optimizer_split=False), optimizer=SPLIT_ADAM)
    c.load_checkpoint(shared)
    res["unsplit_restored_state"] = c.optimizer.state_dict()
    x, ids, t, _ = (v.to(dev) for v in batch(rank, 90))
    a.training_step(x, t, ids)
    b.training_step(x, t, ids)
    res["same_after_step"] = all(torch.equal(p, q) for p, q in zip(a_model.parameters(), b_model.parameters()))
    res["after_step_max_diff"] = max(float((p - q).abs().max()) for p, q in zip(a_model.parameters(),
                                                                               b_model.parameters()))
    # A state with one wrong shape changes nothing.
    bad = dict(res["saved_state"])
    bad["v.inner.network.params"] = bad["v.inner.network.params"][:, :-1]
    before = b.optimizer.state_dict()
    try:
        b.optimizer.load_state_dict(bad)
        res["bad_state"] = "loaded"
    except CheckpointError as e:
        res["bad_state"] = str(e)
    after = b.optimizer.state_dict()
    res["bad_state_untouched"] = all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k]
                                     for k, v in before.items())

    # Rank 0's scaler saw an overflow: after the reduce-scatter both ranks hold it (both skip the step).
    model = td.Replicated(split_model("one_table"), optimizer_split=True)
    model.inner.gradient_scaler = GradientScaler(dev)
    model.build_optimizer(SPLIT_ADAM)
    model.inner.gradient_scaler.found_inf.fill_(1.0 if rank == 0 else 0.0)
    x, ids, _, w = (v.to(dev) for v in batch(rank, 0))
    (model(x, ids) * w).sum().backward()
    res["found_inf"] = float(model.inner.gradient_scaler.found_inf)

    def error(build):
        try:
            build()
            return "no error"
        except ConfigError as e:
            return str(e)

    res["bad_value"] = error(lambda: td.Replicated(split_model("one_table"), optimizer_split="yes"))
    res["not_elementwise"] = error(lambda: td.Replicated(split_model("one_table"), optimizer_split=True)
                                   .build_optimizer({"otype": "Novograd"}))
    auto = Trainer(td.Replicated(split_model("one_table")), optimizer={"otype": "Novograd", "learning_rate": 1e-2})
    res["novograd_auto_split"] = isinstance(auto.optimizer, SplitOptimizer)
    res["auto_split_by_reduce_dtype"] = {
        dtype: isinstance(Trainer(td.Replicated(split_model("one_table"), reduce_dtype=dtype),
                                  optimizer={"otype": "Adam"}).optimizer, SplitOptimizer)
        for dtype in ("float32", "bfloat16")}
    x, ids, t, _ = (v.to(dev) for v in batch(rank, 95))
    auto.training_step(x, t, ids)
    res["novograd_params"] = {n: p.detach().clone() for n, p in auto.model.named_parameters()}
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


EXCHANGE_DTYPES = {"float16": (torch.float16, torch.bfloat16), "bfloat16": (torch.bfloat16, torch.bfloat16)}


def scenario_exchange_dtype(rank, out):
    """16-bit exchanges (torch ops and the Triton kernels, chunked, owned and shared encodings) through autograd;
    the float32 exchange on the same batch, and on the batch rounded as the 16-bit exchange rounds it (inputs
    to the values' dtype, dy to the gradients'); a bad exchange_dtype and ranks that disagree on it."""
    import tinn
    import tinn.distributed as td
    from tinn.errors import ConfigError

    dev = tinn.runtime.device()
    res = {}
    x, ids, _, w = (v.to(dev) for v in batch(rank, 4))
    for kernels in ("torch", "triton"):
        for shared in (False, True):
            tag = f"{kernels}/{'shared' if shared else 'sharded'}"
            wide = td.ShardedPart(factory(shared), N_NETWORKS, chunks=2, exchange_kernels=kernels)
            res[f"{tag}/float32"] = autograd_pass(wide, x, ids, w)
            for name, (values, grads) in EXCHANGE_DTYPES.items():
                narrow = td.ShardedPart(factory(shared), N_NETWORKS, chunks=2, exchange_kernels=kernels,
                                        exchange_dtype=name)
                res[f"{tag}/{name}"] = autograd_pass(narrow, x, ids, w)
                res[f"{tag}/{name}/rounded"] = autograd_pass(wide, x.to(values).float(), ids, w.to(grads).float())

    def build(**kw):
        try:
            td.ShardedPart(factory(), N_NETWORKS, **kw)
            return "no error"
        except ConfigError as e:
            return str(e)

    res["bad"] = build(exchange_dtype="int8")
    res["disagree"] = build(exchange_dtype="float16" if rank == 0 else "float32")
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


@contextlib.contextmanager
def _counting_calls(owner, name: str):
    """[calls of owner.name] within the block (a function or method, called through `owner`)."""
    calls, original = [0], getattr(owner, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)
    setattr(owner, name, counted)
    try:
        yield calls
    finally:
        setattr(owner, name, original)


def scenario_syncs(rank, out):
    """Host synchronisations of a sharded step on CUDA (torch's sync debug mode): the forward's header is the
    only one; the backward has none, chunked or not."""
    import warnings

    import tinn
    import tinn.distributed as td
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    res = {}
    for chunks in (1, 2):
        model = td.ShardedPart(factory(True), N_NETWORKS, chunks=chunks)
        trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
        x, ids, t, w = (v.to(dev) for v in batch(rank, 0, size=4096))
        trainer.training_step(x, t, ids)  # compiles (compiling may sync)
        torch.cuda.synchronize()
        with tinn.checks.disabled(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")

            def syncs():
                # torch also warns once per process that its sync debug mode is a prototype: not a sync
                return sum("called a synchronizing" in str(c.message) for c in caught)

            torch.cuda.set_sync_debug_mode("warn")
            try:
                # The header is read after its copy to the host, waited for through an event, which the sync debug
                # mode does not see: counted here.
                with _counting_calls(torch.cuda.Event, "synchronize") as waits:
                    y, ctx = model.forward_with_context(x, ids, train=True)
                forward = syncs() + waits[0]
                torch.cuda.set_sync_debug_mode("error")
                model.backward(ctx, w, need_dx=False)
                torch.cuda.set_sync_debug_mode("warn")
                before = syncs()
                with _counting_calls(torch.cuda.Event, "synchronize") as waits:
                    trainer.training_step(x, t, ids)
                step = syncs() - before + waits[0]
                # Three steps routing ahead: three headers read (the first step's own and the next two batches'),
                # each once the step that routes it has issued its compute.
                before = syncs()
                with _counting_calls(torch.cuda.Event, "synchronize") as waits:
                    for _ in trainer.training_steps([(x, t, ids)] * 3):
                        pass
                ahead = syncs() - before + waits[0]
            finally:
                torch.cuda.set_sync_debug_mode("default")
        res[chunks] = {"forward": forward, "step": step, "ahead": ahead,
                       "messages": [str(c.message)[:200] for c in caught]}
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))


def scenario_compact(rank, out):
    """Compact (bfloat16) grid tables owned per network: trained sharded; replicated, refused."""
    import tinn.distributed as td
    from tinn.errors import ConfigError
    from tinn.models import NetworkWithInputEncoding
    from tinn.trainer import Trainer

    res = {}
    model = td.ShardedPart(compact_factory(), N_NETWORKS)
    x, ids, _, w = batch(rank, 0)
    got = autograd_pass(model, x, ids, w)
    res["y"] = got["y"]
    res["grads"] = {n: (g.coalesce().to_dense() if g.is_sparse else g).float() for n, g in got["grads"].items()}
    res["dtypes"] = {n: p.dtype for n, p in model.named_parameters()}
    before = model.local.encoding.params.detach().clone()
    trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    res["losses"] = []
    for step in range(3):
        x, ids, t, _ = batch(rank, 10 + step)
        res["losses"].append(float(trainer.training_step(x, t, ids)))
    res["moved"] = float((model.local.encoding.params.detach() != before).float().mean())
    res["owned"] = model.owned
    try:
        td.ShardedPart(lambda n: NetworkWithInputEncoding(2, 3, dict(ENCODING, table_dtype="bfloat16"), NETWORK,
                                                          n_networks=n, seed=11, share_encoding=True), N_NETWORKS)
        res["replicated_error"] = None
    except ConfigError as e:
        res["replicated_error"] = str(e)
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))


def compact_factory():
    from tinn.models import NetworkWithInputEncoding

    return lambda n: NetworkWithInputEncoding(2, 3, dict(ENCODING, table_dtype="bfloat16"), NETWORK, n_networks=n,
                                              seed=11)


def scenario_checkpoint(rank, out):
    import tinn.distributed as td
    from tinn.errors import CheckpointError
    from tinn.trainer import Trainer

    def make():
        model = td.ShardedPart(factory(), N_NETWORKS)
        return Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2}, config={"tag": "ckpt"})

    a = make()
    for step in range(2):
        x, ids, t, _ = batch(rank, 30 + step)
        a.training_step(x, t, ids)
    directory = os.path.join(out, "ckpt")
    manifest = td.save_checkpoint(a, directory)
    b = make()
    td.load_checkpoint(b, directory)
    same_state = all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    x, ids, t, _ = batch(rank, 40)
    la, lb = float(a.training_step(x, t, ids)), float(b.training_step(x, t, ids))
    same_after_step = all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    # A copy whose rank-1 file is damaged must leave every rank untouched.
    import shutil
    import torch.distributed as dist

    damaged_dir = os.path.join(out, "damaged")
    if rank == 0:
        shutil.copytree(directory, damaged_dir)
        with open(os.path.join(damaged_dir, "rank-00001.tinn"), "r+b") as f:
            f.seek(-3, 2)
            f.write(b"xyz")
    dist.barrier()
    before = [p.detach().clone() for p in b.model.parameters()]
    try:
        td.load_checkpoint(b, damaged_dir)
        damaged = "loaded"
    except CheckpointError as e:
        damaged = str(e)
    untouched = all(torch.equal(p, q) for p, q in zip(before, b.model.parameters()))
    dist.barrier()
    torch.save({"manifest": manifest, "same_state": same_state, "same_after_step": same_after_step,
                "losses": (la, lb), "damaged": damaged, "untouched": untouched,
                "params": {n: p.detach().clone() for n, p in a.model.named_parameters()}},
               os.path.join(out, f"rank{rank}.pt"))


def scenario_resume_one_rank(rank, out):
    """One process resumes the 2-rank checkpoint: a clear error; the gathered weights, sharded again for one
    rank (reshard_state), give the unsharded array's outputs."""
    import tinn.distributed as td
    from tinn.errors import CheckpointError
    from tinn.trainer import Trainer

    model = td.ShardedPart(factory(), N_NETWORKS)
    trainer = Trainer(model, optimizer={"otype": "Adam"}, config={"tag": "ckpt"})
    try:
        td.load_checkpoint(trainer, os.environ["CKPT"])
        error = "loaded"
    except CheckpointError as e:
        error = str(e)
    state, _ = td.gather_state(os.environ["CKPT"])
    model.load_state_dict(td.reshard_state(state, model))
    x, ids, _, _ = batch(rank, 50)
    with torch.no_grad():
        y = model(x, ids)
    torch.save({"error": error, "y": y}, os.path.join(out, f"rank{rank}.pt"))


def _forward_expecting_failure(model, rank, out):
    """Rank 0's forward with its peer gone: records the error (or its absence) and how long it took."""
    from tinn.errors import DistributedError

    x, ids, _, _ = batch(rank, 0)
    t0 = time.perf_counter()
    try:
        model(x, ids)
        result = "no error"
    except DistributedError as e:
        result = f"DistributedError: {e}"
    torch.save({"result": result, "seconds": time.perf_counter() - t0}, os.path.join(out, f"rank{rank}.pt"))


def scenario_exit(rank, out):
    """Rank 1 exits after construction; rank 0's forward must raise, not hang."""
    import tinn.distributed as td

    model = td.ShardedPart(factory(), N_NETWORKS)
    if rank == 1:
        os._exit(0)
    _forward_expecting_failure(model, rank, out)
    os._exit(0)  # the group cannot be shut down cleanly without its peer


def scenario_stall(rank, out):
    """Rank 1 stays alive but never calls forward, until rank 0 has recorded its outcome (at most
    STALL_SECONDS): rank 0 can only get there by the collective timeout. Rank 1 records whether it saw that
    while still alive."""
    import tinn.distributed as td

    model = td.ShardedPart(factory(), N_NETWORKS)
    if rank == 1:
        done = os.path.join(out, "rank0.pt")
        give_up = time.monotonic() + float(os.environ["STALL_SECONDS"])
        while not os.path.exists(done) and time.monotonic() < give_up:
            time.sleep(0.05)
        torch.save({"saw_rank0_finish_while_stalled": os.path.exists(done)}, os.path.join(out, "rank1.pt"))
        os._exit(0)
    _forward_expecting_failure(model, rank, out)
    os._exit(0)


def scenario_mismatch(rank, out):
    """Rank 1 builds another network width: a ConfigError on both ranks at construction."""
    import tinn.distributed as td
    from tinn.errors import ConfigError

    def build(**kw):
        try:
            td.ShardedPart(**kw)
            return "no error"
        except ConfigError as e:
            return f"ConfigError: {e}"

    network = dict(NETWORK, n_neurons=32) if rank == 1 else NETWORK
    res = {"result": build(part_factory=factory(network=network), n_networks=N_NETWORKS)}
    # Chunk counts shape every header: ranks with different ones are refused at construction too.
    res["chunks"] = build(part_factory=factory(), n_networks=N_NETWORKS, chunks=1 + rank)
    res["bad_chunks"] = build(part_factory=factory(), n_networks=N_NETWORKS, chunks=0)
    res["bad_kernels"] = build(part_factory=factory(), n_networks=N_NETWORKS, exchange_kernels="cub")
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))


def scenario_overflow(rank, out):
    """Rank 0's scaler saw an overflow in its own networks' gradients, rank 1's did not: after the backward both
    ranks' scalers hold the overflow, so both skip the step."""
    import tinn.distributed as td
    from tinn.gradient_scaling import GradientScaler

    model = td.ShardedPart(factory(share_encoding=True), N_NETWORKS)
    network = model.local.network
    network.gradient_scaler = GradientScaler(torch.device("cpu"))
    network.gradient_scaler.found_inf.fill_(1.0 if rank == 0 else 0.0)
    x, ids, _, weight = batch(rank, 0)
    autograd_pass(model, x, ids, weight)
    res = {"found_inf": float(network.gradient_scaler.found_inf)}
    # The Trainer's step with the loss at the owners: the loss and the flags share one all-reduce.
    from tinn.losses import Loss
    x, ids, target, _ = batch(rank, 1)
    for name, flag in (("at_owners", 1.0 if rank == 1 else 0.0), ("at_owners_clean", 0.0)):
        network.gradient_scaler.found_inf.fill_(flag)
        _, _, value = model.gradients_from_loss(x, ids, Loss("L2"), target, need_dx=False)
        res[name] = float(network.gradient_scaler.found_inf)
        res[name + "_loss"] = float(value)
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))


def scenario_disagree(rank, out):
    """Rank 0 runs a training forward, rank 1 an inference one: both raise instead of deadlocking later. Then
    rank 0 takes a step with the loss at the owners while rank 1 runs a training forward: both raise too."""
    import tinn.distributed as td
    from tinn.errors import DistributedError
    from tinn.losses import Loss

    model = td.ShardedPart(factory(), N_NETWORKS)
    x, ids, t, _ = batch(rank, 0)
    results = []
    for call in ("grad_mode", "loss_at_owners"):
        try:
            if call == "grad_mode":
                with torch.set_grad_enabled(rank == 0):
                    model(x, ids)
            elif rank == 0:
                model.gradients_from_loss(x, ids, Loss("L2"), t, need_dx=False)
            else:
                model.forward_with_context(x, ids, train=True)
            results.append("no error")
        except DistributedError as e:
            results.append(f"DistributedError: {e}")
    torch.save({"result": results[0], "loss_at_owners": results[1]}, os.path.join(out, f"rank{rank}.pt"))


# The loss at the owners: (name, ShardedPart keywords) and per-rank batch sizes.
# "grouped": the local part groups its batch by network (as on CUDA), so the rows the owners unpack grouped by
# network reach it without a sort; with the Triton kernels where they run (their interpreter in the gloo tests).
OWNER_LOSS_CASES = {"mean": {}, "sum": {"gradients": "sum"}, "chunks3": {"chunks": 3},
                    "uneven3": {"chunks": 3, "assignment": UNEVEN},
                    "grouped": {"group_by_network": True, "chunks": 2, "assignment": UNEVEN,
                                "exchange_kernels": "triton"},
                    "unsorted": {"max_network_bins": 0}}
OWNER_LOSS_BATCHES = {"equal": (BATCH, BATCH), "unequal": (BATCH, 13), "empty": (BATCH, 0)}


def scenario_owner_loss(rank, out):
    """`ShardedPart.gradients_from_loss` (each sample's loss where its network lives) against the forward and
    `backward_from_loss` of the same part, on equal, unequal and empty per-rank batches; and Trainer steps
    through it against steps through the forward (the part's `fuses_loss` forced off)."""
    import tinn
    import tinn.distributed as td
    from tinn.distributed import buckets as B
    from tinn.distributed import sharded
    from tinn.losses import Loss
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    res = {}
    for name, kw in OWNER_LOSS_CASES.items():
        kw = dict(kw)
        grouping = kw.pop("group_by_network", None)
        if kw.get("exchange_kernels") == "triton" and not B.use_triton("triton", dev):
            kw.pop("exchange_kernels")
        # "unsorted": more (chunk, owner, network) bins than the header carries (here: any), so the rows travel
        # sorted by owner alone and the owners' local parts group them.
        limit = None
        if "max_network_bins" in kw:
            limit, sharded._MAX_NETWORK_BINS = sharded._MAX_NETWORK_BINS, kw.pop("max_network_bins")
        try:
            model = td.ShardedPart(factory(group_by_network=grouping), N_NETWORKS, config={"case": name}, **kw)
        finally:
            if limit is not None:
                sharded._MAX_NETWORK_BINS = limit
        res[f"{name}/fuses"] = model.fuses_loss()
        res[f"{name}/by_network"] = model._by_network
        for case, sizes in OWNER_LOSS_BATCHES.items():
            for otype in ("L2", "RelativeL2"):
                loss = Loss(otype)
                x, ids, t, _ = (v.to(dev) for v in batch(rank, 30, size=sizes[rank]))
                with _counting_calls(torch, "sort") as sorts:
                    _, at_owners, value = model.gradients_from_loss(x, ids, loss, t, need_dx=False)
                res[f"{name}/{case}/{otype}/sorts"] = sorts[0]
                y, ctx = model.forward_with_context(x, ids, train=True)
                _, forward, own = model.backward_from_loss(ctx, y, loss, t, need_dx=False)
                res[f"{name}/{case}/{otype}"] = {"at_owners": [g.clone() for g in at_owners],
                                                 "forward": [g.clone() for g in forward],
                                                 "value": float(value), "own": float(own)}
    runs = {}
    for fused in (True, False):
        model = td.ShardedPart(factory(), N_NETWORKS, config={"fused": fused})
        if not fused:
            model.fuses_loss = lambda need_dx=False: False  # the forward, the loss, then the backward
        trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
        losses = []
        for step in range(3):
            x, ids, t, _ = (v.to(dev) for v in batch(rank, 40 + step, size=BATCH if rank == 0 else 13))
            losses.append(float(trainer.training_step(x, t, ids)))
        runs[fused] = {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
    res["trainer"] = runs
    # Targets of the wrong width or batch, ids out of range or of the wrong batch: refused on every rank before any
    # collective (no rank waits; an id past the tables would be read out of bounds by the bucketing kernels).
    from tinn.errors import InputError
    model = td.ShardedPart(factory(), N_NETWORKS, config={"bad_targets": True})
    x, ids, t, _ = (v.to(dev) for v in batch(rank, 50))
    past = ids.clone()
    past[3] = N_NETWORKS
    for name, bad_t, bad_ids in (("bad_width", t[:, :2], ids), ("bad_batch", t[:-1], ids), ("bad_ids", t, past),
                                 ("short_ids", t, ids[:-1])):
        try:
            model.gradients_from_loss(x, bad_ids, Loss("L2"), bad_t, need_dx=False)
            res[name] = "no error"
        except InputError as e:
            res[name] = str(e)
    res["after_bad"] = float(model.gradients_from_loss(x, ids, Loss("L2"), t, need_dx=False)[2])
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


# Routing ahead (Trainer.training_steps): ShardedPart keywords per case, and each step's per-rank batch sizes
# (unequal, and one step with an empty batch on rank 1).
AHEAD_CASES = {"grouped": {"group_by_network": True, "assignment": UNEVEN, "exchange_kernels": "triton"},
               "chunks2": {"chunks": 2}}
AHEAD_SIZES = [(BATCH, 13), (7, BATCH), (BATCH, 0), (21, 30), (BATCH, BATCH)]


def scenario_route_ahead(rank, out):
    """Trainer steps through `training_steps` (each step routing the next batch ahead) against `training_step` per
    batch: the same losses and parameters, with an inference forward between two steps, and after leaving the
    loop early. Then ranks giving different numbers of batches raise together."""
    import tinn
    import tinn.distributed as td
    from tinn.distributed import buckets as B
    from tinn.errors import DistributedError
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    res = {}

    def batches(first=0, count=len(AHEAD_SIZES)):
        for step in range(first, first + count):
            x, ids, t, _ = (v.to(dev) for v in batch(rank, 60 + step, size=AHEAD_SIZES[step][rank]))
            yield x, t, ids

    probe_x, probe_ids, _, _ = (v.to(dev) for v in batch(rank, 90))
    for name, kw in AHEAD_CASES.items():
        kw = dict(kw)
        grouping = kw.pop("group_by_network", None)
        if kw.get("exchange_kernels") == "triton" and not B.use_triton("triton", dev):
            kw.pop("exchange_kernels")
        runs = {}
        for how in ("ahead", "one_by_one"):
            model = td.ShardedPart(factory(group_by_network=grouping), N_NETWORKS, config={"case": name, "how": how},
                                   **kw)
            trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
            losses, probes, taken = [], [], []

            def counted_take(*args, take=model._take_ahead, taken=taken):
                routed = take(*args)
                taken.append(routed is not None)
                return routed
            model._take_ahead = counted_take
            if how == "ahead":
                steps = trainer.training_steps(batches())
                for step, loss in enumerate(steps):
                    losses.append(float(loss))
                    if step == 1:  # a call of its own between two steps, while the next batch is routed
                        probes.append(model(probe_x, probe_ids).detach().clone())
                    if step == 3:
                        break  # the fifth batch stays untrained; the generator forgets what it routed ahead
                steps.close()
            else:
                for step, (x, t, ids) in enumerate(batches(count=4)):
                    losses.append(float(trainer.training_step(x, t, ids)))
                    if step == 1:
                        probes.append(model(probe_x, probe_ids).detach().clone())
            # After the loop: a plain step on the batch the early exit left, the same either way.
            x, t, ids = next(batches(first=4, count=1))
            losses.append(float(trainer.training_step(x, t, ids)))
            runs[how] = {"losses": losses, "probes": probes,
                         "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                         "held": model._ahead is not None, "taken": taken}
        res[name] = runs
    # Rank 0 gives three batches, rank 1 four: when rank 0's second step routes its last batch, its header says
    # that the step taking it routes nothing ahead, rank 1's that it does.
    model = td.ShardedPart(factory(), N_NETWORKS, config={"case": "lengths"})
    trainer = Trainer(model, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    try:
        for _ in trainer.training_steps(batches(count=3 if rank == 0 else 4)):
            pass
        res["lengths"] = "no error"
    except DistributedError as e:
        res["lengths"] = f"DistributedError: {e}"
    torch.save(_on_host(res), os.path.join(out, f"rank{rank}.pt"))


def scenario_shutdown(rank, out):
    """A sharded part still alive when the script leaves the process group: it holds no reference to torch's
    group (which would keep gloo's worker threads into interpreter shutdown), and says so once the group is gone."""
    import torch.distributed as dist

    import tinn.distributed as td
    from tinn.errors import ConfigError

    model = td.ShardedPart(factory(), N_NETWORKS)
    x, ids, _, _ = batch(rank, 0)
    autograd_pass(model, x, ids, 1.0)
    held = [name for name, value in vars(model).items() if isinstance(value, dist.ProcessGroup)]
    td.shutdown()
    try:
        model.group
        after = "no error"
    except ConfigError as e:
        after = f"ConfigError: {e}"
    torch.save({"held": held, "initialized": dist.is_initialized(), "after": after},
               os.path.join(out, f"rank{rank}.pt"))


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    import tinn
    import tinn.distributed as td

    arch = os.environ.get("TINN_ARCH", "cpu")
    td.init(arch, collective_timeout_s=float(os.environ.get("TIMEOUT_S", "30")))
    if arch == "cpu":
        torch.set_num_threads(1)
    rank = td.rank()
    try:
        globals()[f"scenario_{scenario}"](rank, out)
    except BaseException:
        with open(os.path.join(out, f"rank{rank}.error"), "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    td.shutdown()
    assert tinn.runtime.arch() == arch


if __name__ == "__main__":
    main()
