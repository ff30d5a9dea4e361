"""`NetworkWithInputEncoding`: an encoding followed by an MLP, single or as an array.

Mirrors tcnn's constructor `(n_input_dims, n_output_dims, encoding_config,
network_config)`; `n_networks > 1` makes both parts arrays routed by `net_ids`.
Parameter-free encodings (Frequency, ...) are shared by all networks; encodings
with tables (grids) get one table per network unless `share_encoding=True`.

The model is itself a part (tinn/part.py): it runs the encoding's contract, hands
its output to the network in a layout both take (a grid's feature-major features
go straight into the fused network), and runs the two backward passes in reverse.

An array whose networks own their encodings' tables (a hash grid per network) runs
on the batch grouped by network id (`tuning.group_by_network`): one sort, the inputs
gathered into that order and the outputs (and input gradients) put back. A warp's
table lookups then stay in one network's tables, and the network reads its inputs
contiguously, where ids in the caller's order scatter both over every network's
memory.
"""
from __future__ import annotations

import contextlib
import math

import torch

from . import checks, routing, runtime, tcnn_layout
from .encodings import create_encoding
from .encodings.basic import FrequencyEncoding
from .errors import ConfigError
from .kernels import triton_available
from .networks import NetworkArray
from .part import SAMPLE_MAJOR, Context, Part, accumulate, common_layout, has_hooks
from .routing import sorted_bounds


TCNN_ALIGNMENT = 16  # tcnn's MLPs take inputs in multiples of 16


def tcnn_input_padding(encoding) -> tuple[int, float]:
    """(columns, value) tcnn appends to an encoding's output before its network: up to a multiple of
    lcm(16, the encoding's alignment), with ones (a first-layer bias) after parameter-free encodings and
    zeros after grids; a Composite pads as its last nested encoding does."""
    last = encoding.nested[-1] if hasattr(encoding, "nested") else encoding
    features = getattr(last, "n_features_per_level", None)
    align = math.lcm(TCNN_ALIGNMENT, features) if features else TCNN_ALIGNMENT
    n = encoding.n_output_dims
    return (-n) % align, (0.0 if features else 1.0)


class NetworkWithInputEncoding(Part):
    """An encoding followed by an MLP, N of them side by side: `model(x, net_ids)` runs sample b through
    encoding and network `net_ids[b]`. tcnn's `NetworkWithInputEncoding` as an array, but its network's input
    and output are not padded unless `tcnn_padding=True`: without it the same config has fewer parameters and
    computes another function than tcnn's, whose padded variant is `tinn.torch.TcnnNetworkWithInputEncoding`
    (tcnn's name `tinn.torch.NetworkWithInputEncoding`).

    Args:
        n_input_dims: input width.
        n_output_dims: output width.
        encoding_config: a tcnn-style `encoding` config (`{"otype": "HashGrid", ...}`), None for the
            identity, or a `Part` built by the caller (e.g. a `tinn.autodiff.AutodiffPart`).
        network_config: a tcnn-style `network` config (`{"otype": "FullyFusedMLP", "n_neurons": 64, ...}`).
        n_networks: how many encoding + network pairs.
        seed: initialisation seed (the network uses seed + 1).
        share_encoding: one encoding for all networks instead of one each.
        share_network: one network (the decoder) for all, each keeping its own encoding table: every sample
            trains the one network, where a network per id learns only from its own samples (an octree's deep
            nodes, each seen by few rays). Needs an encoding with tables. The network computes as an array's
            would (`NetworkArray(served_ids=)`), also where a rank's shard of the ids holds only one: every
            replica of a sharded model's decoder then runs in one precision.
        kernels: force the network's path ("fused", "unfused", ...; see `NetworkArray`).
        tcnn_padding: pad the network's input as tcnn does (see `tcnn_input_padding`), so the same
            parameters give tcnn's function.
        precision: the network's products' precision (see `NetworkArray`); None for the settings' choice.
        group_by_network: run the parts on the batch grouped by network id (the module's notes); None for
            `tuning.group_by_network`. False suits callers whose batches already come in runs of one network
            (an octree's samples along its rays).

    Raises:
        ConfigError: a bad config value (the message names the key path and the allowed values), or an
            encoding part whose input width or network count does not match.

    Example:
        >>> model = NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 8},
        ...                                  {"otype": "FullyFusedMLP", "n_neurons": 64}, n_networks=16)
        >>> y = model(x, net_ids)          # (batch, 3), differentiable by torch autograd
    """

    def __init__(self, n_input_dims: int, n_output_dims: int, encoding_config: dict | None,
                 network_config: dict | None, n_networks: int = 1, seed: int = 1337, share_encoding: bool = False,
                 kernels: str | None = None, tcnn_padding: bool = False, precision: str | None = None,
                 group_by_network: bool | None = None, share_network: bool = False):
        super().__init__(n_input_dims, n_output_dims, n_networks)
        if group_by_network not in (None, True, False):
            raise ConfigError(f"group_by_network={group_by_network!r}; allowed: None (tuning.group_by_network), "
                              "True or False")
        if share_network not in (True, False):
            raise ConfigError(f"share_network={share_network!r}; allowed: True or False")
        if share_encoding and share_network:
            raise ConfigError("share_encoding=True and share_network=True leave one model for every id; allowed: "
                              "at most one of them (or n_networks=1)")
        self.group_by_network = group_by_network
        if isinstance(encoding_config, Part):  # a part built by the caller (e.g. a tinn.autodiff part)
            enc = encoding_config
            want = 1 if share_encoding else n_networks
            if enc.n_input_dims != n_input_dims or enc.n_networks != want:
                raise ConfigError(f"the encoding part has n_input_dims={enc.n_input_dims}, n_networks="
                                  f"{enc.n_networks}; allowed: n_input_dims={n_input_dims}, n_networks={want}")
            self.encoding = enc
        else:
            self.encoding = create_encoding(n_input_dims, encoding_config,
                                            n_networks=1 if share_encoding else n_networks, seed=seed)
        if share_network and not any(t is not None for t in self.encoding.parameter_tables()):
            raise ConfigError(f"share_network=True with an encoding without tables ({type(self.encoding).__name__}) "
                              "makes every network the same function; allowed: an encoding with tables (a grid)")
        self.network = NetworkArray(self.encoding.n_output_dims, n_output_dims, network_config,
                                    n_networks=1 if share_network else n_networks, seed=seed + 1, kernels=kernels,
                                    precision=precision,
                                    served_ids=max(n_networks, 2) if share_network else n_networks,
                                    input_padding=tcnn_input_padding(self.encoding) if tcnn_padding else None,
                                    output_padding=(-n_output_dims) % TCNN_ALIGNMENT if tcnn_padding else 0)
        self.seed = seed
        self.share_encoding = bool(share_encoding)  # tinn.distributed replicates a shared encoding
        self.share_network = bool(share_network)    # ... and a shared network

    def parameter_tables(self):
        return self.encoding.parameter_tables() + self.network.parameter_tables()

    def check_parameter_tables(self) -> None:
        self.encoding.check_parameter_tables()
        self.network.check_parameter_tables()

    @property
    def params(self) -> torch.Tensor:
        """tcnn's flat parameter vector when the tables are bound to one (tinn.torch's single models: the
        network's then the encoding's, sharing their storage), else the one table when only one part has
        one."""
        flat = tcnn_layout.flat_view(self, self.__dict__.get("_flat_params"))
        if flat is not None:
            return flat
        own = [t for t in self.parameter_tables() if t is not None]
        if len(own) == 1:
            return own[0]
        raise AttributeError("NetworkWithInputEncoding.params is ambiguous: both parts are trainable; use "
                             "model.encoding.params and model.network.params (or model.parameters()), or "
                             "tinn.torch.export_params(model) for tcnn's flat layout")

    def __getattr__(self, name):
        if name == "params":  # the property's AttributeError lands here; keep its explanation
            return type(self).params.fget(self)
        return super().__getattr__(name)

    def _encoding_ids(self, ids):
        return ids if self.encoding.n_networks > 1 else checks.zero_ids(ids.shape[0])

    def _network_ids(self, ids):
        return ids if self.network.n_networks > 1 else checks.zero_ids(ids.shape[0])

    def run_checked(self, x, ids):
        """With hooks on a part, the parts run as modules (each its own autograd node) so the hooks see
        their calls; otherwise the composed contract runs as one node."""
        if has_hooks(self.encoding) or has_hooks(self.network):
            with checks.disabled():  # validated by the caller
                h = self.encoding(x, ids if self.encoding.n_networks > 1 else None)
                return self.network(h, ids if self.network.n_networks > 1 else None)
        return super().run_checked(x, ids)

    def groups_by_network(self) -> bool:
        """Whether the parts run on the batch grouped by network id (the module's notes): the model's own
        `group_by_network`, else `tuning.group_by_network`, else (None) on CUDA where every network owns its
        encoding's tables."""
        if self.n_networks == 1:
            return False
        wanted = self.group_by_network if self.group_by_network is not None else runtime.tuning().group_by_network
        if wanted is not None:
            return bool(wanted)
        return (runtime.device().type == "cuda" and self.encoding.n_networks > 1
                and any(t is not None for t in self.encoding.parameter_tables()))

    def _grouping(self, ids, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR):
        """(int64 positions of the batch's samples grouped by network id (stable), the grouped ids, their
        per-network bounds), or None where the parts run on the caller's order (a single network, feature-major
        inputs or outputs, grouping off). Positions None: the caller's `routing.grouped` block says the batch
        comes grouped already."""
        if ids.shape[0] < 2 or x_layout != SAMPLE_MAJOR or y_layout != SAMPLE_MAJOR or not self.groups_by_network():
            return None
        bounds = routing.grouped_bounds(ids, self.n_networks)
        if bounds is not None:  # the caller grouped the batch already: no sort, and no rows to move
            return None, ids, bounds
        order, bounds = sorted_bounds(ids, self.n_networks)
        order = order.long()
        return order, ids[order], bounds

    def forward_with_context(self, x, ids, *, train, x_layout="sample_major", y_layout="sample_major"):
        grouping = self._grouping(ids, x_layout, y_layout)
        if grouping is None:
            return self._forward_parts(x, ids, train, x_layout, y_layout)
        order, grouped_ids, bounds = grouping
        with routing.grouped(grouped_ids, bounds):  # the network's routing reuses this sort
            y, ctx = self._forward_parts(_rows(x, order), grouped_ids, train, x_layout, y_layout)
        if ctx is not None:
            ctx.order = order
        return _ungrouped(y, order), ctx

    def _forward_parts(self, x, ids, train, x_layout, y_layout):
        if not train and x_layout == "sample_major" and self._frequencies_fuse(x):
            # Inference of Frequency -> fused MLP: the network's kernel encodes the raw inputs as it loads
            # them, so the (batch, 2 * octaves * dims) features never go through memory.
            return self.network.inference_of_frequencies(x, self._network_ids(ids), self.encoding.n_frequencies), None
        handover = common_layout(self.encoding, self.network)
        h, enc_ctx = self.encoding.forward_with_context(x, self._encoding_ids(ids), train=train, y_layout=handover)
        y, net_ctx = self.network.forward_with_context(h, self._network_ids(ids), train=train, x_layout=handover)
        return y, (Context(encoding=enc_ctx, network=net_ctx) if train else None)

    def _frequencies_fuse(self, x) -> bool:
        fuses = getattr(self.network, "fuses_frequency_inputs", None)
        return (type(self.encoding) is FrequencyEncoding and fuses is not None and
                fuses(x.shape[1], self.encoding.n_frequencies))

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        order = getattr(ctx, "order", None)
        dy = _rows(dy, order)
        need_dh, train_encoding = self._needs(need_dx, need_grads)
        dh, net_grads = self.network.backward(ctx.network, dy, need_dx=need_dh, need_grads=need_grads)
        dx, grads = self._encoding_backward(ctx, dh if need_dh else None, net_grads, need_dx, train_encoding)
        return _ungrouped(dx, order), grads

    def fuses_loss(self, need_dx: bool = False) -> bool:
        return self.network.fuses_loss(self._needs(need_dx, True)[0])

    def backward_from_loss(self, ctx, y, loss, target, *, need_dx, need_grads=True):
        """The network's backward takes the loss (the fused MLP computes its gradient in its own kernel)."""
        order = getattr(ctx, "order", None)
        y, target = _rows(y, order), _rows(target, order)
        need_dh, train_encoding = self._needs(need_dx, need_grads)
        dh, net_grads, value = self.network.backward_from_loss(ctx.network, y, loss, target, need_dx=need_dh,
                                                               need_grads=need_grads)
        dx, grads = self._encoding_backward(ctx, dh if need_dh else None, net_grads, need_dx, train_encoding)
        return _ungrouped(dx, order), grads, value

    def gradients_from_loss(self, x, ids, loss, target, *, need_dx, need_grads=True, x_layout="sample_major"):
        """The encoding's training forward, then the network's `gradients_from_loss` (the tensor cores' backward
        recomputes the network's forward from the encoding's output: no network forward runs), then the
        encoding's backward."""
        grouping = self._grouping(ids, x_layout)
        order = None
        hint = contextlib.nullcontext()
        if grouping is not None:
            order, ids, bounds = grouping
            x, target = _rows(x, order), _rows(target, order)
            hint = routing.grouped(ids, bounds)  # the network's routing reuses this sort
        need_dh, train_encoding = self._needs(need_dx, need_grads)
        handover = common_layout(self.encoding, self.network)
        h, enc_ctx = self.encoding.forward_with_context(x, self._encoding_ids(ids), train=True, x_layout=x_layout,
                                                        y_layout=handover)
        with hint:
            dh, net_grads, value = self.network.gradients_from_loss(h, self._network_ids(ids), loss, target,
                                                                    need_dx=need_dh, need_grads=need_grads,
                                                                    x_layout=handover)
        ctx = Context(encoding=enc_ctx, network=None)
        dx, grads = self._encoding_backward(ctx, dh if need_dh else None, net_grads, need_dx, train_encoding)
        return _ungrouped(dx, order), grads, value

    def _needs(self, need_dx, need_grads) -> tuple[bool, bool]:
        """(whether the network's input gradient is needed, whether the encoding trains)."""
        train_encoding = need_grads and any(t is not None and t.requires_grad for t in self.encoding.parameter_tables())
        return need_dx or train_encoding, train_encoding

    def _encoding_backward(self, ctx, dh, net_grads, need_dx, train_encoding):
        if dh is None:
            return None, (None,) * len(self.encoding.parameter_tables()) + net_grads
        dx, enc_grads = self.encoding.backward(ctx.encoding, dh, need_dx=need_dx, need_grads=train_encoding)
        return dx, tuple(enc_grads) + net_grads

    def backward_backward(self, ctx, dy, ddx, *, need_ddy, need_dx, need_dtables):
        """The chain rule through both parts: dx = J_E^T dh with dh = J_N^T dy, so <ddx, dx> reaches
        the encoding directly (its own second derivative, with dh as its dy) and the network through
        ddh = J_E ddx; the network's answer for its input h flows back to x through J_E^T."""
        order = getattr(ctx, "order", None)
        dy, ddx = _rows(dy, order), _rows(ddx, order)
        enc, net = self.encoding, self.network
        dh, _ = net.backward(ctx.network, dy, need_dx=True, need_grads=False)
        ddh, a_x, a_enc = enc.backward_backward(ctx.encoding, dh, ddx, need_ddy=True, need_dx=need_dx,
                                                need_dtables=need_dtables)
        enc_tables = [t for t in enc.parameter_tables()]
        via_h = need_dx or (need_dtables and any(t is not None for t in enc_tables))
        b_dy, b_h, b_net = net.backward_backward(ctx.network, dy, ddh, need_ddy=need_ddy, need_dx=via_h,
                                                 need_dtables=need_dtables)
        c_x, c_enc = (None, (None,) * len(enc_tables))
        if via_h and b_h is not None:
            c_x, c_enc = enc.backward(ctx.encoding, b_h, need_dx=need_dx, need_grads=need_dtables)
        d_x = accumulate(a_x, c_x) if need_dx else None
        d_enc = tuple(accumulate(a, c) for a, c in zip(a_enc or (None,) * len(enc_tables), c_enc))
        return _ungrouped(b_dy, order), _ungrouped(d_x, order), d_enc + tuple(b_net)

    def memory_bytes(self) -> int:
        return self.encoding.memory_bytes() + self.network.memory_bytes()

    def n_params_per_network(self) -> int:
        """Parameters each id owns: a shared part's are counted by neither."""
        return (self.network.n_params_per_network() if not self.share_network else 0) + (
            self.encoding.n_params_per_network() if self.encoding.n_networks > 1 else 0)


def _rows(t: torch.Tensor | None, order: torch.Tensor | None) -> torch.Tensor | None:
    """t[order] for the grouped order (contiguous). A 2-D tensor on the GPU is gathered in one Triton pass
    (tinn/kernels/row_gather.py), elsewhere through its transpose: torch's row gather of rows a multiple of 16
    bytes long (a 4-wide float32 output's gradient) runs a vectorized kernel that measured 17x slower than
    indexing the transposed tensor's columns (1.5M rows: 0.93 against 0.055 ms, one H100; docs/design-notes.md),
    and the copy back to rows is one more pass at memory speed."""
    if t is None or order is None:
        return t
    if t.dim() == 2:
        if _triton_rows(t):
            from .kernels.row_gather import gather_rows
            return gather_rows(t, order)
        return t.t()[:, order].t().contiguous()
    return t[order]


def _triton_rows(t: torch.Tensor) -> bool:
    """Whether t's rows move through tinn/kernels/row_gather.py: 2-D, on the GPU, in a dtype its gather carries
    exactly (its arithmetic is float32)."""
    return (t.dim() == 2 and t.is_cuda and t.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and triton_available())


def _ungrouped(t: torch.Tensor | None, order: torch.Tensor | None) -> torch.Tensor | None:
    """Rows of `t` computed for the samples at `order` (grouped by network), put back in the caller's order: on
    the GPU in one Triton pass (torch's `index_copy_` of narrow rows runs far below memory speed there)."""
    if t is None or order is None:
        return t
    if _triton_rows(t):
        from .kernels.row_gather import scatter_rows
        return scatter_rows(t, order)
    return torch.empty_like(t).index_copy_(0, order, t)
