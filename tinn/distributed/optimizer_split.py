"""The optimizer of a `Replicated` part split over the ranks (ZeRO stage 1): each rank steps its own slice.

    part = td.Replicated(array, reduce_dtype="bfloat16")      # optimizer_split="auto" (the default)
    trainer = tinn.Trainer(part, optimizer={"otype": "Adam"})  # the Trainer builds it with part.build_optimizer

The part's tables, in parameter order, laid end to end are one flat vector of P floats, padded with zeros to
P_pad = world x L; rank r owns the slice [r L, (r + 1) L). A step:

- backward (`FlatSplit.reduce_scatter`): every rank's gradients in one bucket (in the reduce dtype, with the
  mean's scale as the all-reduce applies it), reduce-scattered: rank r receives the sum over ranks of its
  slice only, widened to float32 (`grad`). The tables' own `.grad` stay None: the reduced gradient lives in
  the slice. A float16 network's scalers check the slice, and the ranks agree on the overflow verdict (a max
  over ranks of each scaler's flag) before the step decides to skip.
- step (`SplitOptimizer.step`): the wrapped optimizer steps the pieces of the tables that lie in the slice,
  and keeps optimizer state for them only; then every rank's slice is all-gathered in float32, so all ranks
  hold the same bits. A table with one part of the flat vector and no padding is gathered in place.

A ring all-reduce is a reduce-scatter followed by an all-gather, so the link carries the same bytes with a
float32 reduce; with a 16-bit reduce the all-gather stays float32. The optimizer's pass over memory and its
state shrink by the world size. Only optimizers that update every element from its own gradient and state
(`Optimizer.ELEMENTWISE`: Adam, SGD) can be split this way: their pieces, cut anywhere, step as the whole
table would. A piece is a run of whole rows of a table, or part of one row, so per-network learning-rate
scales (one per row) carry over unchanged.

Checkpoints hold the unsplit optimizer's state: `state_dict()` gathers every rank's slices (a collective,
every rank calls it), and `load_state_dict` takes such a state (from a split run of any world size, or an
unsplit one) and keeps this rank's slices, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import checks
from ..config import Section
from ..errors import CheckpointError, ConfigError, InputError
from ..optimizers.base import Optimizer, is_matrix_param, rows_of
from ..optimizers.registry import DEFAULT_OPTIMIZER, OPTIMIZERS, create_optimizer
from .process import agree_on_overflow, all_gather_flat, all_gather_objects, collective, reduce_scatter_flat
from .profile import mark

#: `Replicated(optimizer_split=...)`: "auto" splits where the optimizer allows it, True insists, False never.
SPLIT_CHOICES = ("auto", True, False)


def check_split(value):
    """`value` if it is one of SPLIT_CHOICES, else a ConfigError naming them."""
    if not any(value is c or (isinstance(c, str) and value == c) for c in SPLIT_CHOICES):
        raise ConfigError(f"optimizer_split={value!r} is not supported; allowed: {list(SPLIT_CHOICES)}")
    return value


def optimizer_class(config) -> type:
    """The optimizer class a config builds (its otype, tcnn's default when absent)."""
    cfg = config if isinstance(config, Section) else Section(config if config is not None else {}, "optimizer")
    return OPTIMIZERS[cfg.otype(list(OPTIMIZERS), default=DEFAULT_OPTIMIZER)]


def splittable(config) -> bool:
    """Whether the optimizer a config builds updates each element on its own (it can step any slice)."""
    return bool(getattr(optimizer_class(config), "ELEMENTWISE", False))


def refuse_split(config) -> ConfigError:
    """The error for optimizer_split=True with an optimizer that is not elementwise."""
    cls = optimizer_class(config)
    allowed = sorted(k for k, c in OPTIMIZERS.items() if getattr(c, "ELEMENTWISE", False))
    return ConfigError(f"optimizer_split=True needs an elementwise optimizer; {cls.otype} is not (its update of an "
                       f"element reads other elements of the table); allowed otypes: {allowed}, or "
                       "optimizer_split='auto' / False (the all-reduce and the whole optimizer on every rank)")


@dataclass
class Piece:
    """Part of one table in this rank's slice: `view` (rows, cols) into the table, covering flat elements
    [flat_lo, flat_hi) of the layout and rows [row_lo, row_hi) of the table."""
    table: int
    name: str
    view: torch.Tensor
    flat_lo: int
    flat_hi: int
    row_lo: int
    row_hi: int


def _pieces_of(t: int, name: str, table: torch.Tensor, offset: int, lo: int, hi: int) -> list[Piece]:
    """The pieces of table `t` (at flat `offset`) inside the flat range [lo, hi): a partial first row, whole rows,
    a partial last row."""
    rows = rows_of(table)
    cols = table.numel() // rows
    grid = table.detach().view(rows, cols)
    a, b = max(lo, offset) - offset, min(hi, offset + table.numel()) - offset
    out = []
    while a < b:
        row, col = divmod(a, cols)
        if col or b - a < cols:  # a part of one row
            end = min(b, (row + 1) * cols)
            view, row_hi = grid[row:row + 1, col:col + end - a], row + 1
        else:  # whole rows
            row_hi = b // cols
            end = row_hi * cols
            view = grid[row:row_hi]
        out.append(Piece(t, f"{name}#{len(out)}", view, offset + a, offset + end, row, row_hi))
        a = end
    return out


class FlatSplit:
    """The flat layout of a Replicated part's tables over the ranks, the reduced gradient slice, and the two
    collectives (reduce-scatter of gradients, all-gather of parameters)."""

    def __init__(self, named_tables: list[tuple[str, torch.Tensor]], rank: int, world: int, device, group,
                 owner=None):
        self.owner = owner  # the part whose profiler (tinn/distributed/profile.py) the optimizer's phases go to
        self.names = [n for n, _ in named_tables]
        self.tables = [t for _, t in named_tables]
        self.rank, self.world, self.collective_device, self.group = rank, world, device, group
        self.offsets, total = [], 0
        for t in self.tables:
            self.offsets.append(total)
            total += t.numel()
        self.numel = total
        self.slice_len = -(-total // world)  # the padded vector is world x slice_len
        self.padded = self.slice_len * world
        self.lo = rank * self.slice_len
        self.hi = self.lo + self.slice_len
        self.pieces = [p for i, (n, t) in enumerate(named_tables)
                       for p in _pieces_of(i, n, t, self.offsets[i], self.lo, self.hi)]
        dev = self.tables[0].device
        self.grad = torch.zeros(self.slice_len, dtype=torch.float32, device=dev)
        self.has_grad = False  # whether `grad` holds this step's reduced gradients (else it is stale)

    # ---- gradients -------------------------------------------------------------------------------
    def _bucket(self, grads, dtype, scale: float) -> torch.Tensor:
        """The flat padded vector of this rank's gradients in `dtype`, times `scale` (one cast pass per table);
        a single float32 table without padding is its own bucket."""
        if dtype == torch.float32 and scale == 1.0 and len(self.tables) == 1 and self.padded == self.numel \
                and grads[0] is not None and grads[0].is_contiguous():
            return grads[0].view(-1)
        flat = torch.empty(self.padded, dtype=dtype, device=self.tables[0].device)
        for g, offset, t in zip(grads, self.offsets, self.tables):
            piece = flat[offset:offset + t.numel()]
            if g is None:
                piece.zero_()
            elif scale != 1.0:
                torch.mul(g.reshape(-1), scale, out=piece)  # the cast and the scale in one pass
            else:
                piece.copy_(g.reshape(-1))
        flat[self.numel:].zero_()
        return flat

    def reduce_scatter(self, grads, scale: float, dtype: torch.dtype, what: str) -> None:
        """Sum every rank's `grads` (one per table, None for zero) over ranks, times `scale`; this rank keeps its
        slice in `grad` (added to it when it already holds gradients of this step). A float32 reduce sums
        first and scales after (a two-rank mean is then exact); a narrower one scales first, so that float16
        holds each rank's share without overflowing."""
        pre = 1.0 if dtype == torch.float32 else scale
        post = scale / pre
        bucket = self._bucket(grads, dtype, pre)
        if bucket.device != self.collective_device:
            bucket = bucket.to(self.collective_device)
        direct = dtype == torch.float32 and not self.has_grad and self.grad.device == self.collective_device
        out = self.grad if direct else torch.empty(self.slice_len, dtype=dtype, device=self.collective_device)
        with collective(what, self.group):
            reduce_scatter_flat(out, bucket, group=self.group)
        if direct:
            if post != 1.0:
                out.mul_(post)
        elif self.has_grad:
            self.grad.add_(out.to(self.grad.device, torch.float32), alpha=post)
        else:
            torch.mul(out.to(self.grad.device), post, out=self.grad)
        self.has_grad = True

    def agree_on_overflow(self, scalers, what: str) -> None:
        """Every scaler records whether this rank's slice of the reduced gradients is finite, and learns every
        rank's verdict (a max over ranks, on the device): all ranks then skip a step or take it alike."""
        for s in scalers:
            s.record_non_finite([self.grad])
        agree_on_overflow(scalers, self.collective_device, self.group, what)

    # ---- parameters ------------------------------------------------------------------------------
    def _in_place(self) -> bool:
        return len(self.tables) == 1 and self.padded == self.numel and self.tables[0].is_contiguous() \
            and self.tables[0].device == self.collective_device

    def all_gather_params(self, what: str) -> None:
        """Every rank's slice of the parameters (just stepped) to every rank, in float32."""
        if self._in_place():
            flat = self.tables[0].detach().view(-1)
            with collective(what, self.group):
                all_gather_flat(flat, flat[self.lo:self.hi], group=self.group)
            return
        full = self.all_gather(self.gather_slice([p.view for p in self.pieces], torch.float32), what)
        with torch.no_grad():
            for t, offset in zip(self.tables, self.offsets):
                t.view(-1).copy_(full[offset:offset + t.numel()])

    def gather_slice(self, per_piece, dtype) -> torch.Tensor:
        """This rank's slice as one (slice_len,) tensor on the collective device, from one tensor per piece
        (None: zeros); the padding is zero."""
        send = torch.zeros(self.slice_len, dtype=dtype, device=self.collective_device)
        for p, value in zip(self.pieces, per_piece):
            if value is not None:
                send[p.flat_lo - self.lo:p.flat_hi - self.lo].copy_(value.reshape(-1))
        return send

    def all_gather(self, local: torch.Tensor, what: str) -> torch.Tensor:
        """Every rank's (slice_len,) `local` end to end: the padded flat vector, on the collective device."""
        full = torch.empty(self.padded, dtype=local.dtype, device=self.collective_device)
        with collective(what, self.group):
            all_gather_flat(full, local, group=self.group)
        return full


class SplitOptimizer(Optimizer):
    """An elementwise optimizer stepping only this rank's slice of a Replicated part's parameters (see the
    module's notes). Built by `Replicated.build_optimizer`; the Trainer uses it as any optimizer."""

    otype = "Split"

    def __init__(self, config, named_params, split: FlatSplit):
        super().__init__(named_params, "optimizer")
        self.split = split
        matrix = {n: is_matrix_param(n, p) for n, p in named_params}
        views = []
        for piece in split.pieces:
            piece.view.tinn_matrix = matrix[split.names[piece.table]]  # the table's kind, whatever the piece's name
            views.append((piece.name, piece.view))
        self.inner = create_optimizer(config, views)
        # The unsplit optimizer's state layout, from one (1, 1) stand-in per table: which keys hold elementwise
        # tensors, row scales, per-table scalars.
        probes = []
        for n, p in named_params:
            probe = torch.zeros(1, 1, dtype=torch.float32, device=p.device)
            probe.tinn_matrix = matrix[n]
            probes.append((n, probe))
        # (A fresh optimizer that never steps: its state is read for the layout only, once.)
        self._probe_state = create_optimizer(config, probes).state_dict()
        self._state_kinds = self._kinds()
        self._rows = {n: rows_of(p) for n, p in named_params}
        self._lr_scales = {n: torch.ones(self._rows[n], dtype=torch.float32, device=p.device)
                           for n, p in named_params}

    # ---- stepping --------------------------------------------------------------------------------
    @property
    def skips_on_device(self) -> bool:
        return self.inner.skips_on_device

    def step(self, skip: torch.Tensor | None = None) -> None:
        """The wrapped optimizer's step on this rank's slice (its reduced gradients), then the all-gather of
        the parameters. No gradient since `zero_grad` (no backward ran on any rank): nothing happens."""
        split = self.split
        if not split.has_grad:
            return
        mark(split.owner, "other")
        for piece in split.pieces:
            piece.view.grad = split.grad[piece.flat_lo - split.lo:piece.flat_hi - split.lo].view(piece.view.shape)
        try:
            self.inner.step(skip)
        finally:
            for piece in split.pieces:
                piece.view.grad = None
        mark(split.owner, "optimizer")
        split.all_gather_params("the all-gather of the split optimizer's parameters")
        split.has_grad = False
        mark(split.owner, "reduce")

    def zero_grad(self) -> None:
        super().zero_grad()
        self.split.has_grad = False

    # ---- a step captured as a CUDA graph (tinn/step_graphs.py): the wrapped optimizer's, the all-gather with it
    def graph_key(self, device):
        inner = self.inner.graph_key(device)
        return None if inner is None else (self, inner)

    def begin_capture(self, device) -> None:
        self.inner.begin_capture(device)

    def end_capture(self) -> None:
        self.inner.end_capture()

    def load_graph_counts(self) -> None:
        self.inner.load_graph_counts()

    def host_counts(self) -> dict:
        return {**super().host_counts(), **self.inner.host_counts()}

    def settle(self) -> None:
        self.inner.settle()

    def device_step_count(self, device):
        return self.inner.device_step_count(device)

    @property
    def step_count(self) -> int:
        return self.inner.step_count

    def _get_lr(self) -> float:
        return self.inner.learning_rate

    def _set_lr(self, value: float) -> None:
        self.inner.learning_rate = value

    def lr_scale(self, name: str) -> torch.Tensor:
        self._check_name(name)
        return self._lr_scales[name]

    def set_lr_scale(self, name: str, scale: torch.Tensor | None) -> None:
        self._check_name(name)
        own = self._lr_scales[name]
        if scale is None:
            own.fill_(1.0)
        else:
            if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or scale.shape != own.shape:
                got = f"{tuple(scale.shape)} {scale.dtype}" if isinstance(scale, torch.Tensor) else type(scale).__name__
                raise InputError(f"lr scale for {name!r} must be a float32 tensor of shape {tuple(own.shape)} "
                                 f"(one value per network), got {got}")
            checks.check_device("lr scale", scale)
            own.copy_(scale)
        t = self.split.names.index(name)
        for piece in self.split.pieces:
            if piece.table == t:
                self.inner.set_lr_scale(piece.name, own[piece.row_lo:piece.row_hi])

    def hyperparams(self) -> dict:
        return self.inner.hyperparams()

    # ---- state: the unsplit optimizer's -------------------------------------------------------------
    def _kinds(self) -> dict[str, tuple[str, int | None]]:
        """Every key of the unsplit state: ("element", table) for per-element tensors, ("row", table) for row
        scales, ("scalar", table) for per-table scalars, ("global", None) for the rest."""
        out = {}
        for key, value in self._probe_state.items():
            table = next((t for t, n in sorted(enumerate(self.split.names), key=lambda e: -len(e[1]))
                          if key.endswith("." + n)), None)
            if table is None:
                out[key] = ("global", None)
            elif key == f"lr_scale.{self.split.names[table]}":
                out[key] = ("row", table)
            elif isinstance(value, torch.Tensor):
                if value.shape != (1, 1):
                    raise ConfigError(f"optimizer state {key!r} of shape {tuple(value.shape)} is not elementwise; "
                                      "the split optimizer cannot save it")
                out[key] = ("element", table)
            else:
                out[key] = ("scalar", table)
        return out

    def _piece_key(self, key: str, table: int, piece: Piece) -> str:
        return key[:-len(self.split.names[table])] + piece.name

    def _collect(self, out, prefix: str) -> None:
        """The unsplit state's layout (meta tensors of its shapes and dtypes, this rank's scalars), which
        `check_state_dict` compares a state with."""
        probe = self._probe_state
        inner = self.inner.state_dict()
        for key, (kind, table) in self._state_kinds.items():
            if kind == "global":
                out[prefix + key] = inner[key]
            elif kind == "scalar":
                out[prefix + key] = probe[key]
            else:
                rows = self._rows[self.split.names[table]]
                shape = (rows,) if kind == "row" else (rows, self.split.tables[table].numel() // rows)
                out[prefix + key] = torch.empty(shape, dtype=probe[key].dtype, device="meta")

    def state_dict(self):
        """The whole optimizer's state, as the unsplit optimizer's `state_dict()` holds it: every rank's slices
        gathered. A collective: every rank calls it (`trainer.save_checkpoint` on every rank; one file is enough)."""
        split = self.split
        inner = self.inner.state_dict()
        kinds = self._state_kinds
        out, scalars = {}, {}
        for key, (kind, table) in kinds.items():
            if kind == "global":
                out[key] = inner[key]
            elif kind == "row":
                out[key] = self._lr_scales[split.names[table]].clone()
            elif kind == "scalar":
                mine = [inner[self._piece_key(key, table, p)] for p in split.pieces if p.table == table]
                scalars[key] = mine[0] if mine else None
        # Scalars of tables with no piece here come from the rank that has one (every piece counts alike).
        for theirs in all_gather_objects(scalars, "the split optimizer's state gather", split.group):
            for key, value in theirs.items():
                if out.get(key) is None and value is not None:
                    out[key] = value
        for key, (kind, table) in kinds.items():
            if kind == "scalar" and out.get(key) is None:
                out[key] = self._probe_state[key]  # an empty table: never stepped
        element_keys = [k for k, (kind, _) in kinds.items() if kind == "element"]
        prefixes = sorted({k[:-len(split.names[kinds[k][1]])] for k in element_keys})
        for prefix in prefixes:  # one gather per state kind ("m.", "v.", ...), over every table that has it
            keys = {kinds[k][1]: k for k in element_keys if k.startswith(prefix)
                    and k[len(prefix):] == split.names[kinds[k][1]]}
            dtype = self._probe_state[next(iter(keys.values()))].dtype
            local = split.gather_slice([inner[self._piece_key(keys[p.table], p.table, p)] if p.table in keys else None
                                        for p in split.pieces], dtype)
            full = split.all_gather(local, "the split optimizer's state gather")
            for table, key in keys.items():
                t, offset = split.tables[table], split.offsets[table]
                rows = self._rows[split.names[table]]
                out[key] = full[offset:offset + t.numel()].view(rows, -1).to(t.device).clone()
        return out

    def _restore(self, state, prefix: str) -> None:
        """This rank's slices of an unsplit state (checked by `check_state_dict`)."""
        split = self.split
        inner = {}
        for key, (kind, table) in self._state_kinds.items():
            value = state[prefix + key]
            if kind == "global":
                inner[key] = value
                continue
            for p in split.pieces:
                if p.table != table:
                    continue
                if kind == "scalar":
                    inner[self._piece_key(key, table, p)] = value
                elif kind == "row":
                    inner[self._piece_key(key, table, p)] = value[p.row_lo:p.row_hi]
                else:
                    lo = p.flat_lo - split.offsets[table]
                    inner[self._piece_key(key, table, p)] = value.reshape(-1)[lo:lo + p.view.numel()].view(p.view.shape)
        try:
            self.inner.load_state_dict(inner)
        except CheckpointError as e:
            raise CheckpointError(f"split optimizer: {e}") from None
        for key, (kind, table) in self._state_kinds.items():
            if kind == "row":
                self._lr_scales[split.names[table]].copy_(state[prefix + key])
