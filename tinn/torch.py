"""tiny-cuda-nn's PyTorch API (`import tinycudann as tcnn`) on tinn's Taichi kernels.

A tcnn user changes one import and, for arrays of networks, adds `net_ids`::

    import tinn.torch as tcnn                      # was: import tinycudann as tcnn

    model = tcnn.NetworkWithInputEncoding(n_input_dims=2, n_output_dims=3,
                                          encoding_config=config["encoding"], network_config=config["network"])
    y = model(x)                                   # x: (batch, 2) float32 on tinn.runtime.device()

    models = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], n_networks=4096)
    y = models(x, net_ids)                         # sample b runs through network net_ids[b]

The classes here are tcnn's constructors over tinn's own classes, with tcnn's argument order and
attributes and nothing else (no forward, no protocol of their own), and tcnn's function: their networks pad
the input with ones to a multiple of 16 columns (the first matrix gains a bias column) and the output to a
multiple of 16 rows, as tcnn does, so tcnn's parameters give tcnn's outputs. tinn's own classes do not pad,
so the same name would name two functions: these are `TcnnNetworkArray`, `TcnnNetwork` and
`TcnnNetworkWithInputEncoding` (subclasses of `tinn.NetworkArray` and `tinn.NetworkWithInputEncoding` by their
constructors only), and tcnn's names `NetworkArray`, `Network` and `NetworkWithInputEncoding` are aliases of
them here, in `tinn.torch` alone, so that a tcnn script changes only its import. `tcnn.Encoding(...)` builds
the tinn encoding of the config's otype (encodings are not padded, in tcnn either). Every module is a
`torch.nn.Module` following tinn's part contract (tinn/part.py), so gradients reach the parameters *and* the
inputs, tinn parts compose with any torch code and train with any `torch.optim` optimizer.

Guarantees
----------
* Zero-copy. Inputs, outputs, parameters and gradients are torch tensors that the kernels read and write
  in place (`ti.types.ndarray`): no host round trip and no device-to-device copy on the hot path. The
  kernels receive `params.detach()`, which shares storage with the `nn.Parameter`, so an in-place change
  through torch (`optimizer.step()`, `with torch.no_grad(): m.params.mul_(2)`) is seen by the next launch.
  A float32 contiguous input is used as is; the output tensor is the buffer the kernel wrote; the
  parameter gradient is the buffer the backward kernel wrote (autograd takes it over as `.grad`).
* Non-contiguous inputs (slices, transposes) are accepted: they are made contiguous (one copy, and the
  input gradient flows back through that copy). Everything else that does not fit raises
  `tinn.InputError` naming the tensor and what is allowed: dtype other than float32 (no silent
  float64/float16 conversion), wrong shape or last dimension, a tensor on another device than tinn's
  (`tinn.runtime.device()`, e.g. a CPU tensor given to a CUDA module), net ids missing for an array,
  of the wrong length, or outside `0 <= id < n_networks`, parameters converted away from float32
  (`module.double()` / `.half()`) or moved off tinn's device.
* CUDA streams. Taichi launches on CUDA's legacy default stream. When torch's current stream is that
  default stream (the normal case) nothing is needed: both are ordered. When it is another stream
  (`with torch.cuda.stream(s): ...`), each module call is wrapped by `tinn.runtime.stream_guard()`: the default stream
  first waits for the current stream (so the kernels see every pending torch write), the call then runs
  with the default stream current (torch's own ops inside it and its backward pass, which autograd runs
  on the forward's stream, stay ordered with the Taichi launches), and the caller's stream finally waits
  for the default stream (so no later torch op reads a stale output). These are GPU-side event waits,
  not host syncs. On the CPU backend the guard is a no-op. The Trainer runs its steps under it too; use
  `stream_guard()` yourself around direct calls of tinn's losses and optimizers on a non-default stream.

* Host-bound loops. tcnn's sample loop at its batch size spends more time issuing work than the GPU spends
  on it. torch hands every CUDA backward to its own device thread and waits for it;
  `torch.autograd.set_multithreading_enabled(False)`, once in the training thread, keeps it on the calling
  thread (same results) and saves that hand-over's host time (docs/performance.md has what it saved).
  tinn leaves that switch to you; its own `Trainer` sets it around the backward passes it starts
  (`settings.autograd_calling_thread`). The whole loop can also be captured as one CUDA graph
  (`torch.cuda.graph`, a `capturable` torch optimizer; docs/guides/moving-from-tcnn.md): inside a capture the
  modules stay on the capturing stream, skip the checks that read the device and cache nothing made in the
  graph, and a module that would launch a Taichi kernel raises `tinn.step_graphs.NotCapturable`.

Differences from tcnn
---------------------
* float32 parameters and outputs (tcnn defaults to float16): `dtype` is always torch.float32, `loss_scale`
  is 1. A single network computes in float32 too unless `settings.precision` says "float16" (tcnn's
  half-precision GEMMs, its gradient scale applied inside the network) or "bfloat16". An array of several
  networks on CUDA computes in tcnn's float16 on the tensor cores where their kernels take its shape (the
  default precision, `tinn/networks/selection.py`); `network.precision` says which.
* float16 gradients are scaled dynamically (`settings.gradient_scaling`, tcnn's is a fixed 128): the
  gradients autograd delivers are already unscaled; an overflow is flagged in the network's
  `gradient_scaler`. A loop of your own calls `net.gradient_scaler.update()` after `backward()` (one host
  read; `update(sync=False)` returns the device flag instead, which a tinn optimizer's `step(skip=...)`
  reads on the device) and skips `optimizer.step()` where it returns False, which also halves the scale (for a
  `NetworkWithInputEncoding`, `model.network.gradient_scaler`). Without that call the scale stays at 128,
  tcnn's behaviour. tinn's `Trainer` does it itself (`trainer.skipped_steps`).
* A single `NetworkWithInputEncoding`'s `params` is tcnn's flat `(P,)` parameter (network, then encoding)
  and backward sets its `.grad`, as in tcnn; its parts' tables are views of the same storage and get their
  own `.grad` too, which is why it is not among `parameters()` (an optimizer takes either one). A
  `Network`'s `params` is its `(1, P)` table and an array's `(n_networks, n_params_per_network)`, one row
  per network (an array of encodings + networks has no flat vector: `model.params` is then the one
  table when only one part has one, else an AttributeError); `n_params()` is the total count, as in tcnn.
* Parameter-free encodings (Identity, Frequency, ...) have `params = None` and no registered parameter
  (tcnn registers an empty tensor).
* `NetworkWithInputEncoding` keeps its parts as the submodules `encoding` and `network`, each with its
  own `params` (state_dict keys `encoding.params`, `network.params`), so that per-part learning rates or
  weight decay are plain torch parameter groups.
* Initial weights: tcnn's distributions with the padded matrices' fans (so tcnn's bounds), drawn from
  torch's generator instead of pcg32: the same seed gives other numbers.
* `type(tcnn.Encoding(n, {"otype": "HashGrid"}))` is tinn's `GridEncoding` (`isinstance(e, tcnn.Encoding)`
  holds); subclass the tinn classes (or `tcnn.Module`, tinn's `Part`) to extend them.
* No batch-size granularity or padding: any batch size, including 0, works.
"""
from __future__ import annotations

import copy
import inspect

import torch

from . import models, networks, tcnn_layout
from .config import Section
from .encodings import DEFAULT_ENCODING, ENCODINGS, create_encoding
from .encodings import Encoding as _CoreEncoding
from .errors import ConfigError
from .part import Part, _PartFunction, has_hooks
from .runtime import stream_guard
from .step_graphs import inside_callers_capture

__all__ = ["Module", "Encoding", "Network", "NetworkArray", "NetworkWithInputEncoding", "TcnnNetwork",
           "TcnnNetworkArray", "TcnnNetworkWithInputEncoding", "stream_guard", "free_temporary_memory",
           "supports_jit_fusion", "export_params", "import_params"]

export_params = tcnn_layout.export_params  # a model's parameters in tcnn's flat layout
import_params = tcnn_layout.import_params  # tcnn-layout parameters (any float dtype) into a model


class _TcnnStateDict:
    """tcnn's state_dict format next to tinn's: `load_state_dict({"params": flat})` takes tcnn's flat
    layout, `tcnn_state_dict()` writes it; `state_dict()` stays tinn's (one table per part)."""

    def tcnn_state_dict(self) -> dict:
        return {"params": tcnn_layout.export_params(self).detach().clone()}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if tcnn_layout.is_tcnn_state_dict(state_dict):
            tcnn_layout.import_params(self, state_dict["params"])
            return torch.nn.modules.module._IncompatibleKeys([], [])
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

Module = Part  # tcnn's common base class: tinn's part contract


def free_temporary_memory() -> None:
    """tcnn API compatibility. tinn keeps no temporary arenas: scratch buffers are ordinary torch tensors
    that return to torch's caching allocator (use `torch.cuda.empty_cache()` to release those)."""


def supports_jit_fusion() -> bool:
    """tcnn API compatibility: tinn has no JIT fusion path."""
    return False


def _check_dtype(dtype) -> None:
    if dtype not in (None, torch.float32, torch.float16):
        raise ConfigError(f"dtype={dtype} is not supported; allowed: None, torch.float32 or torch.float16 (the "
                          "outputs' dtype; tinn computes in float32)")


def _config_copy(config) -> dict:
    data = getattr(config, "data", config)  # a tinn.config.Section or a plain dict
    return copy.deepcopy(dict(data)) if data is not None else {}


def _otype_of(encoding_config) -> str:
    """The otype `create_encoding` builds for `encoding_config`, in canonical spelling: tcnn's OneBlob where a
    config omits it, Identity for no config at all."""
    config = encoding_config if encoding_config is not None else {"otype": "Identity"}
    return Section(getattr(config, "data", config), "encoding").otype(list(ENCODINGS), DEFAULT_ENCODING)


class _Adapter(type):
    """A tcnn name whose tinn class depends on the config (`Encoding`): calling it builds the tinn object
    of the config's otype; `isinstance(obj, name)` and `issubclass(cls, name)` ask the tinn base class."""

    def __init__(cls, name, bases, namespace):
        super().__init__(name, bases, namespace)
        cls.__signature__ = inspect.signature(cls.build)

    def __call__(cls, *args, **kwargs):
        return cls.build(*args, **kwargs)

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls.core)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, cls.core)


class TcnnNetworkArray(_TcnnStateDict, networks.NetworkArray):
    """`n_networks` MLPs of one shape padded as tcnn pads them (`tinn.torch.NetworkArray`): `forward(x, net_ids)`
    runs sample b through network `net_ids[b]`.

    Same config and function as `tcnn.Network` (`otype`, `n_neurons`, `n_hidden_layers`, `activation`,
    `output_activation`): the input is padded with ones to a multiple of 16 columns, as tcnn pads it, so
    the first matrix has a bias column. `params` is `(n_networks, n_params_per_network)` with layer l of
    network k as a row-major (fan_out, fan_in) block (`weights(l)` gives the `(n_networks, fan_out,
    fan_in)` view).
    """

    casts_inputs = True

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config: dict, n_networks: int = 1,
                 seed: int = 1337, tile_size: int | None = None):
        super().__init__(n_input_dims, n_output_dims, network_config, n_networks=n_networks, seed=seed,
                         tile_size=tile_size, input_padding=((-n_input_dims) % models.TCNN_ALIGNMENT, 1.0),
                         output_padding=(-n_output_dims) % models.TCNN_ALIGNMENT)
        self.network_config = _config_copy(network_config)


class TcnnNetwork(TcnnNetworkArray):
    """One MLP padded as tcnn pads it, tcnn's `Network(n_input_dims, n_output_dims, network_config, seed=1337)`
    (`tinn.torch.Network`); `net_ids` optional."""

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config: dict, seed: int = 1337):
        super().__init__(n_input_dims, n_output_dims, network_config, n_networks=1, seed=seed)


class Encoding(_CoreEncoding, metaclass=_Adapter):
    """tcnn's `Encoding(n_input_dims, encoding_config, seed=1337, dtype=None)`, plus `n_networks` for arrays
    of encodings with tables (one grid per network, picked by `net_ids`). Any `otype` of
    `tinn.encodings.ENCODINGS`; the object built is that otype's tinn encoding."""

    core = _CoreEncoding

    @staticmethod
    def build(n_input_dims: int, encoding_config: dict, seed: int = 1337, dtype=None, n_networks: int = 1):
        _check_dtype(dtype)
        enc = create_encoding(n_input_dims, encoding_config, n_networks=n_networks, seed=seed)
        enc.casts_inputs = True
        if dtype is not None:
            enc.dtype = dtype  # tcnn's output dtype; the computation stays float32
        enc.encoding_config = _config_copy(encoding_config)
        # The config's otype in canonical spelling (the class's names the family: "Grid" for a "HashGrid").
        enc.otype = _otype_of(encoding_config)
        enc.seed = seed
        return enc


class TcnnNetworkWithInputEncoding(_TcnnStateDict, models.NetworkWithInputEncoding):
    """tcnn's `NetworkWithInputEncoding(n_input_dims, n_output_dims, encoding_config, network_config,
    seed=1337)` (`tinn.torch.NetworkWithInputEncoding`), plus `n_networks` (arrays: `forward(x, net_ids)`) and
    `share_encoding` (one table for all networks instead of one per network; parameter-free encodings are
    always shared). Its network pads the encoded input and the output as tcnn's does (tcnn's function and
    parameter layout); otherwise built exactly like `tinn.NetworkWithInputEncoding(..., tcnn_padding=True)`
    (encoding seeded with `seed`, network with `seed + 1`)."""

    casts_inputs = True

    def __init__(self, n_input_dims: int, n_output_dims: int, encoding_config: dict, network_config: dict,
                 seed: int = 1337, n_networks: int = 1, share_encoding: bool = False):
        super().__init__(n_input_dims, n_output_dims, encoding_config, network_config, n_networks=n_networks,
                         seed=seed, share_encoding=share_encoding, tcnn_padding=True)
        self.encoding_config = self.encoding.encoding_config = _config_copy(encoding_config)
        self.network_config = self.network.network_config = _config_copy(network_config)
        self.encoding.otype = _otype_of(encoding_config)
        # One flat storage in tcnn's order behind both tables, so `params` is tcnn's flat vector: a parameter
        # of its own (kept out of `parameters()`, which would otherwise step the same storage twice) whose
        # `.grad` autograd sets next to the tables' (`run_checked`).
        flat = tcnn_layout.bind_flat(self)
        self.__dict__["_flat_params"] = None if flat is None else torch.nn.Parameter(flat)

    def run_checked(self, x, ids):
        """As tinn's, with the flat `params` in the graph too where it wants a gradient: its `.grad` is the
        tables' gradients in tcnn's order (one copy of the parameters per backward)."""
        flat = tcnn_layout.flat_view(self, self.__dict__.get("_flat_params"))
        if flat is None or not (torch.is_grad_enabled() and flat.requires_grad) or \
                has_hooks(self.encoding) or has_hooks(self.network):
            return super().run_checked(x, ids)
        with inside_callers_capture(), stream_guard():
            return _PartFunction.apply(self, x, ids, *_FlatGradient.apply(flat, *self.parameter_tables()))


# tcnn's names for the padded classes, here only: `import tinn.torch as tcnn` is a tcnn script's one change.
NetworkArray = TcnnNetworkArray
Network = TcnnNetwork
NetworkWithInputEncoding = TcnnNetworkWithInputEncoding


class _FlatGradient(torch.autograd.Function):
    """The tables passed through unchanged, so the flat parameter they are views of gets their gradients
    (concatenated in the order the tables lie in it, tcnn's layout) as its own `.grad`, while each table keeps
    its own."""

    @staticmethod
    def forward(ctx, flat, *tables):
        ctx.shapes = [t.shape for t in tables]
        ctx.order = sorted(range(len(tables)), key=lambda k: tables[k].data_ptr())  # bind_flat covers flat
        ctx.set_materialize_grads(False)
        return tuple(t.view_as(t) for t in tables)

    @staticmethod
    def backward(ctx, *grads):
        flat_grad = None
        if ctx.needs_input_grad[0] and any(g is not None for g in grads):
            device = next(g.device for g in grads if g is not None)
            flat_grad = torch.cat([(grads[k] if grads[k] is not None else
                                    torch.zeros(ctx.shapes[k], device=device)).reshape(-1) for k in ctx.order])
        return (flat_grad,) + grads
