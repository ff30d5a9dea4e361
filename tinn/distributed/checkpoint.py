"""Checkpoints of sharded trainers: one tinn checkpoint file per rank plus a manifest.

    directory/
        rank-00000.tinn ...   tinn/checkpoint.py's format (model, optimizer, trainer sections) of each rank
        manifest.json         format, world size, ownership, n_networks, the model description and config,
                              the step, and each file's name, size and sha256

`save_checkpoint(trainer, directory)` writes every rank's file (atomically), then rank 0 writes the
manifest (atomically, last: a directory whose manifest is missing or lists other checksums is an
interrupted save). `load_checkpoint(trainer, directory)` resumes on the same world size and
ownership: every rank checks its file and the manifest, the ranks agree that all checks passed, and
only then does any rank copy anything. Another world size is a CheckpointError that says how to
go on: relaunch with the saved world size, or `gather_model` and shard it again (`reshard_state`).
`gather_model(directory, part_factory)` builds the unsharded model in one process (for inference)
from the files, without a process group.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch

from .. import checkpoint as checkpoint_files
from ..errors import CheckpointError
from .ownership import Ownership
from .process import all_gather_objects, collective

MANIFEST = "manifest.json"
FORMAT = "tinn-sharded-checkpoint-v1"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.tinn"


def _sha256(path: str) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sharded_part(trainer):
    from .sharded import ShardedPart

    model = trainer.model
    if not isinstance(model, ShardedPart):
        raise CheckpointError(f"sharded checkpoints need a trainer of a ShardedPart, got {type(model).__name__}; "
                              "use trainer.save_checkpoint for an unsharded model")
    return model


def save_checkpoint(trainer, directory: str | os.PathLike) -> dict:
    """Every rank writes its file; rank 0 writes the manifest after all files are complete. Returns the manifest."""
    model = _sharded_part(trainer)
    directory = os.fspath(directory)
    if model.rank == 0:
        os.makedirs(directory, exist_ok=True)
    with collective("the checkpoint barrier", model.group):
        torch.distributed.barrier(group=model.group)
    os.makedirs(directory, exist_ok=True)  # a rank on another host with its own file system
    path = os.path.join(directory, rank_file(model.rank))
    scaling = getattr(trainer, "gradient_scaling_state", dict)()   # this rank's float16 scalers, if any
    checkpoint_files.save(path, {"model": model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                                 "trainer": {"step": trainer.step, **scaling}},
                          metadata={"config": trainer.config, "rank": model.rank, "shard": model.description()})
    digest, size = _sha256(path)
    files = all_gather_objects({"rank": model.rank, "file": rank_file(model.rank), "sha256": digest, "bytes": size},
                               "the checkpoint's checksum exchange", model.group)
    manifest = {"format": FORMAT, "world_size": model.world_size, "n_networks": model.n_networks,
                "ownership": model.ownership.describe(), "model": model.description(),
                "sharded_keys": [f"local.{n}" for n in model.sharded_names], "config": trainer.config,
                "step": trainer.step, "files": files}
    if model.rank == 0:
        _write_json_atomic(os.path.join(directory, MANIFEST), manifest)
    with collective("the checkpoint barrier", model.group):
        torch.distributed.barrier(group=model.group)
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict:
    path = os.path.join(os.fspath(directory), MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the manifest ({e.strerror or e}); an interrupted save leaves "
                              "none") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: the manifest is not valid JSON ({e.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {manifest.get('format') if isinstance(manifest, dict) else None!r}; "
                              f"allowed: {FORMAT!r}")
    needed = ("world_size", "n_networks", "ownership", "model", "sharded_keys", "files")
    missing = [k for k in needed if k not in manifest]
    if missing:
        raise CheckpointError(f"{path}: the manifest lacks {missing}")
    if len(manifest["files"]) != manifest["world_size"]:
        raise CheckpointError(f"{path}: {len(manifest['files'])} files listed for world size {manifest['world_size']}")
    return manifest


def _read_rank(directory: str, manifest: dict, r: int) -> tuple[dict, dict]:
    entry = manifest["files"][r]
    path = os.path.join(directory, entry["file"])
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: missing (the manifest lists it for rank {r})")
    digest, size = _sha256(path)
    if digest != entry["sha256"] or size != entry["bytes"]:
        raise CheckpointError(f"{path}: sha256/size differ from the manifest (the file was changed or replaced "
                              "after the checkpoint was saved)")
    return checkpoint_files.load(path)


def _check_rank(trainer, model, directory: str, manifest: dict, strict_config: bool):
    """Everything a resume checks on this rank; returns the sections to copy (nothing copied yet)."""
    if manifest["world_size"] != model.world_size:
        raise CheckpointError(
            f"{directory}: saved by {manifest['world_size']} ranks, resumed on {model.world_size}; a sharded "
            f"checkpoint resumes on its world size: relaunch with torchrun --nproc_per_node "
            f"{manifest['world_size']} (or, for another size, gather_model() it and shard the weights again "
            "with reshard_state())")
    if manifest["ownership"] != model.ownership.describe() or manifest["n_networks"] != model.n_networks:
        raise CheckpointError(f"{directory}: saved with n_networks={manifest['n_networks']} and ownership "
                              f"{manifest['ownership']}, this model has {model.n_networks} and "
                              f"{model.ownership.describe()}")
    if strict_config and trainer.config:
        diffs = checkpoint_files.config_differences(manifest.get("config", {}), trainer.config)
        if diffs:
            raise CheckpointError(f"{directory}: saved with another config: {'; '.join(diffs[:8])}. Pass "
                                  "strict_config=False to load it anyway")
    sections, metadata = _read_rank(directory, manifest, model.rank)
    source = os.path.join(directory, rank_file(model.rank))
    if metadata.get("rank") != model.rank:
        raise CheckpointError(f"{source}: written by rank {metadata.get('rank')}, read by rank {model.rank}")
    missing = [s for s in checkpoint_files.SECTIONS if s not in sections]
    if missing:
        raise CheckpointError(f"{source}: sections {sorted(sections)}; missing {missing}")
    checkpoint_files.check_module_state(model, sections["model"], source)
    try:
        trainer.optimizer.check_state_dict(sections["optimizer"])
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    step, _ = checkpoint_files._trainer_state(sections["trainer"], source)   # (the gradient scaling state checked too)
    if step != manifest.get("step"):
        raise CheckpointError(f"{source}: step {step}, the manifest says {manifest.get('step')}")
    return sections


def load_checkpoint(trainer, directory: str | os.PathLike, strict_config: bool = True) -> dict:
    """Resume every rank from `directory`, all or nothing across the ranks. Returns the manifest."""
    model = _sharded_part(trainer)
    directory = os.fspath(directory)
    try:
        manifest = read_manifest(directory)
        sections, error = _check_rank(trainer, model, directory, manifest, strict_config), None
    except CheckpointError as e:
        sections, error = None, str(e)
    errors = all_gather_objects(error, "the checkpoint check", model.group)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        text = "; ".join(f"rank {r}: {e}" for r, e in failed[:4])
        raise CheckpointError(f"nothing was loaded on any rank: {text}")
    checkpoint_files.load_module_state(model, sections["model"], directory)
    trainer.optimizer.load_state_dict(sections["optimizer"])
    trainer.step = sections["trainer"]["step"]
    load_scaling = getattr(trainer, "load_gradient_scaling", None)
    if load_scaling is not None:
        load_scaling(checkpoint_files._trainer_state(sections["trainer"], directory)[1])
    return manifest


def gather_state(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """The unsharded model's state dict (keys of the local part, every network in global id order), read
    from all files in one process; and the manifest."""
    directory = os.fspath(directory)
    manifest = read_manifest(directory)
    ownership = Ownership.from_description(manifest["ownership"])
    sharded = set(manifest["sharded_keys"])
    full: dict[str, torch.Tensor] = {}
    for r in range(manifest["world_size"]):
        sections, _ = _read_rank(directory, manifest, r)
        rows = torch.tensor(ownership.owned(r), dtype=torch.long)
        for key, value in sections["model"].items():
            name = key[len("local."):] if key.startswith("local.") else key
            if key in sharded:
                if name not in full:
                    full[name] = torch.empty((manifest["n_networks"], *value.shape[1:]), dtype=value.dtype)
                full[name][rows] = value
            elif r == 0:
                full[name] = value
    return full, manifest


def gather_model(directory: str | os.PathLike, part_factory):
    """The unsharded model (`part_factory(n_networks)`) holding the checkpoint's weights, for inference in one
    process (every table must fit one device). Returns the part."""
    state, manifest = gather_state(directory)
    part = part_factory(manifest["n_networks"])
    checkpoint_files.load_module_state(part, state, os.fspath(directory))
    return part


def reshard_state(full_state: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """This rank's share of an unsharded state dict (as gather_state returns it) for `model`, a ShardedPart of any
    world size: load it with `model.load_state_dict(...)` (optimizer state starts afresh)."""
    rows = torch.tensor(model.owned, dtype=torch.long)
    sharded = set(model.sharded_names)
    return {f"local.{k}": (v[rows] if k in sharded else v) for k, v in full_state.items()}
