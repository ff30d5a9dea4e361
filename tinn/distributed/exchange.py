"""Sample routing between ranks: each sample travels to the rank that owns its network and back.

A forward buckets the caller's samples by (chunk, owner) on the device (tinn/distributed/buckets.py),
then exchanges a small header: every rank sends every rank its sample count per chunk, the flags and a
call number (one all_to_all_single of int64), and, in every call of a part whose Trainer step sends rows
grouped by network, a payload of per-network counts the host does not read (zeros in a forward: the header
keeps one size, so ranks making different calls raise instead of exchanging mismatched tensors). Reading it is
the step's one host synchronisation: the
owner's local part sizes its buffers and kernel launches by the count it receives, and torch's
all_to_all_single takes split sizes from the host (`send_header`, then `HeaderInFlight.read`: a step that routes
its next batch ahead reads that batch's header once its own compute is issued, tinn/distributed/route_ahead.py).
Everything after runs without the host waiting:
one payload all_to_all per chunk carries the inputs with the local ids bit-cast into one extra float32
column, issued asynchronously (the NCCL stream runs it while the compute stream works on the previous
chunk); the results come back with the inverse exchange and are gathered into the caller's order.
The backward reuses the forward's split sizes: dy out, dx back only when some rank announced at the
forward that it wants dx, and no header.

NCCL needs the tensors on the GPU and gloo on the CPU; with tinn on CUDA and NCCL both are the
same tensors, so nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..errors import DistributedError
from .process import collective


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device)


class HeaderInFlight:
    """A header exchanged on the device and on its way to the host (`send_header`); `read()` waits for it."""

    def __init__(self, host: torch.Tensor, copied, later, chunks: int, what: str, group):
        self._host, self._copied, self.later = host, copied, later
        self._chunks, self._what, self._group = chunks, what, group

    def read(self) -> tuple[list[list[int]], list[list[int]], object]:
        """(sent counts [chunk][rank], the world rows of chunks + len(values) ints received, row i: what rank i
        sent here, and what `meanwhile` returned), read in one synchronisation (list indexing costs far less host
        time than indexing a CPU tensor)."""
        with collective(self._what, self._group):
            if self._copied is not None:
                self._copied.synchronize()
            mine, got = self._host.tolist()
        chunks = self._chunks
        return [[row[c] for row in mine] for c in range(chunks)], got, self.later


def send_header(values: list[int], counts: torch.Tensor, device, group, what: str, payload_width: int = 0,
                payload: torch.Tensor | None = None, meanwhile=None) -> HeaderInFlight:
    """Send (count for rank j per chunk, *values, payload[j]) to every rank j; `counts` (chunks, world) on any
    device; `payload` (world, payload_width) int64 (zeros when None) rides along for the device only (per-network
    counts), so the header keeps one size whatever the call: ranks making different calls still exchange
    headers of one shape, and raise on what they read. On CUDA the header is copied to pinned host memory behind
    an event, so the host waits only when it reads it (`HeaderInFlight.read`). `meanwhile(the (world,
    payload_width) payloads received, on `device`)`: work queued on the GPU after that copy, whose kernels run
    while the host reads the header and issues what follows (the rows' sort and packing), instead of the device
    idling until the host's next launch; its launches' host time passes while the device is still busy with what
    came before the header."""
    chunks, world = counts.shape
    read = chunks + len(values)
    # The header sent and the one received, side by side in one buffer: the host copy takes both at once.
    both = torch.empty(2, world, read + payload_width, dtype=torch.int64, device=device)
    header, received = both[0], both[1]
    header[:, :chunks] = _to(counts, device).t()
    # The values in one copy (each column written apart costs a launch and its host time).
    header[:, chunks:read] = torch.tensor([int(v) for v in values], dtype=torch.int64).to(device, non_blocking=True)
    if payload_width:
        if payload is None:
            header[:, read:] = 0
        else:
            header[:, read:] = _to(payload, device)
    with collective(what, group):
        dist.all_to_all_single(received, header, group=group)
        both = both[:, :, :read] if payload_width else both
        copied = None
        if both.is_cuda:
            host = torch.empty(both.shape, dtype=both.dtype, pin_memory=True)
            host.copy_(both, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        else:
            host = both
        later = None if meanwhile is None else meanwhile(received[:, read:])
    return HeaderInFlight(host, copied, later, chunks, what, group)


def check_agreement(received: list[list[int]], mine: list[int], names: list[str], rank: int, what: str,
                    first: int = 1) -> None:
    """Every rank must have sent the same values as this one (columns `first`...); else all ranks raise alike
    (each sees every other rank's values)."""
    for k, name in enumerate(names):
        column = [row[first + k] for row in received]
        if any(v != mine[k] for v in column):
            raise DistributedError(f"rank {rank}: ranks disagree in {what}: {name} per rank = {column}; every rank "
                                   "must make the same calls in the same order (a forward with gradients on every "
                                   "rank or on none, and a backward on every rank)")


@dataclass
class Plan:
    """How one batch was routed. Caller side: `perm` / `dest` (buckets.Packing) map between the caller's
    order and bucket order; `send[c][j]` samples of chunk c go to rank j. Owner side: `recv[c][j]` samples of
    chunk c come from rank j."""
    perm: torch.Tensor
    dest: torch.Tensor
    send: list[list[int]]
    recv: list[list[int]]
    any_dx: bool = False
    any_grads: bool = True
    starts: list[int] = field(default_factory=list)  # first bucket-order row of each chunk (caller side)

    def __post_init__(self):
        self.starts = [0]
        for row in self.send:
            self.starts.append(self.starts[-1] + sum(row))

    @property
    def chunks(self) -> int:
        return len(self.send)

    def n_local(self, chunk: int) -> int:
        return sum(self.recv[chunk])

    def caller_rows(self, chunk: int) -> slice:
        return slice(self.starts[chunk], self.starts[chunk + 1])


class Pending:
    """An all_to_all in flight; `result()` waits for it (on CUDA the stream waits, the host does not) and
    returns the received rows on `out_device` (in `target` when the caller gave one)."""

    def __init__(self, work, out: torch.Tensor, out_device, what: str, group, target: torch.Tensor | None = None):
        self.work, self.out, self.out_device, self.what, self.group = work, out, out_device, what, group
        self.target = target

    def result(self) -> torch.Tensor:
        if self.work is not None:
            with collective(self.what, self.group):
                self.work.wait()
            self.work = None
        if self.target is not None and self.target is not self.out:
            self.target.copy_(self.out)
            return self.target
        return _to(self.out, self.out_device)


def start_exchange(rows: torch.Tensor, send: list[int], recv: list[int], device, group, what: str,
                   out: torch.Tensor | None = None) -> Pending:
    """Start an all_to_all of (n, dims) float32 rows: send[j] rows (in order) to rank j; rank i's recv[i] rows
    arrive, in `out` when given (a contiguous (sum(recv), dims) tensor)."""
    dims = rows.shape[1]
    out_device = out.device if out is not None else rows.device
    buf = out if out is not None and out.device == device else \
        torch.empty(sum(recv), dims, dtype=rows.dtype, device=device)
    with collective(what, group):
        work = dist.all_to_all_single(buf, _to(rows.contiguous(), device), output_split_sizes=list(recv),
                                      input_split_sizes=list(send), group=group, async_op=True)
    return Pending(work, buf, out_device, what, group, target=out)
