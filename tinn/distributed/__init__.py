"""Scenes bigger than one GPU: network arrays sharded over GPUs with torch.distributed.

    torchrun --nproc_per_node 2 train.py

    import tinn, tinn.distributed as td
    td.init()                                    # before anything touches CUDA: pins the rank's GPU
    model = td.ShardedPart(lambda n: tinn.NetworkWithInputEncoding(3, 4, enc, net, n_networks=n), 4096)
    trainer = tinn.Trainer(model, optimizer={"otype": "Adam"})
    trainer.training_step(x, target, ids)        # every rank: its own batch, ids over all 4096 networks
    for loss in trainer.training_steps(batches): # the same, each step routing the next batch while it computes
        ...
    td.save_checkpoint(trainer, "ckpt/")         # one file per rank + manifest.json

One process per GPU; Taichi uses device 0 of the devices a process sees, so `init()` narrows
CUDA_VISIBLE_DEVICES to the rank's GPU (LOCAL_RANK) before Taichi or torch initialise CUDA. Modules:
process.py (the process group, timeouts, errors), ownership.py (who owns which network),
exchange.py (samples to owners and back), route_ahead.py (the next step's batch routed while a step computes),
sharded.py (ShardedPart, Replicated), optimizer_split.py (a
Replicated part's optimizer split over the ranks), checkpoint.py, strategy.py (shard or replicate:
`choose_strategy`).
Kernel modules are imported only when a sharded part is built, so `init()` can still pin the GPU.
"""
from .checkpoint import gather_model, gather_state, load_checkpoint, read_manifest, reshard_state, save_checkpoint
from .ownership import Ownership
from .process import init, rank, shutdown, start_script, world_size
from .profile import PhaseTimer
from .strategy import choose_strategy, exchange_bytes_per_sample


def __getattr__(attr):
    if attr in ("ShardedPart", "Replicated", "ids_of_rank"):
        from . import sharded
        return getattr(sharded, attr)
    raise AttributeError(f"module 'tinn.distributed' has no attribute {attr!r}")


__all__ = ["init", "shutdown", "rank", "world_size", "Ownership", "ShardedPart", "Replicated", "ids_of_rank",
           "PhaseTimer", "save_checkpoint", "load_checkpoint", "gather_model", "gather_state", "reshard_state",
           "read_manifest", "choose_strategy", "exchange_bytes_per_sample"]
