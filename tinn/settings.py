"""What a user chooses, `Settings`, apart from how the kernels are tuned, `Tuning`; both fixed by `tinn.init()`.

Defaults come from the fields below; `TINN_SETTINGS="name=value,name=value"` overrides fields of either
record for a process (benchmarks and A/B runs), `tinn.init(settings={...}, tuning={...})` (or the records
themselves) overrides both. After `init` the records are frozen: kernels compiled later read the same values.
A field named like a constructor argument is that argument's default, which the argument overrides per
module (`NetworkArray(..., kernels="unfused", precision="float16")`, `GridEncoding(..., feature_lanes=False)`).

Every field is checked by its type and range however it is given (`Settings(...)`, `Tuning(...)`,
`TINN_SETTINGS`, `tinn.init(...)`): a wrong value raises ConfigError naming the field and what it allows. Only
the environment's text is converted ("true", "off", "auto", "32"); Python values must have the field's type.

`Settings`, for users:

| field | default | what |
| --- | --- | --- |
| kernels | "auto" | an MLP array's path (`tinn/networks/selection.py`): "tensor_cores" (Triton kernels, CUDA), "fused" (Taichi, CUDA, one launch for all layers), "unfused", "batched_gemm" (torch bmm over samples grouped per network), or "auto" (the selection rule) |
| precision | "auto" | the precision of an MLP's matrix products: "float32" (exact), "tf32" (float32 operands rounded by the tensor cores), "float16" (tcnn's precision: half operands and activations, float32 accumulation, output gradients scaled before the cast) or "bfloat16"; "auto": float16 on the tensor cores for a CUDA array of several networks their kernels take (hidden width 16..128, at most 128 inputs and outputs), outside deterministic mode; float32 elsewhere (the CPU, a single network, other shapes, deterministic mode; `tinn/networks/selection.py`, `default_precision`); float16 where `kernels="tensor_cores"` is forced; a reduced precision puts a CUDA array on the tensor cores. Parameters, optimizer state, outputs and input gradients stay float32. Applied where the chosen path computes in it (the tensor cores; a single network's dense path in float16/bfloat16), float32 elsewhere (`NetworkArray.precision` says which); a NetworkArray's own `precision=` argument is refused where it cannot apply |
| gradient_scaling | "dynamic" | how a float16 network scales its gradients: "dynamic" (tinn/gradient_scaling.py: start at tcnn's 128, halve and skip the optimizer step whose gradients overflow, double after 2000 finite steps, all decided on the device; `NetworkArray.gradient_scaler`, `Trainer.skipped_steps`) or "static" (tcnn's fixed 128, which large gradients can overflow into inf and NaN) |
| deterministic | False | bit-identical results run to run: fixed-order reductions instead of float atomics (slower; `tinn/kernels/deterministic.py`) |
| autograd_calling_thread | True | the Trainer's autograd backward passes (`optimize`, models outside the part contract) run on the calling thread (`torch.autograd.set_multithreading_enabled(False)`) instead of torch's device thread: no hand-over per backward (README, Performance) |
| collective_timeout_s | 300 | seconds a collective of `tinn.distributed` may wait for the other ranks before it fails |

`Tuning`, the kernels' knobs (benchmarks and tests set them; the defaults are the measured choices):

| field | default | what |
| --- | --- | --- |
| fused_tile | 64 | samples per forward tile of the fused kernels (multiple of 16) |
| fused_backward_tile | 0 | samples per backward-deltas tile; 0 = 32 up to 64 features, else `fused_tile` |
| fused_unroll_forward | 1 | k steps per iteration of the forward GEMM loop |
| fused_unroll_backward | 2 | k steps per iteration of the backward GEMM loops |
| fused_grad_step | 16 | samples staged per weight-gradient step (fewer where the prefetch would not fit its registers) |
| fused_grad_chunk | 0 | samples per weight-gradient block; 0 = by batch size |
| fused_staged_weights | "auto" | which fused GEMM kernels stage each layer's weights in shared memory (the others read them through L1): "none", "forward", "backward", "both", or "auto" (the deltas kernel always, the forward for a single network) |
| fused_loss | None | the Trainer's tinn loss computed inside the fused deltas kernel, which reads the outputs anyway (no loss kernel pass, no gradient buffer); None = always on the tensor-core path (the output layer's kernel recomputes the prediction), and on Taichi's fused kernels for arrays of several networks whose input gradient is not needed (faster there; slower on the image step, one network whose grid needs its input gradient) |
| tensor_core_recompute | True | the tensor-core backward recomputes the forward where its weight gradients fit one program's registers (up to four weight matrices, hidden widths up to 128), so a training forward saves nothing and the Trainer's step runs no forward; False = the forward saves its pre-activations and the backward goes layer by layer (A/B runs) |
| fused_grad_prefetch | True | weight gradients prefetch the next step's samples (networks up to 64 features) |
| dense_single_network | None | a single network as dense GEMMs (torch: the CPU's BLAS, cuBLAS; `tinn/dense_mlp.py`) instead of Taichi's kernels; None = where faster: on the CPU, and on CUDA where the fused kernels do not take the network (Sine, SiLU, more than 128 features) or it has more than 64 features |
| dense_step_graphs | None | a dense single network's training step (forward and backward) replayed from fixed buffers per batch shape as CUDA graphs (`tinn/dense_graphs.py`), one launch each instead of about twenty torch ops; None = on CUDA where a shape's buffers take at most 512 MiB; True = every shape (on the CPU the same buffers with plain calls) |
| reduce_pieces | 1 | a `Replicated` part's gradient all-reduce cut into this many ranges of networks, each issued as soon as the tensor-core backward has finished it, so the link works under the rest of the backward (DistributedDataParallel's buckets; `tinn/distributed/piece_reduction.py`); 1 = one all-reduce after the backward, the default: with steps issued op by op the ranges' collectives measured slower (sharding guide) |
| replicated_step_graphs | False | a data-parallel part's (`tinn.distributed.Replicated` over NCCL) Trainer steps captured as CUDA graphs with their collectives (the all-reduce, or the split optimizer's reduce-scatter and all-gather) and replayed (`tuning.step_graphs` on too); the step graphs' trial keeps a graph only where its replays measured faster, each rank by its own timing (a replay issues the same collectives as a step op by op; `tinn/step_graphs.py`); opt-in: the sharding guide measures it |
| step_graphs | True | the `Trainer`'s regression step (forward, loss, backward, gradient scaling, Adam) captured once per batch shape as one CUDA graph and replayed (`tinn/step_graphs.py`), where every launch of the step is a Triton kernel or a torch operation (no Taichi launch, no host sync) and the optimizer is Adam on its Triton kernel; the step's host time then is the inputs' copies and one graph launch; on CUDA (a step that cannot be captured runs op by op, `Trainer.step_graph_status` says why; False = every step op by op); on a single network in float16 or bfloat16 it also takes the tensor cores over the dense GEMMs; each captured batch shape (at most two) keeps one step's intermediate buffers in the graph's own memory pool, so where memory is tight, False |
| vendor_weight_gradients | True | a single network's weight gradients as vendor GEMMs (cuBLAS / CPU BLAS) |
| weight_gradient_slices | 256 | split-K slices of those GEMMs on CUDA |
| group_by_network | None | an encoded array's batch grouped by network id before its encoding runs (one sort; inputs gathered, outputs and input gradients put back), so a warp's table lookups stay in one network's tables; None = on CUDA where every network owns its encoding's tables (`NetworkWithInputEncoding.groups_by_network`) |
| feature_lanes | None | one thread per (level, sample, feature) in the grid's table gradient; None = on CUDA only |
| level_tasks | None | on the CPU, the grid's table gradient as one task per level without atomics; None = where the CPU runs no more threads than the grid has levels |
| fast_launch | True | the lean launch path of tinn/kernels/launch.py |
| triton_step_kernels | None | a training step's bookkeeping kernels, Adam's dense tables (`tinn/kernels/adam_triton.py`), the gradient scaler's checks (`tinn/kernels/scaler_triton.py`) and the image task's batch sampler (`tinn/kernels/image_sampling_triton.py`), as Triton launches instead of Taichi's kernels, whose launch costs the host several times more; None = on CUDA where Triton imports; True = also under Triton's CPU interpreter (tests); False = Taichi's kernels everywhere |
| triton_grid_kernels | None | a grid encoding's lookup and table gradient (`tinn/kernels/grid_triton.py`) as Triton launches instead of Taichi's kernels, for float32 tables (the lookup also for compact ones) and every hash but Rng; input gradients, second order, a compact table's sparse gradient, the fixed-order sum and stochastic interpolation stay Taichi's; None = on CUDA where Triton imports; True = also under Triton's CPU interpreter (tests); False = Taichi's kernels everywhere |
| triton_render_kernels | None | a scene's volume compositing, forward and backward (`tinn/kernels/compositing_triton.py`), as Triton launches that take a ray's samples a block at a time with scans, instead of Taichi's kernels, which walk each ray in one thread; None = on CUDA where Triton imports; True = also under Triton's CPU interpreter (tests); False = Taichi's kernels everywhere |
| gpu_max_reg | 0 | register cap per thread for CUDA kernels; 0 = Taichi's default |
| ir_optimization | None | the kernel language's own IR optimisation passes (Taichi's `advanced_optimization`, before LLVM's) for every kernel (True) or none (False); None = all kernels but those as fast without them (`fast_kernel(ir_passes=False)`: the fused MLP forward and weight gradients, the grid encoding's; on Taichi), which then compile several times faster |
| table_chunk_elements | 2^30 | most elements of a per-network table (parameters, gradients, optimizer state) one kernel launch indexes; bigger tables run in row chunks (tinn/chunks.py) |
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import NamedTuple

from .errors import ConfigError

ENV_VARIABLE = "TINN_SETTINGS"
NETWORK_KERNELS = ("auto", "tensor_cores", "fused", "unfused", "batched_gemm")
STAGED_WEIGHTS = ("auto", "none", "forward", "backward", "both")
NETWORK_PRECISIONS = ("auto", "float32", "tf32", "float16", "bfloat16")
GRADIENT_SCALINGS = ("dynamic", "static")


class _Checked:
    """A frozen record whose fields are checked by type and range when it is built or changed."""

    _prefix = ""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            _check(self._prefix, field.name, field.type, getattr(self, field.name))

    def replace(self, **changes):
        """A copy with `changes` (Python values of each field's type) applied and checked."""
        names = {f.name for f in dataclasses.fields(self)}
        for name in changes:
            if name not in names:
                _unknown(name, type(self))
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Settings(_Checked):
    """A process's choices (the table in `tinn/settings.py` says what each field does), fixed by `tinn.init`.

    Args:
        kernels: an MLP array's path, "auto", "tensor_cores", "fused", "unfused" or "batched_gemm"
            (`NetworkArray(kernels=...)` overrides it per array).
        precision: an MLP's matrix products, "auto", "float32", "tf32", "float16" or "bfloat16"
            (`NetworkArray(precision=...)` overrides it per array).
        gradient_scaling: a float16 network's gradient scale, "dynamic" or "static" (tcnn's fixed 128).
        deterministic: bit-identical results run to run (fixed-order sums; slower).
        autograd_calling_thread: the Trainer's autograd backward passes on the calling thread.
        collective_timeout_s: seconds a `tinn.distributed` collective waits for the other ranks.
    """

    _prefix = "settings"
    kernels: str = "auto"
    precision: str = "auto"
    gradient_scaling: str = "dynamic"
    deterministic: bool = False
    autograd_calling_thread: bool = True
    collective_timeout_s: int = 300


@dataclass(frozen=True)
class Tuning(_Checked):
    """How tinn's kernels are tuned (the table in `tinn/settings.py`); benchmarks and tests change it through
    `tinn.init(tuning={...})` or `TINN_SETTINGS`, users need not."""

    _prefix = "tuning"
    fused_tile: int = 64
    fused_backward_tile: int = 0
    fused_unroll_forward: int = 1
    fused_unroll_backward: int = 2
    fused_grad_step: int = 16
    fused_grad_chunk: int = 0
    fused_staged_weights: str = "auto"
    fused_loss: bool | None = None
    tensor_core_recompute: bool = True
    fused_grad_prefetch: bool = True
    dense_single_network: bool | None = None
    dense_step_graphs: bool | None = None
    step_graphs: bool = True
    reduce_pieces: int = 1
    replicated_step_graphs: bool = False
    vendor_weight_gradients: bool = True
    weight_gradient_slices: int = 256
    group_by_network: bool | None = None
    feature_lanes: bool | None = None
    level_tasks: bool | None = None
    fast_launch: bool = True
    triton_step_kernels: bool | None = None
    triton_grid_kernels: bool | None = None
    triton_render_kernels: bool | None = None
    gpu_max_reg: int = 0
    ir_optimization: bool | None = None
    # Taichi 1.7.4 indexes ndarrays and counts loops in 32 bits (tinn/chunks.py); tests set it tiny to cross
    # chunk boundaries.
    table_chunk_elements: int = 1 << 30


_FIELDS = {f.name: (Settings, f) for f in dataclasses.fields(Settings)}
_FIELDS.update({f.name: (Tuning, f) for f in dataclasses.fields(Tuning)})
assert len(_FIELDS) == len(dataclasses.fields(Settings)) + len(dataclasses.fields(Tuning)), "a name in both records"

# The allowed values of each text field and the range of each integer field; every field's type comes
# from its annotation above, so a new field is checked by type without being listed here.
_CHOICES = {
    "kernels": NETWORK_KERNELS,
    "fused_staged_weights": STAGED_WEIGHTS,
    "precision": NETWORK_PRECISIONS,
    "gradient_scaling": GRADIENT_SCALINGS,
}
_TILE_FIELDS = ("fused_tile", "fused_backward_tile")
_INT_RANGES = {
    "fused_unroll_forward": (1, None),
    "fused_unroll_backward": (1, None),
    "fused_grad_step": (1, None),
    "fused_grad_chunk": (0, None),
    "weight_gradient_slices": (1, None),
    "reduce_pieces": (1, 1024),
    "gpu_max_reg": (0, None),
    "collective_timeout_s": (1, None),
    "table_chunk_elements": (1, (1 << 31) - (1 << 24)),
}
_INT_BOUND_TEXT = {(1 << 31) - (1 << 24): "2^31 - 2^24"}


def _unknown(name: str, record: type) -> None:
    """Raise ConfigError for `name`, not a field of `record`: where it belongs if it is the other record's."""
    owner = _FIELDS.get(name, (None,))[0]
    if owner is not None:
        other = "settings" if owner is Settings else "tuning"
        raise ConfigError(f"{name!r} is a field of tinn.{owner.__name__}, not of tinn.{record.__name__}: "
                          f"pass it as tinn.init({other}={{{name!r}: ...}})")
    names = [f.name for f in dataclasses.fields(record)]
    hint = difflib.get_close_matches(name, list(_FIELDS), n=1)
    raise ConfigError(f"unknown {record._prefix} field {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                      + f"; allowed: {sorted(names)}")


def _check(prefix: str, name: str, kind: str, value) -> None:
    """Raise ConfigError naming `name` and what it allows unless `value` is of field type `kind` and in range."""
    shown = f"{prefix}.{name}={value!r}"
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{shown} must be true or false (a bool)")
    elif kind == "bool | None":
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{shown} must be true, false or None (None = automatic)")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{shown} must be an integer, got {type(value).__name__}")
        if name in _TILE_FIELDS:
            low = 16 if name == "fused_tile" else 0
            if value % 16 or not low <= value <= 128:
                raise ConfigError(f"{shown} must be a multiple of 16 in [16, 128]"
                                  + (" (or 0 for the default)" if low == 0 else ""))
        low, high = _INT_RANGES.get(name, (None, None))
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in [{low}, {_INT_BOUND_TEXT.get(high, high)}]"
            raise ConfigError(f"{shown} must be {bounds}")
    elif kind == "str":
        choices = _CHOICES[name]
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{shown} is not supported; allowed: {list(choices)}")
    else:
        raise AssertionError(f"{prefix}.{name} has a type ({kind}) the checks do not know")


def _from_text(name: str, value: str):
    """`value`, a string from the environment, as field `name`'s type (checked later by its record)."""
    if name not in _FIELDS:
        hint = difflib.get_close_matches(name, list(_FIELDS), n=1)
        raise ConfigError(f"{ENV_VARIABLE}: unknown setting {name!r}"
                          + (f" (did you mean {hint[0]!r}?)" if hint else "") + f"; allowed: {sorted(_FIELDS)}")
    kind = _FIELDS[name][1].type
    text = value.strip()
    if "bool" in kind:
        lowered = text.lower()
        if lowered in ("none", "auto") and "None" in kind:
            return None
        if lowered in ("1", "true", "on", "yes"):
            return True
        if lowered in ("0", "false", "off", "no"):
            return False
        allowed = "true, false, none or auto" if "None" in kind else "true or false"
        raise ConfigError(f"{ENV_VARIABLE}: {name}={text!r} must be {allowed}")
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{ENV_VARIABLE}: {name}={text!r} must be an integer") from None
    return text


def parse(text: str) -> dict:
    """`name=value,name=value` (the `TINN_SETTINGS` format, fields of either record) as a dict of typed values."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{ENV_VARIABLE}: {item!r} is not of the form name=value")
        out[name.strip()] = _from_text(name.strip(), value)
    return out


class SettingsAndTuning(NamedTuple):
    """The two records in force for a process."""

    settings: Settings
    tuning: Tuning

    def replace(self, **changes) -> "SettingsAndTuning":
        """A copy with `changes`, fields of either record by name, applied and checked."""
        for name in changes:
            if name not in _FIELDS:
                _unknown(name, Settings)
        mine = {k: v for k, v in changes.items() if _FIELDS[k][0] is Settings}
        theirs = {k: v for k, v in changes.items() if _FIELDS[k][0] is Tuning}
        return SettingsAndTuning(self.settings.replace(**mine), self.tuning.replace(**theirs))


_current = [SettingsAndTuning(Settings(), Tuning())]


def current() -> Settings:
    """The settings in force (the defaults until `tinn.init()` installs the process's own)."""
    return _current[0].settings


def current_tuning() -> Tuning:
    """The tuning in force. Kernels read it when they compile, which is after `init`."""
    return _current[0].tuning


def installed() -> SettingsAndTuning:
    """Both records in force (what `install` takes back)."""
    return _current[0]


def install(chosen: SettingsAndTuning) -> None:
    _current[0] = chosen


def _overridden(base, overrides, record: type, argument: str):
    if overrides is None:
        return base
    if isinstance(overrides, record):
        return overrides
    if not isinstance(overrides, dict):
        raise ConfigError(f"{argument} must be a tinn.{record.__name__} or a dict, got {type(overrides).__name__}")
    return base.replace(**overrides)


def build(environment: str | None, settings: "Settings | dict | None" = None,
          tuning: "Tuning | dict | None" = None) -> SettingsAndTuning:
    """The records of a process: defaults, then the environment's, then the caller's."""
    try:
        defaults = SettingsAndTuning(Settings(), Tuning())
        base = defaults.replace(**parse(environment)) if environment else defaults
    except ConfigError as error:
        if str(error).startswith(ENV_VARIABLE):
            raise
        raise ConfigError(f"{ENV_VARIABLE}: {error}") from None
    return SettingsAndTuning(_overridden(base.settings, settings, Settings, "settings"),
                             _overridden(base.tuning, tuning, Tuning, "tuning"))
