"""Checkpoints: no pickle, checksummed, written atomically, restored all-or-nothing.

A checkpoint is a safetensors file (any safetensors reader can open its tensors):

    8 bytes    N, little-endian uint64
    N bytes    JSON header, UTF-8, space-padded to a multiple of 8:
               {"<section>/<key>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
                "__metadata__": {"format": FORMAT, "tinn": "<JSON text>", "sha256": "<hex>"}}
    payload    every tensor's raw little-endian bytes, back to back

Sections are state dicts ("model", "optimizer", "trainer"); their non-tensor entries (step counts,
learning rates, optimizer types) and the caller's metadata (the trainer's config) travel in the
"tinn" JSON text. "sha256" covers the header (canonical JSON, without the checksum itself) and the
payload, so a truncated or bit-flipped file is refused before any of it is interpreted. Floats are
stored byte for byte, so a reload is bit-exact.

The safetensors library is not needed for this: the container is a length, a JSON object and raw
bytes, and the checksum and the scalar state need a header parser of our own anyway.

Files of the first format (FORMAT_V1: an .npz of .npy arrays plus a JSON header, no checksum) still
load through `_decode_v1`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import tempfile
from typing import Any

import numpy as np
import torch

from .errors import CheckpointError

FORMAT = "tinn-checkpoint-v2"
FORMAT_V1 = "tinn-checkpoint-v1"
SECTIONS = ("model", "optimizer", "trainer")

# torch dtype <-> safetensors dtype name.
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
_SCALAR_TYPES = (bool, int, float, str, type(None))
_V1_HEADER = "__header__"
_ZIP_MAGIC = b"PK\x03\x04"
_TMP_TAG = ".tmp-"
_in_flight: set[str] = set()  # temporary files this process is writing right now


# ---- writing -----------------------------------------------------------------------------------
def _split(sections: dict[str, dict[str, Any]]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, scalars = {}, {}
    for prefix, state in sections.items():
        for key, value in state.items():
            name = f"{prefix}/{key}"
            if isinstance(value, torch.Tensor):
                if value.dtype not in _DTYPES:
                    raise CheckpointError(f"state entry {name!r} has dtype {value.dtype}; allowed: "
                                          f"{[str(d) for d in _DTYPES]}")
                tensors[name] = value.detach().cpu().contiguous()
            elif isinstance(value, _SCALAR_TYPES):
                scalars[name] = value
            else:
                raise CheckpointError(f"state entry {name!r} has type {type(value).__name__}; allowed: tensor, "
                                      "number, string, bool")
    return tensors, scalars


def _digest(entries: dict, meta: dict, payload: bytes | memoryview) -> str:
    """sha256 of the canonical header (tensor entries + metadata without the checksum) and the payload."""
    canonical = json.dumps({**entries, "__metadata__": meta}, sort_keys=True, separators=(",", ":"))
    h = hashlib.sha256(canonical.encode("utf-8"))
    h.update(payload)
    return h.hexdigest()


def encode(sections: dict[str, dict[str, Any]], metadata: dict | None = None) -> bytes:
    """The bytes of a checkpoint holding `sections` ({"model": state_dict, ...}) and `metadata`."""
    tensors, scalars = _split(sections)
    try:
        tinn_text = json.dumps({"scalars": scalars, "metadata": metadata or {}}, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint metadata must be JSON data (dicts, lists, numbers, strings): {e}") from None
    # Widest elements first, as safetensors writers do: every tensor then starts aligned to its element size.
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    entries, chunks, offset = {}, [], 0
    for name in order:
        t = tensors[name]
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        entries[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    payload = b"".join(chunks)
    meta = {"format": FORMAT, "tinn": tinn_text}
    meta["sha256"] = _digest(entries, meta, payload)
    text = json.dumps({**entries, "__metadata__": meta}, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + payload


def _tmp_prefix(path: str) -> str:
    """Temporary files of `path` are `.<name>.tmp-<pid>-<random>` beside it (the pid tells stale ones)."""
    return f".{os.path.basename(path)}{_TMP_TAG}"


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # no cheap, harmless liveness probe: treat every writer as alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Delete temporary files that a killed save of `path` left behind (their writer is gone); returns them.

    A temporary file whose writing process still runs (another process saving the same target right
    now, or a save in flight in this one) is kept."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    prefix = _tmp_prefix(path)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        full = os.path.join(directory, name)
        pid = int(pid_text)
        stale = full not in _in_flight if pid == os.getpid() else not _pid_alive(pid)
        if stale:
            try:
                os.unlink(full)
                removed.append(full)
            except OSError:
                pass
    return removed


def save(path: str | os.PathLike, sections: dict[str, dict[str, Any]], metadata: dict | None = None) -> None:
    """Atomically write `sections` ({"model": state_dict, "optimizer": state_dict, ...}) and `metadata`.

    The bytes go to a temporary file beside the target, are fsynced, then renamed over it: a crash
    leaves either the old checkpoint or the new one, never a mix.

    Args:
        path: the checkpoint file.
        sections: {section name: state dict}; values are tensors, numbers, strings, or lists and dicts
            of them.
        metadata: JSON data stored beside the tensors (the trainer stores its config).

    Raises:
        CheckpointError: an entry of a type or dtype a checkpoint cannot hold, or metadata that is not JSON.
        OSError: the file cannot be written.
    """
    data = encode(sections, metadata)
    path = os.fspath(path)
    remove_stale_temps(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f"{_tmp_prefix(path)}{os.getpid()}-", dir=directory)
    _in_flight.add(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        _in_flight.discard(tmp)
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


# ---- reading -----------------------------------------------------------------------------------
def load(path: str | os.PathLike) -> tuple[dict[str, dict[str, Any]], dict]:
    """Read a checkpoint. Tensors come back on the CPU.

    Args:
        path: a file written by `save` (or in the first, .npz-based format).

    Returns:
        ({section: state dict}, metadata).

    Raises:
        CheckpointError: the file cannot be read, is a pickle, is truncated or corrupted (checksum), or is
            not a tinn checkpoint; the message names the problem.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"{source}: cannot read the checkpoint ({e.strerror or e})") from None
    return decode(data, source)


def decode(data: bytes, source: str = "<bytes>") -> tuple[dict[str, dict[str, Any]], dict]:
    """`load` on bytes already read."""
    if data.startswith(_ZIP_MAGIC):
        return _decode_v1(data, source)
    if data[:1] == b"\x80":
        raise CheckpointError(f"{source}: a Python pickle, not a tinn checkpoint; pickle payloads are refused "
                              "(they can run code on load)")
    if len(data) < 9:
        raise CheckpointError(f"{source}: {len(data)} bytes, too short for a checkpoint (truncated?)")
    if data[8:9] != b"{":  # a safetensors header is a JSON object
        raise CheckpointError(f"{source}: not a tinn checkpoint (neither a safetensors file nor a {FORMAT_V1} "
                              f"archive; it starts with {data[:12]!r})")
    return _decode_v2(data, source)


def _decode_v2(data: bytes, source: str):
    n = struct.unpack("<Q", data[:8])[0]
    if n > len(data) - 8:
        raise CheckpointError(f"{source}: the header claims {n} bytes but the file has {len(data) - 8} after the "
                              "length field (truncated, or not a tinn checkpoint)")
    try:
        text = data[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{source}: the header is not UTF-8 (byte {e.start}): corrupt or not a tinn "
                              "checkpoint") from None
    try:
        header = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{source}: the header is not valid JSON ({e.msg} at column {e.colno}): corrupt or not "
                              "a tinn checkpoint") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{source}: the header is a JSON {type(header).__name__}; expected an object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{source}: the header has no __metadata__ object: not a tinn checkpoint")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{source}: format {meta.get('format')!r}; allowed: {FORMAT!r} (or {FORMAT_V1!r})")
    meta = dict(meta)
    stored = meta.pop("sha256", None)
    payload = memoryview(data)[8 + n:]
    if not isinstance(stored, str) or stored != _digest(header, meta, payload):
        raise CheckpointError(f"{source}: checksum mismatch: the file is corrupt (truncated or altered after it was "
                              "written)")
    extra = sorted(set(meta) - {"format", "tinn"})
    if extra:
        raise CheckpointError(f"{source}: unknown __metadata__ keys {extra}; allowed: ['format', 'sha256', 'tinn']")
    try:
        tinn = json.loads(meta.get("tinn"))
    except (TypeError, json.JSONDecodeError):
        raise CheckpointError(f"{source}: __metadata__.tinn must be JSON text") from None
    if not isinstance(tinn, dict) or set(tinn) != {"scalars", "metadata"}:
        raise CheckpointError(f"{source}: __metadata__.tinn must be an object with 'scalars' and 'metadata'")
    tensors = {name: _tensor_v2(name, entry, payload, source) for name, entry in header.items()}
    _check_coverage(header, len(payload), source)
    return _assemble(tensors, tinn["scalars"], tinn["metadata"], source)


def _tensor_v2(name: str, entry, payload: memoryview, source: str) -> torch.Tensor:
    where = f"{source}: tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(f"{where} must be an object with exactly 'dtype', 'shape' and 'data_offsets'")
    dtype = _TORCH_DTYPES.get(entry["dtype"])
    if dtype is None:
        raise CheckpointError(f"{where} has dtype {entry['dtype']!r}; allowed: {sorted(_TORCH_DTYPES)}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{where} has shape {shape!r}; expected a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1] <= len(payload)):
        raise CheckpointError(f"{where} has data_offsets {offsets!r}; expected [begin, end] within the "
                              f"{len(payload)}-byte payload")
    numel = math.prod(shape)
    size = numel * torch.empty((), dtype=dtype).element_size()
    if offsets[1] - offsets[0] != size:
        raise CheckpointError(f"{where}: shape {shape} {entry['dtype']} needs {size} bytes, data_offsets give "
                              f"{offsets[1] - offsets[0]}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    raw = bytearray(payload[offsets[0]:offsets[1]])
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def _check_coverage(header: dict, payload_size: int, source: str) -> None:
    """safetensors' rule: the tensors tile the payload exactly (no gaps, no overlaps, nothing after)."""
    end = 0
    for begin, stop in sorted(tuple(e["data_offsets"]) for e in header.values()):
        if begin != end:
            raise CheckpointError(f"{source}: tensor data overlaps or leaves a gap at byte {min(begin, end)}")
        end = stop
    if end != payload_size:
        raise CheckpointError(f"{source}: {payload_size - end} bytes after the last tensor")


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _assemble(tensors: dict, scalars, metadata, source: str) -> tuple[dict[str, dict[str, Any]], dict]:
    if not isinstance(scalars, dict) or not isinstance(metadata, dict):
        raise CheckpointError(f"{source}: scalars and metadata must be JSON objects")
    sections: dict[str, dict[str, Any]] = {}
    for name, value in [*tensors.items(), *scalars.items()]:
        prefix, sep, key = name.partition("/")
        if not sep or not prefix or not key:
            raise CheckpointError(f"{source}: entry name {name!r} is not '<section>/<key>'")
        if not isinstance(value, (torch.Tensor, *_SCALAR_TYPES)):
            raise CheckpointError(f"{source}: entry {name!r} is a JSON {type(value).__name__}; allowed: number, "
                                  "string, bool, null")
        if key in sections.setdefault(prefix, {}):
            raise CheckpointError(f"{source}: entry {name!r} appears twice")
        sections[prefix][key] = value
    return sections, metadata


# numpy dtypes a v1 file may hold (native little-endian, as the v1 writer produced them).
_V1_DTYPES = {np.dtype(t) for t in ("<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "i1", "u1", "?")}


def _decode_v1(data: bytes, source: str):
    import io
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = z.namelist()
            if any(n.endswith(".pkl") for n in names):
                raise CheckpointError(f"{source}: a torch.save archive (pickle), not a tinn checkpoint; pickle "
                                      "payloads are refused (they can run code on load)")
            bad = [n for n in names if not n.endswith(".npy")]
            if bad:
                raise CheckpointError(f"{source}: unexpected members {bad[:4]} in a {FORMAT_V1} archive")
        arrays = {}
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            for k in npz.files:
                arrays[k] = npz[k]
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 -- zipfile/numpy raise many types on damaged input; all mean "corrupt"
        text = "object arrays need pickle, which is refused" if "allow_pickle" in str(e) else f"{type(e).__name__}: {e}"
        raise CheckpointError(f"{source}: not a readable {FORMAT_V1} checkpoint ({text})") from None
    if _V1_HEADER not in arrays:
        raise CheckpointError(f"{source}: missing header ({_V1_HEADER}); not a tinn checkpoint")
    head = arrays.pop(_V1_HEADER)
    try:
        if head.dtype != np.uint8 or head.ndim != 1:
            raise ValueError(f"dtype {head.dtype}, {head.ndim} dims")
        header = json.loads(head.tobytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{source}: the header is not UTF-8 JSON bytes ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_V1:
        fmt = header.get("format") if isinstance(header, dict) else None
        raise CheckpointError(f"{source}: format {fmt!r}; allowed: {FORMAT!r} or {FORMAT_V1!r}")
    tensors = {}
    for name, arr in arrays.items():
        if arr.dtype not in _V1_DTYPES:
            raise CheckpointError(f"{source}: array {name!r} has dtype {arr.dtype}; allowed: "
                                  f"{sorted(str(d) for d in _V1_DTYPES)}")
        tensors[name] = torch.from_numpy(np.ascontiguousarray(arr).copy())
    return _assemble(tensors, header.get("scalars"), header.get("metadata", {}), source)


# ---- restoring into a model / trainer ---------------------------------------------------------
def module_state_mismatch(module: torch.nn.Module, state: dict[str, Any]) -> str | None:
    """What keeps `state` from loading into `module` (entries missing or unexpected, another shape or
    dtype), or None when it has exactly the module's entries with their shapes and dtypes."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        return f"parameters do not match the model (missing {missing}, unexpected {unexpected})"
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            return f"{key} is {value!r}; the model has a tensor"
        if tuple(value.shape) != tuple(own[key].shape) or value.dtype != own[key].dtype:
            return f"{key} is {tuple(value.shape)} {value.dtype}, model has {tuple(own[key].shape)} {own[key].dtype}"
    return None


def check_module_state(module: torch.nn.Module, state: dict[str, Any], source: str) -> None:
    """Raise unless `state` has exactly the module's entries with its shapes and dtypes."""
    problem = module_state_mismatch(module, state)
    if problem is not None:
        raise CheckpointError(f"{source}: {problem}")


def load_module_state(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy a state dict into a module, with errors that name the mismatching entry (nothing copied then)."""
    check_module_state(module, state, source)
    own = module.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            own[key].copy_(value)


def config_differences(saved, current, path: str = "") -> list[str]:
    """Key paths where two JSON configs differ, with both values ("network.activation: 'ReLU' in the
    checkpoint, 'Tanh' here")."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in current:
                out.append(f"{sub}: {saved[key]!r} in the checkpoint, absent here")
            elif key not in saved:
                out.append(f"{sub}: absent in the checkpoint, {current[key]!r} here")
            else:
                out.extend(config_differences(saved[key], current[key], sub))
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [d for i, (a, b) in enumerate(zip(saved, current)) for d in config_differences(a, b, f"{path}[{i}]")]
    if saved == current and isinstance(saved, bool) == isinstance(current, bool):
        return []
    return [f"{path or '<config>'}: {saved!r} in the checkpoint, {current!r} here"]


def _trainer_state(state: dict, source: str) -> tuple[int, dict | None]:
    """(step, gradient scaling state or None): the trainer section holds "step" and, for a model with float16
    networks, "skipped_steps" and each scaler's state as "gradient_scaler.<i>.<key>"."""
    from .gradient_scaling import GradientScaler

    if "step" not in state:
        raise CheckpointError(f"{source}: the trainer section has keys {sorted(state)}; expected 'step' among them")
    step = state["step"]
    if not _is_count(step):
        raise CheckpointError(f"{source}: trainer step is {step!r}; expected an integer >= 0")
    rest = {k: v for k, v in state.items() if k != "step"}
    if not rest:
        return step, None
    scalers: dict[int, dict] = {}
    for key, value in rest.items():
        head, _, tail = key.partition(".")
        index, _, name = tail.partition(".")
        if head == "gradient_scaler" and index.isdigit() and name:
            scalers.setdefault(int(index), {})[name] = value
        elif key != "skipped_steps":
            raise CheckpointError(f"{source}: the trainer section has keys {sorted(state)}; allowed: 'step', "
                                  "'skipped_steps', 'gradient_scaler.<i>.<key>'")
    skipped = rest.get("skipped_steps")
    if not (isinstance(skipped, torch.Tensor) and skipped.dtype == torch.int32 and skipped.numel() == 1):
        raise CheckpointError(f"{source}: trainer skipped_steps is {skipped!r}; expected one int32 value")
    if sorted(scalers) != list(range(len(scalers))):
        raise CheckpointError(f"{source}: gradient scalers {sorted(scalers)}; expected 0 .. {len(scalers) - 1}")
    try:
        for i in range(len(scalers)):
            GradientScaler.check_state_dict(scalers[i])
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return step, {"skipped_steps": skipped, "scalers": [scalers[i] for i in range(len(scalers))]}


def restore_trainer(trainer, path: str | os.PathLike, strict_config: bool = True) -> dict:
    """Load a checkpoint into `trainer` (its model, optimizer and step), all or nothing.

    The whole file is checked first: its integrity, its sections (exactly model, optimizer and trainer),
    every parameter and optimizer state entry against the live ones (names, shapes, dtypes, optimizer
    types), and, with `strict_config`, the config it was saved with against `trainer.config` (a config
    of the same shapes but e.g. another activation would load silently wrong weights). Only then is
    anything copied, so after any CheckpointError the trainer is exactly as before.

    Args:
        trainer: a `tinn.Trainer` (or an object with `model`, `optimizer`, `step` and `config`).
        path: the checkpoint file.
        strict_config: compare the saved config with `trainer.config` first.

    Returns:
        The checkpoint's metadata.

    Raises:
        CheckpointError: an unreadable or corrupt file, missing or unexpected sections, another config
            (when strict), or parameters and optimizer state that do not match the trainer's.
    """
    source = os.fspath(path)
    remove_stale_temps(source)
    sections, metadata = load(source)
    missing = [s for s in SECTIONS if s not in sections]
    unexpected = sorted(set(sections) - set(SECTIONS))
    if missing or unexpected:
        raise CheckpointError(f"{source}: sections {sorted(sections)}; expected {list(SECTIONS)} (missing {missing}, "
                              f"unexpected {unexpected})")
    if strict_config and trainer.config:  # first: it explains shape mismatches too
        diffs = config_differences(metadata.get("config", {}), trainer.config)
        if diffs:
            more = f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""
            # Say up front whether strict_config=False can help: not when the tables differ too.
            problem = module_state_mismatch(trainer.model, sections["model"])
            advice = ("Pass strict_config=False to load it anyway" if problem is None else
                      f"Its parameters differ in shape too ({problem}), so strict_config=False cannot load it "
                      "either: build the model with the checkpoint's config")
            raise CheckpointError(f"{source}: saved with another config: {'; '.join(diffs[:8])}{more}. {advice}")
    check_module_state(trainer.model, sections["model"], source)
    try:
        trainer.optimizer.check_state_dict(sections["optimizer"])
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    step, scaling = _trainer_state(sections["trainer"], source)
    # Everything matches: the copies below cannot fail half-way.
    load_module_state(trainer.model, sections["model"], source)
    trainer.optimizer.load_state_dict(sections["optimizer"])
    trainer.step = step
    load_scaling = getattr(trainer, "load_gradient_scaling", None)
    if load_scaling is not None:
        load_scaling(scaling)
    return metadata
