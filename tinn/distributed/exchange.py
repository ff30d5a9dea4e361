"""Sample routing between ranks: each sample travels to the rank that owns its network and back.

A forward exchange starts with a small header (every rank sends every rank: its sample count, a
flag and a call number; one all_to_all_single), then one payload all_to_all_single carrying the
inputs with the local ids bit-cast into one extra float32 column. The results come back with the
inverse exchange (split sizes swapped) and are put back in the caller's sample order.

NCCL needs the tensors on the GPU and gloo on the CPU; with tinn on CUDA and NCCL both are the
same tensors, so nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import DistributedError
from .process import collective


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if t.device == device else t.to(device)


def exchange_header(values: list[int], per_rank_counts: torch.Tensor, device, group, what: str) -> torch.Tensor:
    """Send (count for rank j, *values) to every rank j; returns the (world, 1 + len(values)) int64 rows received
    (row i: what rank i sent here)."""
    world = per_rank_counts.shape[0]
    header = torch.empty(world, 1 + len(values), dtype=torch.int64, device=device)
    header[:, 0] = _to(per_rank_counts, device)
    for k, v in enumerate(values):
        header[:, 1 + k] = int(v)
    received = torch.empty_like(header)
    with collective(what, group):
        dist.all_to_all_single(received, header, group=group)
    return received.cpu()


def check_agreement(received: torch.Tensor, mine: list[int], names: list[str], rank: int, what: str) -> None:
    """Every rank must have sent the same flags and call number as this one; else all ranks raise alike
    (each sees every other rank's values)."""
    for k, name in enumerate(names):
        column = received[:, 1 + k].tolist()
        if any(v != mine[k] for v in column):
            raise DistributedError(f"rank {rank}: ranks disagree in {what}: {name} per rank = {column}; every rank "
                                   "must make the same calls in the same order (a forward with gradients on every "
                                   "rank or on none, and a backward on every rank)")


@dataclass
class Route:
    """How one batch was routed: `order` sorts the caller's samples by owner rank; counts per rank."""
    order: torch.Tensor        # (batch,) int64
    send: list[int]            # samples this rank sends to each rank
    recv: list[int]            # samples this rank receives from each rank (it owns their networks)

    @property
    def n_local(self) -> int:
        return sum(self.recv)


def exchange(rows: torch.Tensor, send: list[int], recv: list[int], device, group, what: str) -> torch.Tensor:
    """all_to_all of (n, dims) float32 rows: send[j] rows (in order) to rank j; returns the rows received."""
    dims = rows.shape[1]
    out = torch.empty(sum(recv), dims, dtype=rows.dtype, device=device)
    with collective(what, group):
        dist.all_to_all_single(out, _to(rows.contiguous(), device), output_split_sizes=list(recv),
                               input_split_sizes=list(send), group=group)
    return out


def to_owners(x: torch.Tensor, local_ids: torch.Tensor, route: Route, device, out_device, group):
    """Inputs and local ids of the samples this rank owns, as received: (x (n, dims), ids int32 (n,))."""
    sorted_x = x[route.order]
    packed = torch.cat([sorted_x, local_ids[route.order].view(torch.float32)[:, None]], 1)
    got = _to(exchange(packed, route.send, route.recv, device, group, "the forward exchange of inputs"), out_device)
    return got[:, :-1].contiguous(), got[:, -1].contiguous().view(torch.int32)


def back_to_callers(rows: torch.Tensor, route: Route, device, out_device, group, what: str) -> torch.Tensor:
    """The inverse exchange: rows computed for received samples return to their ranks, in the callers' order."""
    got = _to(exchange(rows, route.recv, route.send, device, group, what), out_device)
    out = torch.empty_like(got)
    out[route.order] = got
    return out


def to_owners_rows(rows: torch.Tensor, route: Route, device, out_device, group, what: str) -> torch.Tensor:
    """Per-sample rows (e.g. dy) of the caller's samples, sent to the owners in the forward's routing."""
    return _to(exchange(rows[route.order], route.send, route.recv, device, group, what), out_device)
