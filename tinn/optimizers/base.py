"""The optimizer contract shared by leaf optimizers (SGD, Adam, ...) and wrappers (EMA, Composite, ...).

An optimizer owns a list of named float32 parameters living on tinn's device. Each
parameter is viewed as (rows, cols) with one row per network of an array (its first
dimension; a 0-d tensor is one row), which is what per-network learning-rate scales
(`set_lr_scale`) index. `step()` reads `p.grad` and updates every parameter in place
with one kernel per tensor; parameters whose grad is None are left alone.

State is kept flat so checkpoints need no pickle: `state_dict()` maps keys to tensors
or plain scalars; a wrapper stores its nested optimizer's entries under `nested.`
(Composite: `nested.0.`, `nested.1.`, ...). `load_state_dict` restores a run bit-exactly.

Skipping on the device: `step(skip=flag)` takes a (1,) int32 device flag (a float16 network's gradient
scaler's verdict, tinn/gradient_scaling.py); where it is 1 the step changes neither the parameters nor the
state, as torch's fused Adam with `found_inf`. Optimizers with `skips_on_device` read the flag in their kernels,
so the step never waits for the GPU; their host step counts count the steps asked for, and a device count of
those skipped is subtracted when the host next needs them (`settle`: `step_count`, `state_dict`). The others
read the flag on the host (one sync) and skip the whole call.
"""
from __future__ import annotations

import contextlib

import torch

from .. import checks, memory, runtime, step_graphs
from ..config import Section
from ..errors import CheckpointError, ConfigError, InputError

State = dict  # str -> torch.Tensor | int | float | str | bool
# The optimizers that step compact (bfloat16) tables from their sparse gradients (the `COMPACT` flag).
COMPACT_OPTIMIZERS = "Adam, or ExponentialDecay around Adam"


def rows_of(p: torch.Tensor) -> int:
    return int(p.shape[0]) if p.dim() >= 1 and p.shape[0] > 0 else 1


def as_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """(rows, cols) view sharing memory with `t` (which must be contiguous)."""
    return t.view(rows, -1)


def is_matrix_param(name: str, p: torch.Tensor) -> bool:
    """tcnn's matrix/non-matrix split: network weights are matrix params, encoding tables are not.

    A tensor attribute `tinn_matrix` (bool) overrides; otherwise any dotted name component
    starting with "encoding" marks a non-matrix parameter.
    """
    flag = getattr(p, "tinn_matrix", None)
    if flag is not None:
        return bool(flag)
    return not any(part.startswith("encoding") for part in name.split("."))


def layer_shapes(name: str, p: torch.Tensor) -> list[tuple[int, int]] | None:
    """The weight matrices in each network row of `p`, as (fan_out, fan_in) row-major blocks, or None.

    Taken from the tensor attribute `tinn_layer_shapes` (set by network modules whose rows hold several
    layers); a 3-D tensor (networks, M, N) is one M x N matrix per network. Novograd and Shampoo use it.
    """
    shapes = getattr(p, "tinn_layer_shapes", None)
    if shapes is not None:
        shapes = [(int(a), int(b)) for a, b in shapes]
        cols = p.numel() // rows_of(p)
        if sum(a * b for a, b in shapes) != cols or any(a < 1 or b < 1 for a, b in shapes):
            raise InputError(f"parameter {name!r}: tinn_layer_shapes {shapes} do not tile its {cols} values per network")
        return shapes
    if p.dim() == 3 and p.numel():
        return [(int(p.shape[1]), int(p.shape[2]))]
    return None


def validate_params(named_params, compact: bool = False, owner: str = "this optimizer"
                    ) -> list[tuple[str, torch.Tensor]]:
    """The (name, parameter) pairs, checked; bfloat16 ones (compact grid tables, stepped from sparse
    gradients) only where `compact` says the optimizer steps them."""
    runtime.require_init()
    out, seen = [], set()
    for item in named_params:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise InputError("named_params must be a list of (name, torch.nn.Parameter) pairs, "
                             f"got an item of type {type(item).__name__}")
        name, p = item
        if name in seen:
            raise InputError(f"parameter name {name!r} appears twice in named_params")
        seen.add(name)
        if p.dtype == torch.bfloat16 and not compact:
            raise InputError(f"parameter {name!r} is a compact (bfloat16) table, which {owner} cannot step; "
                             f"allowed for compact tables: {COMPACT_OPTIMIZERS}")
        if p.dtype not in (torch.float32, torch.bfloat16):
            raise InputError(f"parameter {name!r} has dtype {p.dtype}; allowed: torch.float32 (and torch.bfloat16 "
                             f"for compact grid tables)")
        checks.check_device(f"parameter {name!r}", p)
        if not p.is_contiguous():
            raise InputError(f"parameter {name!r} must be contiguous (updated in place through a flat view)")
        out.append((name, p))
    return out


def _same_scalar_kind(value, mine) -> bool:
    """Whether `value` can replace the scalar `mine` (an int count stays an int; a float may come as an int)."""
    if isinstance(mine, bool) or isinstance(value, bool):
        return isinstance(mine, bool) and isinstance(value, bool)
    if isinstance(mine, int):
        return isinstance(value, int)
    if isinstance(mine, float):
        return isinstance(value, (int, float))
    return type(value) is type(mine)


class Optimizer:
    """Base class. Subclasses fill `scalars` (plain values saved in the state dict), `state`
    (tensors saved in the state dict) and `children` (nested optimizers with key prefixes)."""

    otype = "Optimizer"
    # Every key of this optimizer's config besides "otype"; `create_optimizer` rejects any other.
    OPTIONS: tuple[str, ...] | None = None
    # Whether it steps compact (bfloat16) tables, whose gradients are sparse.
    COMPACT = False
    # Whether its kernels read `step(skip=...)`'s flag on the device (see the module's notes).
    SKIPS_ON_DEVICE = False
    # Whether each element's update reads only that element's gradient, state and row scale (and counts shared
    # by the whole tensor): then any slice of a tensor steps as the whole would (tinn/distributed/optimizer_split.py).
    ELEMENTWISE = False

    def __init__(self, named_params, path: str = "optimizer"):
        self.named_params = validate_params(named_params, self.COMPACT, f"{self.otype} ({path})")
        self.params = dict(self.named_params)
        self.path = path
        self.scalars: dict[str, int | float | bool | str] = {}
        self.state: dict[str, torch.Tensor] = {}
        self.children: list[tuple[str, "Optimizer"]] = []

    # ---- stepping -------------------------------------------------------------------------------
    @property
    def skips_on_device(self) -> bool:
        """Whether `step(skip=flag)` reads the flag on the device (no host sync)."""
        return self.SKIPS_ON_DEVICE

    def step(self, skip: torch.Tensor | None = None) -> None:
        """One update of every parameter from its `.grad` (None: that parameter is skipped).

        Args:
            skip: None, or a (1,) int32 flag on the device: 1 leaves parameters and state as they are (the
                gradients overflowed float16). Read on the device where `skips_on_device`, else on the host.
        """
        step_graphs.refuse_in_callers_capture(
            f"{type(self).__name__}.step (a tinn optimizer)",
            "use a torch optimizer built with capturable=True there, or tinn's Trainer, which captures its own steps")
        if skip is not None:
            if not isinstance(skip, torch.Tensor) or skip.shape != (1,) or skip.dtype != torch.int32:
                raise InputError(f"skip must be a (1,) int32 tensor, got {type(skip).__name__}"
                                 f"{tuple(getattr(skip, 'shape', ()))}")
            if not self.skips_on_device:
                if bool(skip.item()):
                    return
                skip = None
        grads = {}
        for name, p in self.named_params:
            g = p.grad
            if g is not None:
                if g.shape != p.shape or g.dtype != p.dtype:
                    raise InputError(f"gradient of {name!r} is {tuple(g.shape)} {g.dtype}; expected "
                                     f"{tuple(p.shape)} {p.dtype}")
                if p.dtype == torch.bfloat16:  # a compact table: stepped where its gradient has entries
                    g = (g if g.is_sparse else g.to_sparse()).detach().coalesce()
                else:
                    g = g.detach().contiguous()
            grads[name] = g
        with torch.no_grad():
            self._apply(grads, skip)

    def _apply(self, grads: dict[str, torch.Tensor | None], skip: torch.Tensor | None = None) -> None:
        """The update from `grads`; `skip` (only where `skips_on_device`): the device flag, read by the kernels."""
        raise NotImplementedError

    def settle(self) -> None:
        """Bring host step counts up to date with the steps skipped on the device (a host read, where any may
        have been); nested optimizers too."""
        for _, child in self.children:
            child.settle()

    def device_step_count(self, device) -> tuple[int, torch.Tensor]:
        """(steps asked of the host count behind `step_count`, the (1,) int32 device count of those skipped and
        not yet settled): the steps taken are their difference, known on the device without a host read."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        for _, p in self.named_params:
            p.grad = None

    # ---- learning rate ---------------------------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        return self._get_lr()

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        value = float(value)
        if not value >= 0.0 or value == float("inf"):
            raise ConfigError(f"{self.path}.learning_rate={value!r} is out of range; allowed: >= 0")
        self._set_lr(value)

    def _get_lr(self) -> float:
        raise NotImplementedError

    def _set_lr(self, value: float) -> None:
        raise NotImplementedError

    @property
    def step_count(self) -> int:
        return int(self.scalars["step_count"])

    def set_lr_scale(self, name: str, scale: torch.Tensor | None) -> None:
        """Per-network learning-rate multipliers for parameter `name`: a (rows,) float32 tensor, one
        value per network (the parameter's first dimension). None resets to 1."""
        raise NotImplementedError

    def lr_scale(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    # ---- weights for inference -------------------------------------------------------------------
    def inference_params(self, name: str) -> torch.Tensor:
        """The weights to evaluate with. The live parameter, except for EMA / Average / Lookahead,
        which return their averaged (slow) weights, as tcnn's `custom_weights`."""
        self._check_name(name)
        return self.params[name]

    def _inference_params_now(self, name: str) -> torch.Tensor:
        """`inference_params` without a host read, for a step in progress (the wrappers that average override
        it or step on the host)."""
        return self.inference_params(name)

    @contextlib.contextmanager
    def swap_in_inference_params(self):
        """Temporarily copy `inference_params` into the parameters (e.g. to render with EMA weights);
        the live training weights are restored on exit."""
        saved = {}
        with torch.no_grad():
            for name, p in self.named_params:
                src = self.inference_params(name)
                if src is not p:
                    saved[name] = p.detach().clone()
                    p.copy_(src)
        try:
            yield self
        finally:
            with torch.no_grad():
                for name, value in saved.items():
                    self.params[name].copy_(value)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> State:
        self.settle()
        out: State = {}
        self._collect(out, "")
        return out

    def _collect(self, out: State, prefix: str) -> None:
        out[prefix + "otype"] = self.otype
        for k, v in self.scalars.items():
            out[prefix + k] = v
        for k, t in self.state.items():
            out[prefix + k] = t
        for child_prefix, child in self.children:
            child._collect(out, prefix + child_prefix)

    def load_state_dict(self, state: State) -> None:
        """Restore from `state_dict()` output; every key must match (names, shapes, optimizer types).
        Everything is checked before anything changes."""
        self.check_state_dict(state)
        with torch.no_grad():
            self._restore(state, "")

    def check_state_dict(self, state: State) -> None:
        """Raise CheckpointError unless `load_state_dict(state)` would restore every entry."""
        own: State = {}
        self._collect(own, "")
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise CheckpointError(f"optimizer state does not match this optimizer (missing {missing[:8]}, "
                                  f"unexpected {unexpected[:8]})")
        for key, mine in own.items():
            value = state[key]
            if isinstance(mine, torch.Tensor):
                if not isinstance(value, torch.Tensor) or value.shape != mine.shape or value.dtype != mine.dtype:
                    got = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else repr(value)
                    raise CheckpointError(f"optimizer state {key!r} is {got}; expected {tuple(mine.shape)} {mine.dtype}")
            elif key.endswith("otype"):
                if value != mine:
                    raise CheckpointError(f"optimizer state {key!r} is {value!r}; this optimizer is {mine!r}")
            elif not _same_scalar_kind(value, mine):
                raise CheckpointError(f"optimizer state {key!r} is {value!r}; expected a {type(mine).__name__}")

    def _restore(self, state: State, prefix: str) -> None:
        for k, v in self.scalars.items():
            self.scalars[k] = type(v)(state[prefix + k])
        for k, t in self.state.items():
            t.copy_(state[prefix + k])
        for child_prefix, child in self.children:
            child._restore(state, prefix + child_prefix)
        self._after_restore()

    def _after_restore(self) -> None:
        pass

    # ---- steps replayed as CUDA graphs (tinn/step_graphs.py) --------------------------------------
    def graph_key(self, device) -> tuple | None:
        """What a step captured as a CUDA graph takes from the host besides its tensors (a replay is valid while
        this is unchanged), or None where this optimizer's step cannot be captured (the default: its kernels
        read host values that change every step, or it reads the device on the host)."""
        return None

    def state_storage(self) -> tuple:
        """Where every state tensor of this optimizer and its nested ones lives, by name: a captured step reads
        those storages, so a graph key holds them (a tensor replaced by another captures again)."""
        own: State = {}
        self._collect(own, "")
        return tuple((k, v.data_ptr()) for k, v in own.items() if isinstance(v, torch.Tensor))

    def begin_capture(self, device) -> None:
        """A step is about to be captured: from here until `end_capture`, host values that change every step
        (step counts) are passed through device tensors that `load_graph_counts` fills before each replay."""

    def end_capture(self) -> None:
        """The capture is over (launches are issued as before)."""

    def load_graph_counts(self) -> None:
        """Before a replay: the device copies of the host step counts, from the host counts."""

    def host_counts(self) -> dict:
        """Every numeric host scalar of this optimizer and its nested ones, by (optimizer, key): a capture records
        how a step moves them, and a refused one puts them back (`set_host_counts`)."""
        out = {(self, k): v for k, v in self.scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for _, child in self.children:
            out.update(child.host_counts())
        return out

    @staticmethod
    def set_host_counts(counts: dict) -> None:
        for (owner, key), value in counts.items():
            owner.scalars[key] = value

    # ---- misc ------------------------------------------------------------------------------------
    def hyperparams(self) -> dict:
        raise NotImplementedError

    def _check_name(self, name: str) -> None:
        if name not in self.params:
            raise InputError(f"unknown parameter {name!r}; this optimizer has {list(self.params)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.hyperparams()})"


class LeafOptimizer(Optimizer):
    """An optimizer that updates parameters itself; handles learning rate, per-network scales, steps."""

    def __init__(self, named_params, cfg: Section, default_lr: float = 1e-3):
        super().__init__(named_params, cfg.path)
        self.scalars["step_count"] = 0
        # Steps skipped on the device since the host last settled, per host count (`scalars` key): (n,) int32,
        # created with the first skip flag; and per set of counts advanced together, the mask that adds a skip.
        self._pending: torch.Tensor | None = None
        self._pending_keys: dict[str, int] = {"step_count": 0}
        self._pending_masks: dict[tuple[str, ...], torch.Tensor] = {}
        self._pending_views: dict[str, torch.Tensor] = {}   # (1,) views of `_pending`, one per key, made once
        self._unsettled = False
        # A (1,) float32 learning rate on the device, set by a schedule that computes it there
        # (ExponentialDecay on the device): the kernels then take it in place of `learning_rate`.
        self.device_learning_rate: torch.Tensor | None = None
        self.scalars["learning_rate"] = cfg.number("learning_rate", default_lr, lo=0.0)
        self.rows = {name: rows_of(p) for name, p in self.named_params}
        for name, p in self.named_params:
            self.state[f"lr_scale.{name}"] = torch.ones(self.rows[name], dtype=torch.float32, device=p.device)

    def new_state(self, kind: str, name: str, dtype=torch.float32) -> torch.Tensor:
        """A zeroed (rows, cols) state tensor for parameter `name`, registered as `kind.name`."""
        p = self.params[name]
        cols = max(p.numel() // self.rows[name], 0)
        memory.check_fits(f"{self.path} state {kind}.{name} ({self.rows[name]} x {cols} {dtype})",
                          {f"{kind}.{name}": self.rows[name] * cols * torch.empty((), dtype=dtype).element_size()},
                          p.device)
        t = torch.zeros(self.rows[name], cols, dtype=dtype, device=p.device)
        self.state[f"{kind}.{name}"] = t
        return t

    def _get_lr(self) -> float:
        return float(self.scalars["learning_rate"])

    def _set_lr(self, value: float) -> None:
        self.scalars["learning_rate"] = float(value)

    def lr_scale(self, name: str) -> torch.Tensor:
        self._check_name(name)
        return self.state[f"lr_scale.{name}"]

    def set_lr_scale(self, name: str, scale: torch.Tensor | None) -> None:
        self._check_name(name)
        own = self.state[f"lr_scale.{name}"]
        if scale is None:
            own.fill_(1.0)
            return
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or tuple(scale.shape) != tuple(own.shape):
            got = f"{tuple(scale.shape)} {scale.dtype}" if isinstance(scale, torch.Tensor) else type(scale).__name__
            raise InputError(f"lr scale for {name!r} must be a float32 tensor of shape {tuple(own.shape)} "
                             f"(one value per network), got {got}")
        checks.check_device("lr scale", scale)
        own.copy_(scale)

    @property
    def step_count(self) -> int:
        self.settle()
        return int(self.scalars["step_count"])

    def count_step(self, keys: tuple[str, ...], skip: torch.Tensor | None) -> None:
        """A step asked of the host counts `keys` (`scalars` entries, "step_count" among them): each goes up
        by one, and where `skip` is a device flag, its pending count by the flag (no host read)."""
        for key in keys:
            self.scalars[key] += 1
        if skip is None:
            return
        if self._pending is None:
            self._pending = torch.zeros(len(self._pending_keys), dtype=torch.int32, device=skip.device)
        mask = self._pending_masks.get(keys)
        if mask is None:  # built on the device, slot by slot (a tensor from host data would sync)
            mask = torch.zeros_like(self._pending)
            for key in keys:
                i = self._pending_keys[key]
                mask[i:i + 1].fill_(1)
            runtime.keep(self._pending_masks, keys, mask)
        self._pending.addcmul_(mask, skip)
        self._unsettled = True

    def device_step_count(self, device) -> tuple[int, torch.Tensor]:
        return int(self.scalars["step_count"]), self.pending("step_count", device)

    def rate_operands(self, share: float, device) -> tuple[float, torch.Tensor]:
        """(host rate, (1,) device factor) whose product is the kernels' learning rate, `share` x the optimizer's:
        `learning_rate * share` times one, or `share` times the `device_learning_rate`."""
        if self.device_learning_rate is None:
            return self.learning_rate * share, unit_factor(device)
        return share, self.device_learning_rate

    def pending(self, key: str, device) -> torch.Tensor:
        """The (1,) device count of `key`'s steps skipped since the host last settled (zeros before any skip
        flag), for kernels that compute with the count taken."""
        view = self._pending_views.get(key)
        if view is None:
            if self._pending is None:
                self._pending = torch.zeros(len(self._pending_keys), dtype=torch.int32, device=device)
            i = self._pending_keys[key]
            view = self._pending_views[key] = self._pending[i:i + 1]
        return view

    def settle(self) -> None:
        if not self._unsettled:
            return
        for key, skipped in zip(self._pending_keys, self._pending.tolist()):
            self.scalars[key] -= skipped
        self._pending.zero_()
        self._unsettled = False

    def _after_restore(self) -> None:
        if self._pending is not None:
            self._pending.zero_()
        self._unsettled = False

    def _apply(self, grads, skip=None) -> None:
        updates, sparse = [], []
        for name, p in self.named_params:
            g = grads.get(name)
            if g is None or p.numel() == 0:
                continue
            rows = self.rows[name]
            if g.is_sparse:
                sparse.append((name, as_rows(p.detach(), rows), g, self.state[f"lr_scale.{name}"]))
            else:
                updates.append((name, as_rows(p.detach(), rows), as_rows(g, rows), self.state[f"lr_scale.{name}"]))
        self.count_step(("step_count",) + self._counted(updates), skip)
        self._update_all(updates, skip)
        for update in sparse:
            self._update_sparse(*update)

    def _counted(self, updates) -> tuple[str, ...]:
        """The host counts of single tensors (`scalars` keys) that this step's dense `updates` advance."""
        return ()

    def _update_all(self, updates: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]],
                    skip: torch.Tensor | None = None) -> None:
        """This step's (name, w, g, lr_scale) of every parameter with a gradient; one `_update` each
        unless an optimizer batches them (Adam launches two tensors at once). `skip`: the device flag."""
        for update in updates:
            if skip is None:
                self._update(*update)
            else:
                self._update(*update, skip=skip)

    def _update(self, name: str, w: torch.Tensor, g: torch.Tensor, lr_scale: torch.Tensor, skip=None) -> None:
        raise NotImplementedError

    def _update_sparse(self, name: str, w: torch.Tensor, g: torch.Tensor, lr_scale: torch.Tensor) -> None:
        """A compact table `w` (rows, cols) stepped from its coalesced sparse gradient (optimizers with COMPACT)."""
        raise NotImplementedError


_NO_SKIPS: dict[torch.device, torch.Tensor] = {}
_UNIT_FACTORS: dict[torch.device, torch.Tensor] = {}


def unit_factor(device: torch.device) -> torch.Tensor:
    """A (1,) float32 one on `device` (a tensor's own): the learning-rate factor of kernels whose rate comes
    from the host."""
    one = _UNIT_FACTORS.get(device)
    if one is None:
        one = runtime.keep(_UNIT_FACTORS, device, torch.ones(1, dtype=torch.float32, device=device))
    return one


def no_skip(device: torch.device) -> torch.Tensor:
    """A (1,) int32 zero on `device` (a tensor's own): the `skip` argument of kernels whose step is not to be
    skipped, and the pending count of optimizers that skip on the host."""
    flag = _NO_SKIPS.get(device)
    if flag is None:
        flag = runtime.keep(_NO_SKIPS, device, torch.zeros(1, dtype=torch.int32, device=device))
    return flag
