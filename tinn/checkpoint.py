"""Checkpoints without pickle: an .npz of raw arrays plus a JSON header.

Writes go to a temporary file in the target directory that is fsynced and then
renamed over the target, so a crash never leaves a half-written checkpoint.
Float arrays are stored byte for byte, so a reload is bit-exact.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any

import numpy as np
import torch

from .errors import CheckpointError

FORMAT = "tinn-checkpoint-v1"
_HEADER = "__header__"


def _split(prefix: str, state: dict[str, Any], arrays: dict, scalars: dict) -> None:
    for key, value in state.items():
        name = f"{prefix}/{key}"
        if isinstance(value, torch.Tensor):
            arrays[name] = value.detach().cpu().contiguous().numpy()
        elif isinstance(value, (bool, int, float, str)) or value is None:
            scalars[name] = value
        else:
            raise CheckpointError(f"state entry {name!r} has type {type(value).__name__}; allowed: tensor, number, "
                                  "string, bool")


def save(path: str | os.PathLike, sections: dict[str, dict[str, Any]], metadata: dict | None = None) -> None:
    """Atomically write `sections` ({"model": state_dict, "optimizer": state_dict, ...})."""
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, Any] = {}
    for prefix, state in sections.items():
        _split(prefix, state, arrays, scalars)
    header = {"format": FORMAT, "scalars": scalars, "metadata": metadata or {}}
    arrays[_HEADER] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".tinn", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def load(path: str | os.PathLike) -> tuple[dict[str, dict[str, Any]], dict]:
    """Read a checkpoint: ({section: state_dict}, metadata). Tensors come back on the CPU."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable tinn checkpoint ({e})") from None
    if _HEADER not in arrays:
        raise CheckpointError(f"{path}: missing header; not a tinn checkpoint")
    header = json.loads(arrays.pop(_HEADER).tobytes().decode("utf-8"))
    if header.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {header.get('format')!r}; allowed: {FORMAT!r}")
    sections: dict[str, dict[str, Any]] = {}
    for name, arr in arrays.items():
        prefix, key = name.split("/", 1)
        sections.setdefault(prefix, {})[key] = torch.from_numpy(arr.copy())
    for name, value in header["scalars"].items():
        prefix, key = name.split("/", 1)
        sections.setdefault(prefix, {})[key] = value
    return sections, header.get("metadata", {})


def load_module_state(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy a state dict into a module, with errors that name the mismatching entry."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{source}: parameters do not match the model (missing {missing}, unexpected {unexpected})")
    for key, value in state.items():
        if tuple(value.shape) != tuple(own[key].shape) or value.dtype != own[key].dtype:
            raise CheckpointError(f"{source}: {key} is {tuple(value.shape)} {value.dtype}, model has "
                                  f"{tuple(own[key].shape)} {own[key].dtype}")
    with torch.no_grad():
        for key, value in state.items():
            own[key].copy_(value)
