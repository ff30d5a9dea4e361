"""tinn's tuning in one place: the `Settings` record, fixed when `tinn.init()` runs.

Defaults come from the fields below; `TINN_SETTINGS="name=value,name=value"` overrides them for a
process (benchmarks and A/B runs), `tinn.init(settings={...})` or `tinn.init(settings=Settings(...))`
overrides both. After `init` the record is frozen: kernels compiled later read the same values.
Per module, constructor arguments override it (`NetworkArray(..., kernels="unfused")`,
`GridEncoding(..., feature_lanes=False)`).

Every field is checked by its type and range however it is given (`Settings(...)`, `TINN_SETTINGS`,
`tinn.init(settings=...)`): a wrong value raises ConfigError naming the field and what it allows. Only
the environment's text is converted ("true", "off", "auto", "32"); Python values must have the field's type.

| field | default | what |
| --- | --- | --- |
| network_kernels | "auto" | an MLP array's path (`tinn/networks/selection.py`): "tensor_cores" (Triton kernels, CUDA), "fused" (Taichi, CUDA, one launch for all layers), "unfused", "batched_gemm" (torch bmm over samples grouped per network), or "auto" (the selection rule) |
| fused_tile | 64 | samples per forward tile of the fused kernels (multiple of 16) |
| fused_backward_tile | 0 | samples per backward-deltas tile; 0 = 32 up to 64 features, else `fused_tile` |
| fused_unroll_forward | 1 | k steps per iteration of the forward GEMM loop |
| fused_unroll_backward | 2 | k steps per iteration of the backward GEMM loops |
| fused_grad_step | 16 | samples staged per weight-gradient step (fewer where the prefetch would not fit its registers) |
| fused_grad_chunk | 0 | samples per weight-gradient block; 0 = by batch size |
| fused_staged_weights | "auto" | which fused GEMM kernels stage each layer's weights in shared memory (the others read them through L1): "none", "forward", "backward", "both", or "auto" (the deltas kernel always, the forward for a single network) |
| fused_loss | None | the Trainer's tinn loss computed inside the fused deltas kernel, which reads the outputs anyway (no loss kernel pass, no gradient buffer); None = for arrays of several networks whose input gradient is not needed (measured faster there; slower on the image step, one network whose grid needs its input gradient) |
| fused_grad_prefetch | True | weight gradients prefetch the next step's samples (networks up to 64 features) |
| dense_single_network | None | a single network as dense GEMMs (torch: the CPU's BLAS, cuBLAS; `tinn/dense_mlp.py`) instead of Taichi's kernels; None = where measured faster: on the CPU, and on CUDA where the fused kernels do not take the network (Sine, SiLU, more than 128 features) or it has more than 64 features |
| network_precision | "auto" | the precision of an MLP's matrix products: "float32" (exact), "tf32" (float32 operands rounded by the tensor cores), "float16" (tcnn's precision: half operands and activations, float32 accumulation, output gradients scaled before the cast) or "bfloat16"; "auto": float16 on the tensor cores for a CUDA array of several networks their kernels take (hidden width 16..128, at most 128 inputs and outputs), outside deterministic mode; float32 elsewhere (the CPU, a single network, other shapes, deterministic mode; `tinn/networks/selection.py`, `default_precision`); float16 where `kernels="tensor_cores"` is forced; a reduced precision puts a CUDA array on the tensor cores. Parameters, optimizer state, outputs and input gradients stay float32. Applied where the chosen path computes in it (the tensor cores; a single network's dense path in float16/bfloat16), float32 elsewhere (`NetworkArray.precision` says which); a NetworkArray's own `precision=` argument is refused where it cannot apply |
| gradient_scaling | "dynamic" | how a float16 network scales its gradients: "dynamic" (tinn/gradient_scaling.py: start at tcnn's 128, halve and skip the optimizer step whose gradients overflow, double after 2000 finite steps, all decided on the device; `NetworkArray.gradient_scaler`, `Trainer.skipped_steps`) or "static" (tcnn's fixed 128, which large gradients can overflow into inf and NaN) |
| dense_step_graphs | None | a dense single network's training step (forward and backward) replayed from fixed buffers per batch shape as CUDA graphs (`tinn/dense_graphs.py`), one launch each instead of about twenty torch ops; None = on CUDA where a shape's buffers take at most 512 MiB; True = every shape (on the CPU the same buffers with plain calls) |
| vendor_weight_gradients | True | a single network's weight gradients as vendor GEMMs (cuBLAS / CPU BLAS) |
| weight_gradient_slices | 256 | split-K slices of those GEMMs on CUDA |
| grid_level_tasks | None | on the CPU, the grid's table gradient as one task per level without atomics; None = where the CPU runs no more threads than the grid has levels |
| grid_feature_lanes | None | one thread per (level, sample, feature) in the grid's table gradient; None = on CUDA only |
| fast_launch | True | the lean launch path of tinn/kernels/launch.py |
| autograd_calling_thread | True | the Trainer's autograd backward passes (`optimize`, models outside the part contract) run on the calling thread (`torch.autograd.set_multithreading_enabled(False)`) instead of torch's device thread: no hand-over per backward (saves up to 30-40% of such a step's host time, machine-dependent; README, Performance) |
| gpu_max_reg | 0 | register cap per thread for CUDA kernels; 0 = Taichi's default |
| ir_optimization | None | the kernel language's own IR optimisation passes (Taichi's `advanced_optimization`, before LLVM's) for every kernel (True) or none (False); None = all kernels but those measured as fast without them (`fast_kernel(ir_passes=False)`: the fused MLP forward and weight gradients, the grid encoding's; on Taichi, where measured), which then compile several times faster |
| collective_timeout_s | 300 | seconds a collective of `tinn.distributed` may wait for the other ranks before it fails |
| deterministic | False | bit-identical results run to run: fixed-order reductions instead of float atomics (slower; `tinn/kernels/deterministic.py`) |
| table_chunk_elements | 2^30 | most elements of a per-network table (parameters, gradients, optimizer state) one kernel launch indexes; bigger tables run in row chunks (tinn/chunks.py) |
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

from .errors import ConfigError

ENV_VARIABLE = "TINN_SETTINGS"
NETWORK_KERNELS = ("auto", "tensor_cores", "fused", "unfused", "batched_gemm")
STAGED_WEIGHTS = ("auto", "none", "forward", "backward", "both")
NETWORK_PRECISIONS = ("auto", "float32", "tf32", "float16", "bfloat16")
GRADIENT_SCALINGS = ("dynamic", "static")


@dataclass(frozen=True)
class Settings:
    network_kernels: str = "auto"
    fused_tile: int = 64
    fused_backward_tile: int = 0
    fused_unroll_forward: int = 1
    fused_unroll_backward: int = 2
    fused_grad_step: int = 16
    fused_grad_chunk: int = 0
    fused_staged_weights: str = "auto"
    fused_loss: bool | None = None
    fused_grad_prefetch: bool = True
    dense_single_network: bool | None = None
    network_precision: str = "auto"
    gradient_scaling: str = "dynamic"
    dense_step_graphs: bool | None = None
    vendor_weight_gradients: bool = True
    weight_gradient_slices: int = 256
    grid_feature_lanes: bool | None = None
    grid_level_tasks: bool | None = None
    fast_launch: bool = True
    autograd_calling_thread: bool = True
    gpu_max_reg: int = 0
    ir_optimization: bool | None = None
    collective_timeout_s: int = 300
    # Taichi 1.7.4 indexes ndarrays and counts loops in 32 bits (tinn/chunks.py); tests set it tiny to cross
    # chunk boundaries.
    table_chunk_elements: int = 1 << 30
    deterministic: bool = False

    def __post_init__(self):
        for name, field in _FIELDS.items():
            _check(name, field.type, getattr(self, name))

    def replace(self, **changes) -> "Settings":
        """A copy with `changes` (Python values of each field's type) applied and checked."""
        for name in changes:
            _known(name)
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}

# The allowed values of each text field and the range of each integer field; every field's type comes
# from its annotation above, so a new field is checked by type without being listed here.
_CHOICES = {
    "network_kernels": NETWORK_KERNELS,
    "fused_staged_weights": STAGED_WEIGHTS,
    "network_precision": NETWORK_PRECISIONS,
    "gradient_scaling": GRADIENT_SCALINGS,
}
_TILE_FIELDS = ("fused_tile", "fused_backward_tile")
_INT_RANGES = {
    "fused_unroll_forward": (1, None),
    "fused_unroll_backward": (1, None),
    "fused_grad_step": (1, None),
    "fused_grad_chunk": (0, None),
    "weight_gradient_slices": (1, None),
    "gpu_max_reg": (0, None),
    "collective_timeout_s": (1, None),
    "table_chunk_elements": (1, (1 << 31) - (1 << 24)),
}
_INT_BOUND_TEXT = {(1 << 31) - (1 << 24): "2^31 - 2^24"}


def _known(name: str) -> None:
    if name not in _FIELDS:
        hint = difflib.get_close_matches(name, _FIELDS, n=1)
        raise ConfigError(f"unknown setting {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; allowed: {sorted(_FIELDS)}")


def _check(name: str, kind: str, value) -> None:
    """Raise ConfigError naming `name` and what it allows unless `value` is of field type `kind` and in range."""
    shown = f"settings.{name}={value!r}"
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
        raise AssertionError(f"settings.{name} has a type ({kind}) the checks do not know")


def _from_text(name: str, value: str):
    """`value`, a string from the environment, as field `name`'s type (checked later by `Settings`)."""
    _known(name)
    kind = _FIELDS[name].type
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
    """`name=value,name=value` (the `TINN_SETTINGS` format) as a dict of typed values."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{ENV_VARIABLE}: {item!r} is not of the form name=value")
        out[name.strip()] = _from_text(name.strip(), value)
    return out


_current = [Settings()]


def current() -> Settings:
    """The settings in force (the defaults until `tinn.init()` installs the process's own). Kernels read
    their tuning from here when they compile, which is after `init`."""
    return _current[0]


def install(chosen: Settings) -> None:
    _current[0] = chosen


def build(environment: str | None, overrides: "Settings | dict | None") -> Settings:
    """The settings of a process: defaults, then the environment's, then the caller's."""
    try:
        base = Settings().replace(**parse(environment)) if environment else Settings()
    except ConfigError as error:
        if str(error).startswith(ENV_VARIABLE):
            raise
        raise ConfigError(f"{ENV_VARIABLE}: {error}") from None
    if overrides is None:
        return base
    if isinstance(overrides, Settings):
        return overrides
    if not isinstance(overrides, dict):
        raise ConfigError(f"settings must be a tinn.Settings or a dict, got {type(overrides).__name__}")
    return base.replace(**overrides)
