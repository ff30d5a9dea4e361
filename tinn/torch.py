"""tiny-cuda-nn's PyTorch API (`import tinycudann as tcnn`) on tinn's Taichi kernels.

A tcnn user changes one import and, for arrays of networks, adds `net_ids`::

    import tinn.torch as tcnn                      # was: import tinycudann as tcnn

    model = tcnn.NetworkWithInputEncoding(n_input_dims=2, n_output_dims=3,
                                          encoding_config=config["encoding"], network_config=config["network"])
    y = model(x)                                   # x: (batch, 2) float32 on tinn.runtime.device()

    models = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], n_networks=4096)
    y = models(x, net_ids)                         # sample b runs through network net_ids[b]

Every module is a `torch.nn.Module`; the Taichi kernels sit inside `torch.autograd.Function`s, so
gradients reach the parameters *and* the inputs, tinn parts compose with any torch code and train with
any `torch.optim` optimizer.

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
  (`with torch.cuda.stream(s): ...`), each module call is wrapped by `stream_guard()`: the default stream
  first waits for the current stream (so the kernels see every pending torch write), the call then runs
  with the default stream current (torch's own ops inside it and its backward pass, which autograd runs
  on the forward's stream, stay ordered with the Taichi launches), and the caller's stream finally waits
  for the default stream (so no later torch op reads a stale output). These are GPU-side event waits,
  not host syncs. On the CPU backend the guard is a no-op. Use `stream_guard()` yourself around direct
  calls of tinn's other kernels (`tinn.Trainer`, losses, optimizers) on a non-default stream.

Differences from tcnn
---------------------
* float32 throughout (tcnn defaults to float16 parameters/outputs): `dtype` is always torch.float32,
  `loss_scale` is 1.
* `params` has shape `(n_networks, n_params_per_network)` (one row per network of an array; `(1, P)` for
  a single network) instead of tcnn's flat `(P,)`; `n_params()` is the total count, as in tcnn.
* Parameter-free encodings (Identity, Frequency, ...) have `params = None` and no registered parameter
  (tcnn registers an empty tensor).
* `NetworkWithInputEncoding` keeps its parts as the submodules `encoding` and `network`, each with its
  own `params` (state_dict keys `encoding.params`, `network.params`), so that per-part learning rates or
  weight decay are plain torch parameter groups. `model.params` is the network's table when the encoding
  has none (the common Frequency/OneBlob case) and an AttributeError otherwise.
* No batch-size granularity or padding: any batch size, including 0, works.
"""
from __future__ import annotations

import contextlib
import copy

import torch

from . import checks, models, networks, runtime
from .config import Section
from .encodings import ENCODINGS, create_encoding
from .errors import ConfigError, InputError

__all__ = ["Encoding", "Network", "NetworkArray", "NetworkWithInputEncoding", "stream_guard", "free_temporary_memory",
           "supports_jit_fusion"]


# ---------------------------------------------------------------------------------------------------------
# Stream ordering
# ---------------------------------------------------------------------------------------------------------
# torch's current-stream query without building Stream objects (a few microseconds per call, and the
# Trainer asks on every step); stream id 0 is the default stream. Absent from CPU builds of torch.
_CURRENT_STREAM_ID = getattr(torch._C, "_cuda_getCurrentStream", None)


def _foreign_stream():
    """torch's current CUDA stream when it is not the default stream Taichi launches on, else None."""
    if runtime.arch() != "cuda":
        return None
    dev = runtime.device()
    if _CURRENT_STREAM_ID is not None and _CURRENT_STREAM_ID(dev.index)[0] == 0:
        return None
    cur = torch.cuda.current_stream(dev)
    return None if cur == torch.cuda.default_stream(dev) else cur


@contextlib.contextmanager
def stream_guard():
    """Order Taichi launches (CUDA legacy default stream) with torch's current stream.

    No-op on the CPU backend and when torch's current stream already is the default stream. Otherwise:
    the default stream waits for the current one, the body runs with the default stream current, and on
    exit the current stream waits for the default one. Tensors created inside the block belong to the
    default stream's allocator pool; if you keep one alive and free it while the caller's stream may still
    use it, call `t.record_stream(torch.cuda.current_stream())` (the tcnn-style modules do it for their
    outputs).
    """
    cur = _foreign_stream()
    if cur is None:
        yield
        return
    default = torch.cuda.default_stream(cur.device)
    default.wait_stream(cur)
    try:
        with torch.cuda.stream(default):
            yield
    finally:
        cur.wait_stream(default)


def _guarded(fn, *args):
    """fn(*args) under `stream_guard`, with the allocator told about cross-stream tensor use."""
    cur = _foreign_stream()
    if cur is None:
        return fn(*args)
    default = torch.cuda.default_stream(cur.device)
    for a in args:  # inputs from the caller's pool are read on the default stream (also later, in backward)
        if isinstance(a, torch.Tensor) and a.is_cuda:
            a.record_stream(default)
    with stream_guard():
        out = fn(*args)
    if isinstance(out, torch.Tensor) and out.is_cuda:
        out.record_stream(cur)
    return out


def free_temporary_memory() -> None:
    """tcnn API compatibility. tinn keeps no temporary arenas: scratch buffers are ordinary torch tensors
    that return to torch's caching allocator (use `torch.cuda.empty_cache()` to release those)."""


def supports_jit_fusion() -> bool:
    """tcnn API compatibility: tinn has no JIT fusion path."""
    return False


# ---------------------------------------------------------------------------------------------------------
# Common tcnn attributes
# ---------------------------------------------------------------------------------------------------------
def _check_dtype(dtype) -> None:
    if dtype not in (None, torch.float32):
        raise ConfigError(f"dtype={dtype} is not supported; allowed: None or torch.float32 (tinn runs in float32)")


def _check_params(name: str, p: torch.Tensor | None, shape: tuple) -> None:
    """The parameter table a kernel is about to read must still be what it was built as."""
    if p is None:
        return
    if p.dtype != torch.float32:
        raise InputError(f"{name} has dtype {p.dtype}; tinn kernels read float32 parameters "
                         "(was the module converted with .double() / .half()? convert it back with .float())")
    checks.check_device(name, p)
    if tuple(p.shape) != tuple(shape):
        raise InputError(f"{name} has shape {tuple(p.shape)}; expected {tuple(shape)}")
    if not p.is_contiguous():
        raise InputError(f"{name} is not contiguous; tinn kernels read it in place (assign a contiguous tensor)")


class _TcnnModule:
    """Mixin: tcnn's Module attributes (`n_params()`, `dtype`, `loss_scale`, `seed`)."""

    dtype = torch.float32
    loss_scale = 1.0

    def n_params(self) -> int:
        """Number of trainable floats (all networks of an array together)."""
        return sum(p.numel() for p in self.parameters())


def _config_copy(config) -> dict:
    data = getattr(config, "data", config)  # a tinn.config.Section or a plain dict
    return copy.deepcopy(dict(data)) if data is not None else {}


# ---------------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------------
class NetworkArray(_TcnnModule, networks.NetworkArray):
    """`n_networks` MLPs of one shape: `forward(x, net_ids)` runs sample b through network `net_ids[b]`.

    Same config as `tcnn.Network` (`otype`, `n_neurons`, `n_hidden_layers`, `activation`,
    `output_activation`); `params` is `(n_networks, n_params_per_network)` with layer l of network k as a
    row-major (fan_out, fan_in) block (`weights(l)` gives the `(n_networks, fan_out, fan_in)` view).
    """

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config: dict, n_networks: int = 1,
                 seed: int = 1337, tile_size: int | None = None):
        super().__init__(n_input_dims, n_output_dims, network_config, n_networks=n_networks, seed=seed,
                         tile_size=tile_size)
        self.network_config = _config_copy(network_config)

    def forward(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        _check_params("params", self.params, (self.n_networks, self.n_params_per_network()))
        return _guarded(super().forward, x, net_ids)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, seed={self.seed}, dtype={self.dtype}"


class Network(NetworkArray):
    """One MLP, tcnn's `Network(n_input_dims, n_output_dims, network_config, seed=1337)`; `net_ids` optional."""

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config: dict, seed: int = 1337):
        super().__init__(n_input_dims, n_output_dims, network_config, n_networks=1, seed=seed)


# ---------------------------------------------------------------------------------------------------------
# Encodings
# ---------------------------------------------------------------------------------------------------------
class Encoding(_TcnnModule, torch.nn.Module):
    """tcnn's `Encoding(n_input_dims, encoding_config, seed=1337, dtype=None)`, plus `n_networks` for arrays
    of encodings with tables (one grid per network, picked by `net_ids`). Any `otype` of
    `tinn.encodings.ENCODINGS` (Identity, Frequency, OneBlob, SphericalHarmonics, TriangleWave, Composite,
    Grid/HashGrid/DenseGrid/TiledGrid as available)."""

    def __init__(self, n_input_dims: int, encoding_config: dict, seed: int = 1337, dtype=None,
                 n_networks: int = 1):
        super().__init__()
        _check_dtype(dtype)
        impl = create_encoding(n_input_dims, encoding_config, n_networks=n_networks, seed=seed)
        # The tinn encoding is kept out of the module tree so that its table appears once, as tcnn's `params`
        # (the very same nn.Parameter object: the kernels read it in place).
        object.__setattr__(self, "_impl", impl)
        self.n_input_dims, self.n_output_dims, self.n_networks = impl.n_input_dims, impl.n_output_dims, impl.n_networks
        self.encoding_config = _config_copy(encoding_config)
        # The config's otype in canonical spelling (impl.otype names the class: "Grid" for a "HashGrid").
        self.otype = Section(encoding_config or {"otype": "Identity"}, "encoding").otype(list(ENCODINGS))
        self.seed = seed
        self.register_parameter("params", impl.params)
        self._params_shape = None if impl.params is None else tuple(impl.params.shape)

    @property
    def impl(self):
        """The underlying `tinn.encodings` module (shares `params`)."""
        return self._impl

    def n_params_per_network(self) -> int:
        return self._impl.n_params_per_network()

    def memory_bytes(self) -> int:
        return self._impl.memory_bytes()

    def _sync_impl(self):
        impl = self._impl
        if impl.params is not self.params:  # replaced by load_state_dict(assign=True), .to() with overwrite, ...
            impl.params = self.params
        _check_params("params", self.params, self._params_shape)
        return impl

    def forward(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        return _guarded(self._sync_impl(), x, net_ids)

    def extra_repr(self) -> str:
        return (f"n_input_dims={self.n_input_dims}, n_output_dims={self.n_output_dims}, n_networks={self.n_networks}, "
                f"seed={self.seed}, dtype={self.dtype}, hyperparams={self.encoding_config}")


# ---------------------------------------------------------------------------------------------------------
# Encoding + network
# ---------------------------------------------------------------------------------------------------------
class NetworkWithInputEncoding(_TcnnModule, torch.nn.Module):
    """tcnn's `NetworkWithInputEncoding(n_input_dims, n_output_dims, encoding_config, network_config,
    seed=1337)`, plus `n_networks` (arrays: `forward(x, net_ids)`) and `share_encoding` (one table for
    all networks instead of one per network; parameter-free encodings are always shared).

    Built exactly like `tinn.NetworkWithInputEncoding` (encoding seeded with `seed`, network with
    `seed + 1`), so both give identical parameters for one seed.
    """

    def __init__(self, n_input_dims: int, n_output_dims: int, encoding_config: dict, network_config: dict,
                 seed: int = 1337, n_networks: int = 1, share_encoding: bool = False):
        super().__init__()
        self.encoding = Encoding(n_input_dims, encoding_config, seed=seed,
                                 n_networks=1 if share_encoding else n_networks)
        self.network = NetworkArray(self.encoding.n_output_dims, n_output_dims, network_config,
                                    n_networks=n_networks, seed=seed + 1)
        self.n_input_dims, self.n_output_dims, self.n_networks = n_input_dims, n_output_dims, n_networks
        self.encoding_config = self.encoding.encoding_config
        self.network_config = self.network.network_config
        self.seed = seed

    @property
    def params(self) -> torch.nn.Parameter:
        own = [p for p in (self.encoding.params, self.network.params) if p is not None]
        if len(own) == 1:
            return own[0]
        raise AttributeError(self._params_message())

    def __getattr__(self, name):
        if name == "params":  # the property's AttributeError lands here; keep its explanation
            raise AttributeError(self._params_message())
        return super().__getattr__(name)

    def _params_message(self) -> str:
        return ("NetworkWithInputEncoding.params is ambiguous: both parts are trainable; use "
                "model.encoding.params and model.network.params (or model.parameters())")

    def forward(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        return _guarded(self._forward, x, net_ids)

    def _forward(self, x, net_ids):
        return models.encode_then_evaluate(self, x, net_ids)

    def inference(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(x, net_ids)

    def memory_bytes(self) -> int:
        return self.encoding.memory_bytes() + self.network.memory_bytes()

    def extra_repr(self) -> str:
        return f"n_input_dims={self.n_input_dims}, n_output_dims={self.n_output_dims}, n_networks={self.n_networks}, " \
               f"seed={self.seed}, dtype={self.dtype}"
