"""Malformed checkpoints: every damaged or foreign file raises CheckpointError naming the problem, and a
failed load leaves the trainer exactly as it was. Includes a seeded fuzz of truncations and bit flips."""
import io
import json
import os
import pickle
import random
import struct
import time
import zipfile

import numpy as np
import pytest
import torch

import tinn
from tinn import checkpoint
from tinn.errors import CheckpointError
from tinn.trainer import Trainer

CONFIG = {
    "loss": {"otype": "L2"},
    "optimizer": {"otype": "Adam", "learning_rate": 1e-2},
    "encoding": {"otype": "Frequency", "n_frequencies": 2},
    "network": {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU"},
}


def trained(seed=0, steps=3):
    trainer = Trainer.from_config(CONFIG, 2, 2, n_networks=2, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        dev = tinn.runtime.device()
        x = torch.rand(128, 2, generator=gen).to(dev)
        ids = torch.randint(0, 2, (128,), generator=gen, dtype=torch.int32).to(dev)
        trainer.training_step(x, torch.sin(4 * x), ids)
    return trainer


def snapshot(trainer):
    """Everything a load may change, cloned (tensors) or copied (scalars)."""
    model = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    opt = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in trainer.optimizer.state_dict().items()}
    return model, opt, trainer.step


def same(a, b):
    (ma, oa, sa), (mb, ob, sb) = a, b
    if sa != sb or ma.keys() != mb.keys() or oa.keys() != ob.keys():
        return False
    tensors_equal = all(torch.equal(ma[k], mb[k]) for k in ma)
    opt_equal = all(torch.equal(oa[k], ob[k]) if isinstance(oa[k], torch.Tensor) else oa[k] == ob[k] for k in oa)
    return tensors_equal and opt_equal


@pytest.fixture(scope="module")
def source():
    trainer = trained(seed=0)
    data = checkpoint.encode({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                              "trainer": {"step": trainer.step}}, metadata={"config": trainer.config})
    return data, snapshot(trainer)


def test_fuzz_truncations_and_bit_flips(tmp_path, source):
    data, saved_state = source
    target = trained(seed=7, steps=1)  # another state: a load that slips through would show
    before = snapshot(target)
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    rng = random.Random(20261123)
    cases = [("truncate", n) for n in (0, 1, 7, 8, 9, header_end - 1, header_end, header_end + 1, len(data) - 1)]
    cases += [("truncate", rng.randrange(len(data))) for _ in range(60)]
    cases += [("flip", rng.randrange(header_end), rng.randrange(8)) for _ in range(80)]  # the header
    cases += [("flip", rng.randrange(len(data)), rng.randrange(8)) for _ in range(120)]  # anywhere
    cases += [("garble", rng.randrange(len(data) - 16), rng.randrange(1, 16)) for _ in range(20)]
    path = tmp_path / "fuzz.tinn"
    counts = {"refused": 0, "loaded": 0}
    start = time.perf_counter()
    for case in cases:
        corrupt = bytearray(data)
        if case[0] == "truncate":
            corrupt = corrupt[:case[1]]
        elif case[0] == "flip":
            corrupt[case[1]] ^= 1 << case[2]
        else:
            pos, n = case[1], case[2]
            corrupt[pos:pos + n] = bytes(rng.randrange(256) for _ in range(n))
            if corrupt == data:
                continue
        path.write_bytes(bytes(corrupt))
        try:
            target.load_checkpoint(path)
        except CheckpointError:
            counts["refused"] += 1
            assert same(snapshot(target), before), case  # all or nothing
            continue
        counts["loaded"] += 1
        assert same(snapshot(target), saved_state), case  # only the exact saved state may come through
        target = trained(seed=7, steps=1)
    elapsed = time.perf_counter() - start
    assert len(cases) >= 280
    # The sha256 over header and payload catches every one of them.
    assert counts["loaded"] == 0, counts
    assert elapsed < 20, elapsed
    # The undamaged bytes load, bit-exactly.
    path.write_bytes(data)
    target.load_checkpoint(path)
    assert same(snapshot(target), saved_state)


def _v2(entries: dict, meta: dict, payload: bytes = b"", checksum=True) -> bytes:
    """A hand-made v2 file (for malformations the writer never produces)."""
    meta = dict(meta)
    if checksum:
        meta["sha256"] = checkpoint._digest(entries, meta, payload)
    text = json.dumps({**entries, "__metadata__": meta}).encode()
    return struct.pack("<Q", len(text)) + text + payload


def _tinn_meta(scalars=None, metadata=None):
    return {"format": checkpoint.FORMAT, "tinn": json.dumps({"scalars": scalars or {}, "metadata": metadata or {}})}


def _zip(members: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    return buf.getvalue()


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _v1_header(fmt="tinn-checkpoint-v1"):
    return np.frombuffer(json.dumps({"format": fmt, "scalars": {}, "metadata": {}}).encode(), dtype=np.uint8)


MALFORMED = [
    ("empty", lambda d: b"", r"0 bytes, too short for a checkpoint \(truncated\?\)"),
    ("text", lambda d: b"hello, this is not a checkpoint", r"not a tinn checkpoint \(neither a safetensors file"),
    ("truncated payload", lambda d: d[:-5], r"checksum mismatch: the file is corrupt"),
    ("truncated header", lambda d: d[:40], r"the header claims \d+ bytes but the file has 32"),
    ("bit flip in a weight", lambda d: d[:-3] + bytes([d[-3] ^ 4]) + d[-2:], r"checksum mismatch"),
    ("non-UTF-8 header", lambda d: d[:8] + b"{\xff" + d[10:], r"the header is not UTF-8 \(byte 1\)"),
    ("header not JSON", lambda d: d[:8] + b"{]" + d[10:], r"the header is not valid JSON"),
    ("header a list", lambda d: _v2_list(), r"not a tinn checkpoint \(neither a safetensors file"),
    ("no metadata", lambda d: _plain_safetensors(), r"the header has no __metadata__ object: not a tinn checkpoint"),
    ("wrong format", lambda d: d.replace(b"tinn-checkpoint-v2", b"tinn-checkpoint-v9", 1),
     r"format 'tinn-checkpoint-v9'; allowed: 'tinn-checkpoint-v2' \(or 'tinn-checkpoint-v1'\)"),
    ("missing checksum", lambda d: _v2({}, _tinn_meta(), checksum=False), r"checksum mismatch"),
    ("bad dtype", lambda d: _v2({"model/w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, _tinn_meta(),
                                bytes(16)), r"tensor 'model/w' has dtype 'F128'; allowed: \["),
    ("bad shape", lambda d: _v2({"model/w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, _tinn_meta(),
                                bytes(4)), r"tensor 'model/w' has shape \[-1\]"),
    ("size mismatch", lambda d: _v2({"model/w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, _tinn_meta(),
                                    bytes(8)), r"shape \[3\] F32 needs 12 bytes, data_offsets give 8"),
    ("gap", lambda d: _v2({"model/w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, _tinn_meta(),
                          bytes(8)), r"overlaps or leaves a gap at byte 0"),
    ("trailing bytes", lambda d: _v2({"model/w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, _tinn_meta(),
                                     bytes(8)), r"4 bytes after the last tensor"),
    ("bad entry name", lambda d: _v2({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, _tinn_meta(),
                                     bytes(4)), r"entry name 'w' is not '<section>/<key>'"),
    ("nested scalar", lambda d: _v2({}, _tinn_meta(scalars={"trainer/step": [1]})), r"entry 'trainer/step' is a JSON list"),
    ("pickle", lambda d: pickle.dumps({"model": 1}), r"a Python pickle, not a tinn checkpoint; pickle payloads are refused"),
    ("torch.save", lambda d: _torch_save(), r"a torch.save archive \(pickle\), not a tinn checkpoint; pickle payloads"),
    ("wrong zip", lambda d: _zip({"readme.txt": b"hi"}), r"unexpected members \['readme.txt'\]"),
    ("broken zip", lambda d: _zip({"a.npy": b"x" * 64})[:50], r"not a readable tinn-checkpoint-v1 checkpoint"),
    ("v1 object array", lambda d: _npz(__header__=_v1_header(), **{"model/w": np.array([{"a": 1}], dtype=object)}),
     r"object arrays need pickle, which is refused"),
    ("v1 missing header", lambda d: _npz(**{"model/w": np.zeros(2, np.float32)}), r"missing header \(__header__\)"),
    ("v1 wrong format", lambda d: _npz(__header__=_v1_header("other")), r"format 'other'; allowed"),
    ("v1 non-UTF-8 header", lambda d: _npz(__header__=np.frombuffer(b"\xff\xfe", np.uint8)), r"not UTF-8 JSON bytes"),
    ("v1 big-endian array", lambda d: _npz(__header__=_v1_header(), **{"model/w": np.zeros(2, ">f4")}),
     r"array 'model/w' has dtype >f4"),
]


def _v2_list():
    text = b"[1, 2]  "
    return struct.pack("<Q", len(text)) + text


def _plain_safetensors():
    text = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(text)) + text + bytes(4)


def _torch_save():
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    return buf.getvalue()


@pytest.mark.parametrize("name,make,message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_files_name_the_problem(tmp_path, source, name, make, message):
    data, _ = source
    path = tmp_path / "bad.tinn"
    path.write_bytes(make(data))
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.tinn: cannot read the checkpoint \(No such file"):
        checkpoint.load(tmp_path / "nope.tinn")


def test_fuzz_v1_files_never_raise_other_errors(tmp_path):
    """v1 files carry no checksum: damage may go unseen, but never as another exception type."""
    trainer = trained(seed=0)
    arrays = {f"model/{k}": v.cpu().numpy() for k, v in trainer.model.state_dict().items()}
    header = {"format": "tinn-checkpoint-v1", "scalars": {"trainer/step": 3}, "metadata": {}}
    data = _npz(__header__=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    rng = random.Random(5)
    path = tmp_path / "v1.tinn"
    for i in range(120):
        corrupt = bytearray(data)
        if i % 3 == 0:
            corrupt = corrupt[:rng.randrange(len(data))]
        else:
            corrupt[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(corrupt))
        try:
            checkpoint.load(path)
        except CheckpointError:
            pass
