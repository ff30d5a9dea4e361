"""`ShardedPart`: an array of networks partitioned over ranks, with the part contract of one array.

    model = ShardedPart(lambda n: NetworkWithInputEncoding(3, 4, enc, net, n_networks=n, seed=7), n_networks=4096)
    y = model(x, ids)          # every rank: its own batch, any ids in 0..4095

Every rank holds the networks it owns (their grids, and so their optimizer state): `part_factory(n)`
builds the local part for n networks. A forward routes each sample to its owner (tinn/distributed/
exchange.py), runs the local part's contract on local ids, and returns outputs in the caller's order;
backward sends dy to the owners and dx back. Every rank calls forward and backward with its own batch
(data parallel over samples, model parallel over networks), so every rank must make the same calls:
a header exchanged with each forward carries the counts, the flags (gradients enabled; dx and table
gradients wanted by the backward) and a call number counting forwards and backwards, and ranks that
disagree all raise a DistributedError instead of deadlocking. That header is the one host
synchronisation of a training step (tinn/distributed/exchange.py says why); the backward has none.
With `chunks` > 1 each rank's batch is exchanged and computed in pieces, the exchange of one piece
overlapping the computation of the previous one. The Trainer's step (`gradients_from_loss`) sends each sample's
target with its inputs and computes the loss at the owner: one exchange instead of three.

Gradients follow torch's DistributedDataParallel: the gradient of a table is the mean over ranks of
each rank's loss gradient (`gradients="mean"`; "sum" for losses that already sum over ranks). With
equal per-rank batches and a mean loss this is the single-process gradient of the whole batch. Tables
every rank holds a copy of (a shared encoding or network, `share_encoding=True` / `share_network=True`, or any
name in `replicated`) are all-reduced; tables of owned networks need no reduction.

`Replicated(part)`: a whole part copied on every rank (a teacher, or a data-parallel array whose training
state fits on one GPU) whose gradients are all-reduced in one bucket per call, in float32 or narrower; or,
where the Trainer builds an elementwise optimizer through the part, reduce-scattered to an optimizer split
over the ranks (tinn/distributed/optimizer_split.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import json

import torch

from .. import checks, gradient_pieces, gradient_scaling, routing, runtime
from ..errors import ConfigError, InputError
from ..losses import Loss
from ..part import SAMPLE_MAJOR, Context, NextBatch, Part, SecondOrderError, accumulate, run
from . import buckets
from . import exchange
from .optimizer_split import check_split
from .ownership import Ownership
from .piece_reduction import PieceReduction, piece_table
from .profile import mark
from .route_ahead import SideStream
from .process import (agree_on_overflow, all_gather_objects, collective, collective_device, rank, require_group,
                      side_group, world_size)

GRADIENT_MODES = ("mean", "sum")
INIT_MODES = ("global", "local")
# What a call's header announces (ShardedPart._route): a forward, or a step with the loss at the owners.
_FORWARD, _LOSS_AT_OWNERS = 0, 1
# The step with the loss at the owners sorts each rank's samples by (owner, local network) before sending them
# (`buckets.count_by_network`, `pack_by_network`), and each header carries the per-network counts: up to this
# many (chunk, owner, network) bins, beyond which the header would outweigh what the owners save.
_MAX_NETWORK_BINS = 1 << 20


def _runs(counts: list[int], weights: list[int]) -> list[tuple[int, int]]:
    """[lo, hi) ranges of consecutive sending ranks with the same weight (their rows are consecutive)."""
    out, lo = [], 0
    for r in range(1, len(counts) + 1):
        if r == len(counts) or weights[r] != weights[lo]:
            out.append((lo, r))
            lo = r
    return out


def _replicated_by_default(part: Part) -> set[int]:
    """ids() of tables every rank holds whole: shared encodings and Replicated sub-parts."""
    out = set()
    for m in part.modules():
        if isinstance(m, Replicated):
            out |= {id(t) for t in m.parameter_tables() if t is not None}
        elif getattr(m, "share_encoding", False) and hasattr(m, "encoding"):
            out |= {id(t) for t in m.encoding.parameter_tables() if t is not None}
        elif getattr(m, "share_network", False) and hasattr(m, "network"):
            out |= {id(t) for t in m.network.parameter_tables() if t is not None}
    return out


#: `Replicated(reduce_dtype=...)`: the dtype gradients cross the link in.
REDUCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Reduction:
    """One all-reduce of a call's gradients, issued asynchronously (the work enqueued after it overlaps);
    `result()` waits (on CUDA: the stream waits, not the host), scales and returns the gradients.

    The gradients travel in one flat bucket: one collective per call however many tables there are (each
    collective has a fixed launch and latency cost). A single float32 gradient on the collective device is
    reduced in place, without the bucket's copies. With a narrower `dtype` (bfloat16, float16) the bucket
    is filled by one cast per table that also applies the scale (a mean's 1/world before the sum keeps
    float16 from overflowing), halving the bytes on the link; float32 sums first and scales after, so that
    a two-rank mean equals the single-process gradient exactly."""

    def __init__(self, grads, scale: float, device, group, what: str, dtype: torch.dtype = torch.float32):
        self.scale, self.what, self.group = scale, what, group
        self.grads = list(grads)
        self.work = self.flat = None
        present = [g for g in self.grads if g is not None]
        if not present:
            return
        for g in present:
            if g.is_sparse:
                raise ConfigError(f"{what}: a sparse gradient (a compact table's) cannot be all-reduced; replicated "
                                  "tables must be float32 (table_dtype='float32')")
        single = present[0]
        self.in_place = (len(present) == 1 and dtype == single.dtype == torch.float32 and single.device == device
                         and single.is_contiguous())
        self.pre_scale = 1.0 if dtype == torch.float32 else scale
        if self.in_place:
            flat = single.view(-1)
        else:
            flat = torch.empty(sum(g.numel() for g in present), dtype=dtype, device=single.device)
            offset = 0
            for g in present:
                piece = flat[offset:offset + g.numel()]
                if self.pre_scale != 1.0:
                    torch.mul(g.reshape(-1), self.pre_scale, out=piece)  # the cast and the scale in one pass
                else:
                    piece.copy_(g.reshape(-1))
                offset += g.numel()
            flat = flat.to(device)
        self.flat = flat
        with collective(what, group):
            self.work = torch.distributed.all_reduce(flat, group=group, async_op=True)

    def result(self) -> tuple:
        if self.work is None:
            return tuple(self.grads)
        with collective(self.what, self.group):
            self.work.wait()
        post = self.scale / self.pre_scale
        flat, self.work, self.flat = self.flat, None, None
        if self.in_place:
            if post != 1.0:
                flat *= post
            return tuple(self.grads)
        offset = 0
        for g in self.grads:
            if g is None:
                continue
            piece = flat[offset:offset + g.numel()].to(g.device).view(g.shape)
            offset += g.numel()
            if post != 1.0:
                torch.mul(piece, post, out=g)
            else:
                g.copy_(piece)
        return tuple(self.grads)


def _all_reduce_grads(grads, scale: float, device, group, what: str, dtype: torch.dtype = torch.float32):
    """Sum every rank's gradient (then scale), written back into the gradient tensors."""
    return _Reduction(grads, scale, device, group, what, dtype).result()


class _Collective(Part):
    """Shared behaviour of parts whose forward / backward run collectives: their own autograd Function,
    which takes part in the backward collectives on every rank (also when this rank's output got no
    gradient), and the call number that catches ranks out of step."""

    collective_calls = True  # every rank must make every call (renderers call even with no samples)
    #: A PhaseTimer (tinn/distributed/profile.py) that the part marks its phases on, None for no profiling.
    profiler = None

    def graph_safe_collectives(self) -> bool:
        """Whether a CUDA graph can hold a training step through this part (tinn/step_graphs.py): its collectives
        are captured with the step and nothing in it reads the device on the host. No by default."""
        return False

    def _init_group(self, group, gradients: str):
        # The caller's group as given: None (the world) is looked up at each use rather than held, so a part still
        # alive when the script leaves the process group does not keep torch's process group object (and its
        # worker threads) alive into interpreter shutdown, where releasing a finished collective's tensors aborts.
        self._group = group
        require_group(group)
        if gradients not in GRADIENT_MODES:
            raise ConfigError(f"gradients={gradients!r} is not supported; allowed: {list(GRADIENT_MODES)}")
        self.gradients = gradients
        self.rank, self.world_size = rank(self.group), world_size(self.group)
        self.collective_device = collective_device(self.group)
        self._calls = 0

    @property
    def group(self):
        return require_group(self._group)

    def _next_call(self) -> int:
        self._calls += 1
        return self._calls

    def run_checked(self, x, ids):
        return run(self, x, ids, _CollectiveFunction)

    def forward_for_autograd(self, x, ids, need_dx: bool, need_grads: bool):
        """The training forward of an autograd call, which knows which gradients its backward will want."""
        return self.forward_with_context(x, ids, train=True)


class _CollectiveFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, part, x, ids, *tables):
        y, pctx = part.forward_for_autograd(x.detach(), ids, need_dx=ctx.needs_input_grad[1],
                                            need_grads=any(ctx.needs_input_grad[3:]))
        ctx.part, ctx.pctx = part, pctx
        ctx.x_shape = x.shape
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            raise SecondOrderError(f"second-order gradients through {type(ctx.part).__name__} are not supported")
        part = ctx.part
        need_dx = ctx.needs_input_grad[1]
        need_tables = ctx.needs_input_grad[3:]
        if dy is None:  # this rank's output got no gradient; the other ranks still need its part of the exchange
            dy = torch.zeros(ctx.x_shape[0], part.n_output_dims, device=runtime.device())
        dx, grads = part.backward(ctx.pctx, dy.detach().contiguous(), need_dx=need_dx, need_grads=any(need_tables))
        grads = tuple(g if want else None for g, want in zip(grads, need_tables))
        return (None, dx if need_dx else None, None) + grads


class ShardedPart(_Collective):
    """`n_networks` networks spread over the ranks of `group` (default: the world).

    part_factory(n) -> Part: the local part for n networks (called once, with this rank's count).
    assignment: the owner rank of each network id (default: contiguous ranges, the first ranks one
    network more when the count does not divide). init: "global" gives every network the initial
    values the unsharded `part_factory(n_networks)` would give it (costs one whole table on the host
    while it is drawn); "local" keeps the local part's own draw (use it for models larger than a host).
    replicated: names of local parameters every rank holds a copy of (added to the shared encodings
    found by default). config: the JSON config the model was built from, compared across ranks.
    chunks: pieces each rank's batch is exchanged and computed in (default 1): with more, the exchange of
    one chunk runs on the communication stream while the local part computes the previous one; the
    backward then adds each chunk's table gradients (a pass over the tables per extra chunk), so it pays
    for small tables (MLPs), rarely for big grids. Every rank must pass the same value.
    exchange_kernels: how the per-sample passes of the exchange run: "auto" (Triton kernels on CUDA, torch
    ops elsewhere), "triton" or "torch".
    exchange_dtype: the dtype samples cross the link in: "float32" (default: exact), "bfloat16" (inputs,
    outputs, dy and dx in bfloat16) or "float16" (inputs and outputs in float16, dy and dx in bfloat16: the
    per-sample gradients of a mean loss over a large batch, around 1e-8, lie below float16's smallest
    subnormal, while bfloat16 has float32's range). Either halves the bytes per sample. The caller's side
    casts in its packing and gathering passes; the owner widens the inputs as it unpacks them, and takes one
    pass each to narrow its outputs and dx and to widen dy (its local part reads and writes float32). The
    local part computes from inputs rounded to the dtype: float16 changes nothing for float16 networks that
    read the raw inputs (their kernels round them to float16 themselves), bfloat16 keeps 8 bits of mantissa,
    and either costs precision where an encoding reads the inputs (a hash grid's positions). Every rank must
    pass the same value.
    """

    input_layouts = (SAMPLE_MAJOR,)
    output_layouts = (SAMPLE_MAJOR,)

    def __init__(self, part_factory, n_networks: int, group=None, *, assignment=None, init: str = "global",
                 gradients: str = "mean", replicated=(), config: dict | None = None, chunks: int = 1,
                 exchange_kernels: str = "auto", exchange_dtype: str = "float32"):
        runtime.ensure_init()
        n_networks = int(n_networks)
        if init not in INIT_MODES:
            raise ConfigError(f"init={init!r} is not supported; allowed: {list(INIT_MODES)}")
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ConfigError(f"chunks={chunks!r} must be a positive integer (1: no pipelining)")
        self_kernels = buckets.check_kernels(exchange_kernels)
        values_dtype = buckets.exchange_dtype(exchange_dtype)
        world = world_size(group)
        own_rank = rank(group)
        ownership = (Ownership.contiguous(n_networks, world) if assignment is None
                     else Ownership.from_assignment(assignment, n_networks, world))
        owned = ownership.owned(own_rank)
        local = part_factory(len(owned))
        if not isinstance(local, Part):
            raise ConfigError(f"part_factory must return a tinn.Part, got {type(local).__name__}")
        if local.n_networks != len(owned):
            raise ConfigError(f"part_factory({len(owned)}) returned a part with n_networks={local.n_networks}; it "
                              "must build the number of networks it is given")
        super().__init__(local.n_input_dims, local.n_output_dims, n_networks)
        self._init_group(group, gradients)
        self.local = local
        self.ownership = ownership
        self.owned = owned
        self.init_mode = init
        self.config = config or {}
        self.chunks = chunks
        self.exchange_kernels = self_kernels
        self.exchange_dtype = exchange_dtype
        # Forward values (inputs, outputs) and gradients (dy, dx) on the link.
        self._values_dtype = values_dtype
        self._grads_dtype = torch.bfloat16 if values_dtype == torch.float16 else values_dtype
        owner, local_ids = ownership.tables(runtime.device())
        self._owner, self._local_ids = owner, local_ids  # plain attributes: not in the state dict
        most = max(len(ownership.owned(r)) for r in range(world))
        self._by_network = most if 1 < most and world * chunks * most <= _MAX_NETWORK_BINS else 0
        self._ahead = self._side = None  # the next step's batch routed ahead, and the stream it was routed on
        names = dict((id(p), n) for n, p in local.named_parameters())
        replicated = set(replicated)
        unknown = sorted(replicated - set(names.values()))
        if unknown:
            raise ConfigError(f"replicated names {unknown} are not parameters of the local part; allowed: "
                              f"{sorted(names.values())}")
        shared_ids = _replicated_by_default(local) | {id(p) for p in local.parameters() if names[id(p)] in replicated}
        self._replicated = tuple(t is not None and id(t) in shared_ids for t in local.parameter_tables())
        for t, shared in zip(local.parameter_tables(), self._replicated):
            if shared and t.dtype == torch.bfloat16:
                # Its gradient is sparse, and each rank's entries differ: no all-reduce sums them.
                raise ConfigError(f"table {names.get(id(t), '?')} is compact (bfloat16) and replicated over the "
                                  "ranks; a replicated table must be float32 (table_dtype='float32'), or owned "
                                  "per network (share_encoding=False)")
        for t, shared in zip(local.parameter_tables(), self._replicated):
            if t is not None and not shared and (t.dim() < 1 or t.shape[0] != len(owned)):
                raise ConfigError(f"table {names.get(id(t), '?')} of shape {tuple(t.shape)} is neither per network "
                                  f"({len(owned)} rows here) nor replicated; name it in replicated=")
        self.sharded_names = sorted(names[id(t)] for t, s in zip(local.parameter_tables(), self._replicated)
                                    if t is not None and not s and id(t) in names)
        if init == "global":
            _install_global_init(local, n_networks, owned, shared_ids)
        self._check_same_everywhere()

    # ---- construction checks ---------------------------------------------------------------------
    def description(self) -> dict:
        """What every rank must agree on (compared at construction, stored in checkpoint manifests)."""
        local = self.local
        return {"n_networks": self.n_networks, "ownership": self.ownership.describe(),
                "part": type(local).__name__, "n_input_dims": local.n_input_dims,
                "n_output_dims": local.n_output_dims, "gradients": self.gradients, "init": self.init_mode,
                "config": self.config,
                "tables": [[n, list(p.shape[1:]) if n in self.sharded_names else list(p.shape)]
                           for n, p in local.named_parameters()],
                "replicated": [n for n, _ in local.named_parameters() if n not in self.sharded_names]}

    def _check_same_everywhere(self) -> None:
        # The chunk count shapes every rank's header and the exchange dtype its buffers: compared here, not
        # stored with checkpoints (neither is a property of the trained model).
        mine = dict(self.description(), chunks=self.chunks, exchange_dtype=self.exchange_dtype)
        digest = hashlib.sha256(json.dumps(mine, sort_keys=True, default=str).encode()).hexdigest()
        everyone = all_gather_objects((digest, mine), "the configuration check at construction", self.group)
        differ = [r for r, (d, _) in enumerate(everyone) if d != digest]
        if differ:
            other = everyone[differ[0]][1]
            keys = [k for k in sorted(set(mine) | set(other)) if mine.get(k) != other.get(k)]
            detail = "; ".join(f"{k}: {mine.get(k)!r} here, {other.get(k)!r} on rank {differ[0]}" for k in keys[:4])
            raise ConfigError(f"rank {self.rank}: ranks {differ} built a different sharded model ({detail}); "
                              "every rank must build the same model (config, n_networks, world size)")

    # ---- contract --------------------------------------------------------------------------------
    def parameter_tables(self):
        return self.local.parameter_tables()

    def check_parameter_tables(self) -> None:
        self.local.check_parameter_tables()

    def n_params_per_network(self) -> int:
        return self.local.n_params_per_network()

    def memory_bytes(self) -> int:
        """Bytes of this rank's tables."""
        return self.local.memory_bytes()

    def forward_for_autograd(self, x, ids, need_dx: bool, need_grads: bool):
        return self.forward_with_context(x, ids, train=True, need_dx=need_dx, need_grads=need_grads)

    def forward_with_context(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR,
                             need_dx: bool = False, need_grads: bool = True):
        """The contract's forward. need_dx / need_grads (training forwards): whether this rank's backward will
        ask for dx / table gradients. Every rank announces both in the forward's header, so the backward
        needs no header (and no host synchronisation); a backward asking for dx that no rank announced
        raises a ConfigError (autograd calls announce what autograd will ask for)."""
        dev = runtime.device()
        chunks = self.chunks
        packing, plan, incoming, _, _ = self._route(x, ids, _FORWARD, train, need_dx, need_grads, "inputs")
        back = torch.empty(x.shape[0], self.n_output_dims, dtype=self._values_dtype, device=dev)
        returning, local_ctx = [], []
        for c in range(chunks):
            x_here, ids_here = buckets.unpack(incoming[c].result(), self.exchange_kernels, self.n_input_dims)
            mark(self, "exchange")
            if plan.n_local(c):
                y_here, lctx = self.local.forward_with_context(x_here, ids_here, train=train)
            else:  # no sample for this rank's networks in this chunk
                y_here, lctx = torch.zeros(0, self.n_output_dims, device=dev), None
            mark(self, "compute")
            local_ctx.append(lctx)
            returning.append(exchange.start_exchange(y_here.to(self._values_dtype), plan.recv[c], plan.send[c],
                                                     self.collective_device, self.group,
                                                     "the forward exchange of outputs", out=back[plan.caller_rows(c)]))
            del x_here, ids_here
        for pending in returning:
            pending.result()
        y = buckets.gather_rows(back, packing.dest, 1.0, self.exchange_kernels)
        mark(self, "exchange")
        return y, (Context(plan=plan, local=local_ctx, batch=x.shape[0]) if train else None)

    def _route(self, x, ids, kind: int, train: bool, need_dx: bool, need_grads: bool, what: str, extra=None,
               by_network: bool = False, routes_ahead: bool = False):
        """Bucket the inputs (and `extra` columns after them: targets) by owner, exchange the header and start
        every chunk's exchange of the rows: (packing, plan, the chunks' pending exchanges, the batch size of
        every rank, and with `by_network` the grouping `_pack_and_merge` returns, else None). `kind` (_FORWARD,
        _LOSS_AT_OWNERS) travels in the header, so that ranks making different calls raise instead of
        exchanging mismatched rows; the header has one size for every kind. `routes_ahead`: whether the step
        this routes will route the batch after it ahead (tinn/distributed/route_ahead.py), agreed like the kind."""
        return self._route_finish(self._route_send(x, ids, kind, train, need_dx, need_grads, what, extra, by_network,
                                                   routes_ahead))

    def _route_send(self, x, ids, kind, train, need_dx, need_grads, what, extra, by_network, routes_ahead, group=None):
        """`_route`'s first half: the count and the header, on its way to the host (nothing waits). `group`: the
        process group the header and rows travel on, another than the part's when routing the next step's batch
        ahead on the side stream; the phase marks (on the current stream) are the step's own only then."""
        own = group is None
        group = self.group if own else group
        call = self._next_call()
        if own:
            mark(self, "other")
        width = self._by_network
        by_network = by_network and width > 0
        chunks = self.chunks
        if by_network:
            # Counted now, sorted and packed on the device while the host reads the header.
            counted = buckets.count_by_network(x, ids, self._owner, self._local_ids, self.world_size, chunks, width,
                                               self.exchange_kernels, self._values_dtype, extra)
            counts, payload = counted.counts, counted.network_counts.transpose(0, 1).reshape(self.world_size, -1)
            meanwhile = lambda received: self._pack_and_merge(counted, received)  # noqa: E731
            packing = None
        else:
            packing = buckets.bucket(x, ids, self._owner, self._local_ids, self.world_size, chunks,
                                     self.exchange_kernels, self._values_dtype, extra=extra)
            counts, payload, meanwhile = packing.counts, None, None
        if own:
            mark(self, "exchange")
        values = [int(train), call, kind, int(routes_ahead), int(train and need_dx), int(train and need_grads),
                  x.shape[0]]
        header = exchange.send_header(values, counts, self.collective_device, group, "the forward header",
                                      chunks * width, payload, meanwhile)
        return header, values, packing, what, group, own

    def _route_finish(self, sending):
        """`_route`'s second half: the host reads the header, checks that every rank makes the same call, and starts
        the rows' exchange."""
        header, values, packing, what, group, own = sending
        chunks = self.chunks
        sent, received, packed = header.read()
        grouping = None
        if packing is None:
            packing, grouping = packed
        if own:
            mark(self, "idle")
        exchange.check_agreement(received, values[:4], ["gradients enabled", "call number", "call kind (a forward, "
                                 "or the Trainer's step with the loss at the owners)", "routing the next step's "
                                 "batch ahead (Trainer.training_steps)"], self.rank, "the forward header",
                                 first=chunks)
        recv = [[row[c] for row in received] for c in range(chunks)]
        plan = exchange.Plan(packing.perm, packing.dest, sent, recv, any_dx=any(row[chunks + 4] for row in received),
                             any_grads=any(row[chunks + 5] for row in received))
        # Every chunk's rows are sent at once: the communication stream works through them while the compute
        # stream runs the chunks that already arrived.
        incoming = [exchange.start_exchange(packing.send[plan.caller_rows(c)], sent[c], recv[c], self.collective_device,
                                            group, f"the forward exchange of {what}") for c in range(chunks)]
        return packing, plan, incoming, [row[chunks + 6] for row in received], grouping

    def _pack_and_merge(self, counted, received):
        """Queued while the host reads the header: this rank's rows sorted and packed, and each chunk's merge tables
        for the usual case of one run of senders (every rank's batch the same size), computed before the header
        says whether it holds. Returns (packing, ((world, chunks, L) per-network counts received, [chunk's merge
        for one run]))."""
        world, chunks = self.world_size, self.chunks
        packing = buckets.pack_by_network(counted)
        network_counts = received.view(world, chunks, self._by_network).to(runtime.device())
        one_run = [buckets.merge_by_network(network_counts[:, c], [(0, world)], self.local.n_networks,
                                            self.exchange_kernels) for c in range(chunks)]
        return packing, (network_counts, one_run)

    def fuses_loss(self, need_dx: bool = False) -> bool:
        """Whether the Trainer's step computes each sample's loss where its network lives
        (`gradients_from_loss`): without dx, and with samples crossing the link in float32 (targets travel
        with the inputs, and a 16-bit target would change the loss)."""
        return not need_dx and self._values_dtype == torch.float32

    def routes_ahead(self, loss) -> bool:
        """Whether `gradients_from_loss` can route the next step's batch while it computes (`ahead=`): the step
        with the loss at the owners (tinn/distributed/route_ahead.py)."""
        return isinstance(loss, Loss) and self.fuses_loss()

    def drop_ahead(self) -> None:
        """Forget a batch routed ahead and never taken (its exchanges were issued on every rank and complete)."""
        self._ahead = None

    def gradients_from_loss(self, x, ids, loss, target, *, need_dx, need_grads=True, x_layout=SAMPLE_MAJOR,
                            ahead: NextBatch | None = None):
        """The Trainer's step with the loss computed where each sample's network lives: the targets travel with
        the inputs, each owner runs its local part's `gradients_from_loss` on the samples it receives, and
        neither outputs nor dy cross the link (two of the step's three exchanges, and the forward's kernels
        where the local part's backward recomputes them). The gradients equal `backward_from_loss` after a
        forward: each sample's loss is weighted as in its own rank's mean (the owner's loss averages over the
        sending rank's batch), times 1 / world for `gradients="mean"`. The loss returned is the one those
        gradients belong to, the same on every rank: the mean over ranks of each rank's mean loss ("sum":
        their sum). Other calls (dx wanted, a loss that is not a tinn Loss, 16-bit exchanges) take the
        forward and `backward_from_loss`.

        ahead: the next step's batch (`part.NextBatch`, validated like x, ids and target), routed on a
        side stream while this step computes; the next call with exactly those tensors takes its rows as they
        were then, with no header to wait for. Every rank passes one or none (`Trainer.training_steps` does)."""
        if need_dx or not isinstance(loss, Loss) or not self.fuses_loss() or x_layout != SAMPLE_MAJOR:
            if ahead is not None:
                raise ConfigError("ahead= routes the next step of the step with the loss at the owners; this call "
                                  "takes the forward and backward_from_loss (check routes_ahead(loss) first)")
            return super().gradients_from_loss(x, ids, loss, target, need_dx=need_dx, need_grads=need_grads,
                                               x_layout=x_layout)
        dev = runtime.device()
        taken = self._take_ahead(x, ids, target)
        if taken is None:
            x, ids, target = self._step_inputs(x, ids, target)
            _, plan, incoming, batches, grouping = self._route(x, ids, _LOSS_AT_OWNERS, True, False, need_grads,
                                                               "inputs and targets", extra=target, by_network=True,
                                                               routes_ahead=ahead is not None)
            mean_over = self._mean_over(batches)
            # Each chunk unpacked as the compute reaches it, so that it overlaps the next chunks' exchange.
            arrivals = (self._unpack(plan, incoming, grouping, mean_over, c) for c in range(plan.chunks))
        else:
            plan, arrivals, mean_over = taken
        self._next_call()  # the backward's count: the step is a forward and a backward to the call numbers
        sending = None
        if ahead is not None:
            # The next batch's count and header go out before this step's compute is issued, on the side stream.
            next_x, next_ids, next_target = self._step_inputs(ahead.x, ahead.ids, ahead.target)
            with self._side_stream().issue(after_current=True):
                sending = self._route_send(next_x, next_ids, _LOSS_AT_OWNERS, True, False, True, "inputs and targets",
                                           next_target, True, ahead.then, side_group(self.group))
        value, grads = self._losses_at_owners(plan, arrivals, loss, mean_over)
        packed = None
        if sending is not None:
            # By now the device has long answered the header: the host reads it, the rows go out beside the compute
            # just issued, and the side stream unpacks them as they arrive.
            side = self._side_stream()
            with side.issue(after_current=False):
                _, next_plan, incoming, batches, grouping = self._route_finish(sending)
                packed = side.record()
                next_mean_over = self._mean_over(batches)
                unpacked = [self._unpack(next_plan, incoming, grouping, next_mean_over, c)
                            for c in range(next_plan.chunks)]
                self._ahead = (ahead, (next_plan, unpacked, next_mean_over), side.record())
        tables = self.local.parameter_tables()
        reduction = self._start_reduce(tables, grads, plan.any_grads)
        value = torch.zeros((), device=dev) if value is None else value
        value = agree_on_overflow(gradient_scaling.scalers_of(self.local), self.collective_device, self.group,
                                  "the all-reduce of the step's loss and overflow flags", loss=value)
        grads = reduction()
        if packed is not None:
            # Whatever the caller does next with the next batch's tensors comes after the packing read them.
            self._side_stream().wait(packed)
        mark(self, "reduce")
        return None, (grads if need_grads else (None,) * len(tables)), value

    def _step_inputs(self, x, ids, target):
        """The step's batch checked before any collective: the targets are packed into the rows the owners split at
        d + o columns, and the bucketing kernels index tables by id."""
        x = checks.float_input("x", x, self.n_input_dims)
        target = checks.float_input("target", target, self.n_output_dims)
        if target.shape[0] != x.shape[0]:
            raise InputError(f"target has batch {target.shape[0]}; expected {x.shape[0]} to match x")
        return x, checks.net_ids(ids, x.shape[0], self.n_networks), target

    def _side_stream(self) -> SideStream:
        if self._side is None:
            self._side = SideStream(runtime.device())
        return self._side

    def _take_ahead(self, x, ids, target):
        """The route of this batch if the previous step routed it ahead (the same tensors), else None; a call on
        another batch leaves it for the call it was routed for."""
        held = self._ahead
        if held is None:
            return None
        batch, taken, unpacked_event = held
        if batch.x is not x or batch.ids is not ids or batch.target is not target:
            return None
        self._ahead = None
        side = self._side_stream()
        side.wait(unpacked_event)
        side.hand_over(taken[1])
        return taken

    def _mean_over(self, batches: list[int]) -> list[int]:
        """What each sending rank's samples' losses are averaged over: its batch x outputs (x world for "mean")."""
        return [(self.world_size if self.gradients == "mean" else 1) * b * self.n_output_dims for b in batches]

    def _unpack(self, plan, incoming, grouping, mean_over, c: int):
        """Chunk c's received rows as (runs of sending ranks, merge tables or None, inputs, targets, local ids)."""
        # Rows arrive grouped by sending rank; ranks of equal batches share one weight, so they go together, and
        # with the per-network counts they unpack grouped by network (the sort the local part would run).
        runs = _runs(plan.recv[c], mean_over)
        merge = None
        if grouping is not None:
            network_counts, one_run = grouping
            merge = one_run[c] if len(runs) == 1 else buckets.merge_by_network(
                network_counts[:, c], runs, self.local.n_networks, self.exchange_kernels)
        rows = buckets.unpack_split(incoming[c].result(), self.n_input_dims, self.n_output_dims, self.exchange_kernels,
                                    merge)
        return (runs, merge) + rows

    def _losses_at_owners(self, plan, arrivals, loss, mean_over):
        """Each chunk's unpacked rows (`_unpack`) run through the local part's `gradients_from_loss`: (the loss summed
        over the chunks' pieces or None, the summed gradients)."""
        grads = (None,) * len(self.local.parameter_tables())
        value = None
        for c, (runs, merge, x_here, target_here, ids_here) in enumerate(arrivals):
            mark(self, "exchange")
            start = 0
            for r, (lo, hi) in enumerate(runs):
                stop = start + sum(plan.recv[c][lo:hi])
                if stop > start:
                    piece = slice(start, stop)
                    piece_ids = ids_here[piece]
                    with routing.grouped(piece_ids, merge.bounds[r]) if merge else contextlib.nullcontext():
                        _, piece_grads, piece_value = self.local.gradients_from_loss(
                            x_here[piece], piece_ids, loss.averaged_over(mean_over[lo]), target_here[piece],
                            need_dx=False, need_grads=plan.any_grads)
                    grads = tuple(accumulate(a, g) for a, g in zip(grads, piece_grads))
                    value = piece_value if value is None else value + piece_value
                start = stop
            mark(self, "compute")
            del x_here, target_here, ids_here
        return value, grads

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        # Counted, not exchanged: a rank that skipped a backward is caught by the next forward's header.
        self._next_call()
        dev = runtime.device()
        plan = ctx.plan
        mark(self, "other")
        mean = self.gradients == "mean" and self.world_size > 1
        # The mean over ranks, applied to dy (a few values per sample, in the gather that puts it in bucket
        # order) instead of the gradient tables (every parameter): gradients are linear in dy. dx is each
        # caller's own and gets the factor back in the gather that returns it.
        dy_out = buckets.gather_rows(dy, plan.perm, 1.0 / self.world_size if mean else 1.0, self.exchange_kernels,
                                     self._grads_dtype)
        incoming = [exchange.start_exchange(dy_out[plan.caller_rows(c)], plan.send[c], plan.recv[c],
                                            self.collective_device, self.group, "the backward exchange of dy")
                    for c in range(plan.chunks)]
        mark(self, "exchange")
        tables = self.local.parameter_tables()
        any_dx, any_grads = plan.any_dx, plan.any_grads
        dx_back = torch.empty(ctx.batch, self.n_input_dims, dtype=self._grads_dtype, device=dev) if any_dx else None
        returning, grads = [], (None,) * len(tables)
        for c in range(plan.chunks):
            dy_here = incoming[c].result().to(torch.float32)
            mark(self, "exchange")
            if plan.n_local(c):
                dx_here, chunk_grads = self.local.backward(ctx.local[c], dy_here, need_dx=any_dx,
                                                           need_grads=any_grads)
                grads = tuple(accumulate(a, g) for a, g in zip(grads, chunk_grads))
            else:
                dx_here = None
            mark(self, "compute")
            if any_dx:
                if dx_here is None:
                    dx_here = torch.zeros(0, self.n_input_dims, device=dev)
                returning.append(exchange.start_exchange(dx_here.to(self._grads_dtype), plan.recv[c], plan.send[c],
                                                         self.collective_device,
                                                         self.group, "the backward exchange of dx",
                                                         out=dx_back[plan.caller_rows(c)]))
        reduction = self._start_reduce(tables, grads, any_grads)
        dx = None
        if any_dx:
            for pending in returning:
                pending.result()
            dx = buckets.gather_rows(dx_back, plan.dest, float(self.world_size) if mean else 1.0, self.exchange_kernels)
            mark(self, "exchange")
        grads = reduction()
        self._agree_on_overflow()
        mark(self, "reduce")
        if need_dx and not any_dx:
            # Raised after this rank took its part in every collective of the backward, so no rank hangs.
            raise ConfigError(f"rank {self.rank}: ShardedPart.backward was asked for dx, but no rank announced "
                              "it at the forward; call forward_with_context(x, ids, train=True, need_dx=True) "
                              "(autograd calls announce it from x.requires_grad)")
        return (dx if need_dx else None), grads

    def _agree_on_overflow(self) -> None:
        """Every rank's float16 scalers learn whether any rank's gradients overflowed (a max over ranks of their
        `found_inf`, on the device): each rank then makes the same skip decision, so tables every rank holds
        (replicated ones) are stepped or skipped alike and never drift apart. No host sync."""
        if self.world_size > 1:
            agree_on_overflow(gradient_scaling.scalers_of(self.local), self.collective_device, self.group,
                              "the overflow flags' all-reduce")

    def _start_reduce(self, tables, grads, any_grads):
        """Owned tables: as computed (dy carries the mean's scale); replicated ones: summed over ranks
        (every rank, same order), the all-reduces issued now and awaited by the returned function."""
        grads = list(grads)
        for i, (t, g) in enumerate(zip(tables, grads)):
            wanted = any_grads and t is not None and t.requires_grad
            if wanted and g is None:  # a rank without samples: a zero gradient, as the unsharded array gives
                grads[i] = g = torch.zeros_like(t)
        shared = [i for i, s in enumerate(self._replicated) if s and grads[i] is not None]
        pending = _Reduction([grads[i] for i in shared], 1.0, self.collective_device, self.group,
                             "the all-reduce of replicated gradients")

        def finish():
            for i, g in zip(shared, pending.result()):
                grads[i] = g
            return tuple(grads)
        return finish


class Replicated(_Collective):
    """A part held whole by every rank (data parallelism: a teacher, a shared encoding, or a whole array whose
    training state fits on one GPU): forward and backward run locally on the rank's own samples, and the table
    gradients are all-reduced, the mean over ranks (or the sum, `gradients="sum"`).

    reduce_dtype: the dtype the gradients cross the link in: "float32" (default; a two-rank mean equals the
    single-process gradient exactly), "bfloat16" or "float16" (half the bytes; each rank's gradient, scaled
    by 1/world, and the sum are rounded to that dtype, then widened back to float32 for the optimizer).
    Every call's gradients go in one bucket, one all-reduce, issued as soon as the local backward has
    computed them. A float16 network's gradient scaler (dynamic scaling) also checks the reduced gradients,
    so that every rank takes the same decision to skip a step whose gradients overflowed on any rank.

    optimizer_split: whether the optimizer that `build_optimizer` builds (the Trainer builds it there from a config)
    is split over the ranks, ZeRO stage 1 (tinn/distributed/optimizer_split.py): the gradients are
    reduce-scattered instead of all-reduced, each rank steps its own slice of the parameters with optimizer
    state for that slice only, and the updated slices are all-gathered in float32. "auto" (default): split
    where the optimizer is elementwise (Adam, SGD), the reduce is float32 and there are several ranks, since
    the link then carries what a float32 all-reduce carries while the optimizer's pass and state shrink by the
    world size; the all-reduce otherwise (with a 16-bit reduce the split's float32 all-gather sends more).
    True: split, and a ConfigError for an optimizer that is not elementwise. False: the all-reduce and the
    whole optimizer on every rank. While a split optimizer steps this part, the backward
    leaves the tables' `.grad` None: the reduced gradients are the optimizer's slice."""

    def __init__(self, part: Part, group=None, gradients: str = "mean", reduce_dtype: str = "float32",
                 optimizer_split="auto"):
        if not isinstance(part, Part):
            raise ConfigError(f"Replicated needs a tinn.Part, got {type(part).__name__}")
        if reduce_dtype not in REDUCE_DTYPES:
            raise ConfigError(f"reduce_dtype={reduce_dtype!r} is not supported; allowed: {list(REDUCE_DTYPES)}")
        optimizer_split = check_split(optimizer_split)
        for t in part.parameter_tables():
            if t is not None and t.dtype != torch.float32:
                # A compact table's gradient is sparse, and each rank's entries differ: no all-reduce sums them.
                raise ConfigError(f"Replicated needs float32 tables; {type(part).__name__} has a {t.dtype} table "
                                  "(for a grid: table_dtype='float32')")
        super().__init__(part.n_input_dims, part.n_output_dims, part.n_networks)
        self._init_group(group, gradients)
        self.inner = part
        self.reduce_dtype = reduce_dtype
        self.optimizer_split = optimizer_split
        self._split = None  # the FlatSplit of the split optimizer that steps this part, once one is built
        self.uses_ids = part.uses_ids
        self.input_layouts, self.output_layouts = part.input_layouts, part.output_layouts

    def parameter_tables(self):
        return self.inner.parameter_tables()

    def graph_safe_collectives(self) -> bool:
        """Over NCCL, yes: its collectives (the all-reduce, or the split optimizer's reduce-scatter and
        all-gather) are NCCL kernels a CUDA graph captures, a replay issues the same collectives in the same order
        as a step op by op (ranks may replay or step op by op, each as its own trial decides), and nothing in its
        step reads the device on the host. Not over gloo (CPU collectives)."""
        return self.collective_device.type == "cuda" and torch.distributed.get_backend(self.group) == "nccl"

    def check_parameter_tables(self) -> None:
        self.inner.check_parameter_tables()

    def memory_bytes(self) -> int:
        return self.inner.memory_bytes()

    def n_params_per_network(self) -> int:
        return self.inner.n_params_per_network()

    def forward_with_context(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR):
        mark(self, "other")
        out = self.inner.forward_with_context(x, ids, train=train, x_layout=x_layout, y_layout=y_layout)
        mark(self, "compute")
        return out

    def fuses_loss(self, need_dx: bool = False) -> bool:
        return self.inner.fuses_loss(need_dx)

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        mark(self, "other")
        pieces = self._pieces(need_grads)
        if dy.shape[0]:
            with gradient_pieces.requested(pieces and pieces.request):
                dx, grads = self.inner.backward(ctx, dy, need_dx=need_dx, need_grads=need_grads)
        else:
            dx = torch.zeros(0, self.n_input_dims, device=dy.device) if need_dx else None
            grads = (None,) * len(self.inner.parameter_tables())
        mark(self, "compute")
        return dx, self._reduce(grads, need_grads, pieces)

    def backward_from_loss(self, ctx, y, loss, target, *, need_dx, need_grads=True):
        """The inner part's loss-seeded backward (the fused MLP computes the loss's gradient in its kernels), then
        the all-reduce. The loss returned is this rank's own."""
        if not y.shape[0]:  # the loss kernel, then `backward`
            return super().backward_from_loss(ctx, y, loss, target, need_dx=need_dx, need_grads=need_grads)
        mark(self, "other")
        pieces = self._pieces(need_grads)
        with gradient_pieces.requested(pieces and pieces.request):
            dx, grads, value = self.inner.backward_from_loss(ctx, y, loss, target, need_dx=need_dx,
                                                             need_grads=need_grads)
        mark(self, "compute")
        return dx, self._reduce(grads, need_grads, pieces), value

    def gradients_from_loss(self, x, ids, loss, target, *, need_dx, need_grads=True, x_layout=SAMPLE_MAJOR):
        """The inner part's `gradients_from_loss` (the tensor-core MLP's backward recomputes the forward: no
        forward kernel runs), then the all-reduce. The loss returned is this rank's own."""
        if not (x.shape[0] if x_layout == SAMPLE_MAJOR else x.shape[1]):
            return super().gradients_from_loss(x, ids, loss, target, need_dx=need_dx, need_grads=need_grads,
                                               x_layout=x_layout)
        mark(self, "other")
        pieces = self._pieces(need_grads)
        with gradient_pieces.requested(pieces and pieces.request):
            dx, grads, value = self.inner.gradients_from_loss(x, ids, loss, target, need_dx=need_dx,
                                                              need_grads=need_grads, x_layout=x_layout)
        mark(self, "compute")
        return dx, self._reduce(grads, need_grads, pieces), value

    def _pieces(self, need_grads: bool) -> PieceReduction | None:
        """The reduction by network ranges of this call (tinn/distributed/piece_reduction.py), or None: one
        bucket after the backward (a split optimizer, one rank, `tuning.reduce_pieces` = 1, no table to cut)."""
        n = runtime.tuning().reduce_pieces
        if not need_grads or self._split is not None or self.world_size < 2 or n < 2:
            return None
        table = piece_table(self.inner)
        tables = self.inner.parameter_tables()
        index = next((i for i, t in enumerate(tables) if t is table), None) if table is not None else None
        if index is None:
            return None
        scale = 1.0 / self.world_size if self.gradients == "mean" else 1.0
        dtype = REDUCE_DTYPES[self.reduce_dtype]

        def reduce(gradients):
            return _Reduction(gradients, scale, self.collective_device, self.group,
                              "the all-reduce of a range of replicated gradients", dtype)
        return PieceReduction(n, index, table.shape[0], reduce)

    def build_optimizer(self, config=None, named_params=None):
        """The optimizer of this part's tables from a tcnn-style optimizer config (default Adam): split over the
        ranks (a `SplitOptimizer`) as `optimizer_split` says, else `create_optimizer(config, named_params)`.
        The Trainer builds its optimizer here. named_params: default this part's `named_parameters()`; a split
        optimizer steps every trainable table of the part, so it must name exactly those.

        Raises:
            ConfigError: optimizer_split=True with an optimizer that is not elementwise, or named_params that
                are not the part's trainable tables.
        """
        from ..optimizers import create_optimizer
        from .optimizer_split import FlatSplit, SplitOptimizer, refuse_split, splittable

        config = {"otype": "Adam"} if config is None else config
        named = list(self.named_parameters() if named_params is None else named_params)
        split = self.optimizer_split
        if split is True and not splittable(config):
            raise refuse_split(config)
        if split == "auto":
            # A 16-bit reduce: the split's float32 all-gather sends more than the 16-bit all-reduce it replaces,
            # and it measured slower (docs/guides/sharding.md).
            split = self.world_size > 1 and splittable(config) and self.reduce_dtype == "float32"
        self._split = None
        if not split:
            return create_optimizer(config, named)
        tables = [t for t in self.parameter_tables() if t is not None and t.requires_grad]
        names = {id(p): n for n, p in named}
        if sorted(names) != sorted(id(t) for t in tables):
            raise ConfigError(f"named_params must be this Replicated part's trainable tables "
                              f"({[n for n, p in self.named_parameters() if p.requires_grad]}): the split optimizer "
                              "steps all of them; allowed otherwise: optimizer_split=False")
        named_tables = [(names[id(t)], t) for t in tables]
        layout = FlatSplit(named_tables, self.rank, self.world_size, self.collective_device, self._group, owner=self)
        optimizer = SplitOptimizer(config, named_tables, layout)
        self._split = layout
        return optimizer

    def _reduce(self, grads, need_grads: bool, pieces: PieceReduction | None = None) -> tuple:
        """The mean (or sum) over ranks of every table's gradient, in one bucket; every rank takes part, also
        one without samples (its gradient is zero, as the single-process gradient of its empty batch). With
        `pieces`, the table cut by network in its ranges (those the backward handed over are in flight already),
        the others in the bucket. With a split optimizer, reduce-scattered into its slice: no table gets a
        gradient."""
        if not need_grads:
            return grads
        tables = self.inner.parameter_tables()
        scale = 1.0 / self.world_size if self.gradients == "mean" else 1.0
        if self._split is not None:
            split = self._split
            by_table = {id(t): g for t, g in zip(tables, grads) if t is not None}
            split.reduce_scatter([by_table.get(id(t)) for t in split.tables], scale, REDUCE_DTYPES[self.reduce_dtype],
                                 "the reduce-scatter of replicated gradients")
            split.agree_on_overflow(gradient_scaling.scalers_of(self.inner), "the overflow flags' all-reduce")
            mark(self, "reduce")
            return (None,) * len(grads)
        grads = tuple(torch.zeros_like(t) if g is None and t is not None and t.requires_grad else g
                      for t, g in zip(tables, grads))

        def bucket(gradients):
            return _all_reduce_grads(gradients, scale, self.collective_device, self.group,
                                     "the all-reduce of replicated gradients", REDUCE_DTYPES[self.reduce_dtype])
        reduced = bucket(grads) if pieces is None else pieces.finish(grads, bucket)
        # Each rank's scaler saw only its own gradients; the reduced ones are the same everywhere, so
        # recording them gives every rank the same skip decision.
        for scaler in gradient_scaling.scalers_of(self.inner):
            scaler.record_non_finite(reduced)
        mark(self, "reduce")
        return reduced


# ---- initial values of the unsharded array -------------------------------------------------------
def _install_global_init(local: Part, n_networks: int, owned: list[int], shared_ids: set[int]) -> None:
    """Give the local networks the initial values of networks `owned` of an unsharded array, now and on
    every later `reset_parameters` (Trainer.reset calls it on each module)."""
    from ..encodings.grid import GridEncoding
    from ..initialisation import initial_weights
    from ..networks import NetworkArray

    rows = torch.tensor(owned, dtype=torch.long)
    for m in local.modules():
        params = m._parameters.get("params")  # the module's own table (composed parts only forward theirs)
        if not isinstance(params, torch.Tensor) or id(params) in shared_ids or not isinstance(m, Part):
            continue
        if isinstance(m, NetworkArray):
            def draw(seed, m=m):
                gen = torch.Generator().manual_seed(int(seed))
                return initial_weights(m.layer_shapes(), m.hidden_act, m.output_act, gen, n_networks)[rows]
        elif isinstance(m, GridEncoding):
            def draw(seed, m=m):
                local_n = m.n_networks
                m.n_networks = n_networks  # the unsharded draw: every network's row, ours kept
                try:
                    return m.initial_params(seed).cpu()[rows]
                finally:
                    m.n_networks = local_n
        else:
            raise ConfigError(f"init='global' does not know how {type(m).__name__} draws its tables; "
                              "allowed: init='local'")

        def reset(seed=None, m=m, draw=draw):
            with torch.no_grad():
                m.params.copy_(draw(m.seed if seed is None else seed).to(m.params.device))

        m.reset_parameters = reset  # an instance attribute: Trainer.reset reaches it through modules()
        reset()


def ids_of_rank(part: ShardedPart, rank_: int | None = None) -> torch.Tensor:
    """Global ids of the networks a rank owns (default: this one), int32 on tinn's device."""
    r = part.rank if rank_ is None else rank_
    return torch.tensor(part.ownership.owned(r), dtype=torch.int32, device=runtime.device())


__all__ = ["ShardedPart", "Replicated", "ids_of_rank"]
