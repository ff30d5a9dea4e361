"""`NetworkArray`: N independent MLPs of one shape, each sample routed by network id.

Follows tcnn's network config (`otype` FullyFusedMLP / CutlassMLP, `n_neurons`,
`n_hidden_layers`, `activation`, `output_activation`); like tcnn the layers have
no biases. All N weight sets live in one (N, n_params) float32 nn.Parameter that
the Taichi kernels read and write in place.
"""
from __future__ import annotations

import math
import os

import torch

from . import checks, runtime
from .activations import SINE, activation_code, activation_name
from .config import Section, count
from .kernels import mlp_array as K
from .kernels import mlp_fused as FK
from .routing import Routing, TileRouting, route, route_fused

NETWORK_OTYPES = ["FullyFusedMLP", "CutlassMLP"]
# Every key of a network config besides "otype" (`parse_network_config` rejects any other).
NETWORK_OPTIONS = ("n_neurons", "n_hidden_layers", "activation", "output_activation")
FULLY_FUSED_WIDTHS = (16, 32, 64, 128)
MAX_NETWORKS = 1 << 20
# A single network's weight gradients as vendor GEMMs (cuBLAS / the CPU BLAS), see
# NetworkArray._gemm_weight_gradients; TINN_VENDOR_WGRAD=0 keeps them in tinn's kernels (A/B runs, tests).
VENDOR_WEIGHT_GRADIENTS = os.environ.get("TINN_VENDOR_WGRAD", "1") != "0"
MAX_K_SLICES = int(os.environ.get("TINN_WGRAD_SLICES", 256))  # split-K of those GEMMs on CUDA (see mm_long_k)
MIN_K_SLICE = 1024


def parse_network_config(config, path: str = "network") -> dict:
    cfg = config if isinstance(config, Section) else Section(config, path)
    otype = cfg.otype(NETWORK_OTYPES, "FullyFusedMLP")
    cfg.expect_keys(("otype", *NETWORK_OPTIONS), repr(otype))
    if otype == "FullyFusedMLP":
        width = cfg.integer("n_neurons", 64, allowed=FULLY_FUSED_WIDTHS)
    else:
        width = cfg.integer("n_neurons", 64, lo=1, hi=256)
    return {
        "otype": otype,
        "n_neurons": width,
        "n_hidden_layers": cfg.integer("n_hidden_layers", 2, lo=0, hi=8),
        "activation": activation_code(cfg, "activation", "ReLU"),
        "output_activation": activation_code(cfg, "output_activation", "None"),
    }


def mm_long_k(products: list[tuple[torch.Tensor, torch.Tensor]], out: torch.Tensor,
              max_slices: int | None = None) -> None:
    """Consecutive blocks of the contiguous `out` receive a_i @ b_i^T, for (M_i, K) and (N_i, K)
    operands sharing K (the batch), K far larger than M_i and N_i (weight gradients).

    On CUDA cuBLAS gives such a GEMM few blocks (measured on an H100 at K = 2^18: 11-18 TFLOP/s); cutting
    K into slices, one batched GEMM over them and a sum of the slice products ran 1.6x faster
    (benchmarks/debug/wgrad_gemm_ab.py). Every product writes its slice products into one buffer, so
    a single sum reduces them all (host time: each torch op costs tens of microseconds). Elsewhere
    one plain GEMM per product.
    """
    k = products[0][0].shape[1]
    if max_slices is None:
        max_slices = MAX_K_SLICES if out.is_cuda else 1
    slices = min(max_slices, k // MIN_K_SLICE)

    def blocks():  # out's block of each product (built only when needed: views cost host time too)
        off = out.storage_offset()
        for a, b in products:
            yield out.as_strided((a.shape[0], b.shape[0]), (b.shape[0], 1), off)
            off += a.shape[0] * b.shape[0]

    if slices < 2:
        for (a, b), block in zip(products, blocks()):
            torch.mm(a, b.t(), out=block)
        return
    step = k // slices
    main = slices * step
    total = sum(a.shape[0] * b.shape[0] for a, b in products)
    partial = torch.empty(slices, total, dtype=out.dtype, device=out.device)
    off = 0
    for a, b in products:
        m, n = a.shape[0], b.shape[0]
        # Strided views, one op each: [s, m, j] = a[m, s*step + j] and [s, j, n] = b[n, s*step + j].
        a_slices = a.as_strided((slices, m, step), (step * a.stride(1), a.stride(0), a.stride(1)))
        b_slices = b.as_strided((slices, step, n), (step * b.stride(1), b.stride(1), b.stride(0)))
        torch.bmm(a_slices, b_slices, out=partial.as_strided((slices, m, n), (total, n, 1), off))
        off += m * n
    torch.sum(partial, 0, out=out.as_strided((total,), (1,)))
    if main < k:
        for (a, b), block in zip(products, blocks()):
            block.addmm_(a[:, main:], b[:, main:].t())


class _MLPArrayFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, net_ids, params, net):
        out, acts, pre, routing = net._forward_train(x.detach(), net_ids, params.detach())
        ctx.net = net
        ctx.routing = routing
        ctx.save_for_backward(x.detach(), net_ids, params.detach(), acts, pre, out)
        return out

    @staticmethod
    def backward(ctx, dy):
        # Saved outputs come back attached to the graph; kernels must get plain tensors.
        x, net_ids, params, acts, pre, out = (t.detach() for t in ctx.saved_tensors)
        want_dx = ctx.needs_input_grad[0]
        dx, dparams = ctx.net._backward(dy.detach().contiguous(), x, net_ids, params, acts, pre, out, ctx.routing, want_dx)
        return dx, None, dparams, None


class NetworkArray(torch.nn.Module):
    """N MLPs sharing one shape. `forward(x, net_ids)` runs sample b through network net_ids[b]."""

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config: dict | Section | None = None,
                 n_networks: int = 1, seed: int = 1337, tile_size: int | None = None):
        super().__init__()
        runtime.ensure_init()
        cfg = parse_network_config(network_config or {})
        n_input_dims, n_output_dims = count("n_input_dims", n_input_dims), count("n_output_dims", n_output_dims)
        n_networks = count("n_networks", n_networks, hi=MAX_NETWORKS)
        self.config = cfg
        self.n_input_dims, self.n_output_dims, self.n_networks = n_input_dims, n_output_dims, n_networks
        self.width = cfg["n_neurons"]
        self.n_layers = cfg["n_hidden_layers"] + 1  # weight matrices
        self.hidden_act, self.output_act = cfg["activation"], cfg["output_activation"]
        self.keep_pre = SINE in (self.hidden_act, self.output_act)
        # Small tiles on the GPU keep many blocks busy; on the CPU fewer, longer tiles mean fewer atomics.
        self.tile_size = tile_size or (256 if runtime.arch() == "cuda" else 4096)
        # The fused kernels (one launch for all layers, shared memory) need CUDA; Sine keeps the
        # unfused path because its derivative needs pre-activations. TINN_FUSED=0 turns them off.
        self.fused = (runtime.arch() == "cuda" and not self.keep_pre and os.environ.get("TINN_FUSED", "1") != "0"
                      and FK.supported(n_input_dims, self.width, n_output_dims))
        # Tile sizes of the fused kernels, fixed by the shape: computed once, not per call.
        self.fused_geometry = (FK.geometry(n_input_dims, self.width, n_output_dims, self.n_layers)
                               if self.fused else None)
        # A single network's tiles depend only on the batch size: kept for the last few sizes.
        self._single_network_tiles: dict[tuple[int, bool], tuple[TileRouting, ...]] = {}
        self.seed = seed
        self.params = torch.nn.Parameter(torch.empty(n_networks, self.n_params_per_network(), device=runtime.device()))
        self.params.tinn_layer_shapes = self.layer_shapes()  # lets matrix-aware optimizers (Shampoo) see layers
        self.reset_parameters(seed)

    # ---- shapes -------------------------------------------------------------------------------
    def layer_shapes(self) -> list[tuple[int, int]]:
        """(fan_out, fan_in) of each weight matrix."""
        return K.layer_shapes(self.n_input_dims, self.width, self.n_output_dims, self.n_layers)

    def n_params_per_network(self) -> int:
        return sum(o * i for o, i in self.layer_shapes())

    def weights(self, layer: int, params: torch.Tensor | None = None) -> torch.Tensor:
        """View of weight matrix `layer` for all networks, shaped (N, fan_out, fan_in)."""
        p = self.params if params is None else params
        shapes = self.layer_shapes()
        off = sum(o * i for o, i in shapes[:layer])
        o, i = shapes[layer]
        return p[:, off:off + o * i].view(p.shape[0], o, i)

    def flops_per_sample(self) -> int:
        return 2 * self.n_params_per_network()

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """tcnn's init: each matrix uniform in ±sqrt(6 / (fan_in + fan_out)), reproducible from the seed."""
        gen = torch.Generator().manual_seed(self.seed if seed is None else seed)
        host = torch.empty(self.n_networks, self.n_params_per_network())
        off = 0
        for o, i in self.layer_shapes():
            bound = math.sqrt(6.0 / (o + i))
            host[:, off:off + o * i].uniform_(-bound, bound, generator=gen)
            off += o * i
        self.params.copy_(host)

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = checks.float_input("input", x, self.n_input_dims)
        ids = checks.net_ids(net_ids, x.shape[0], self.n_networks)
        if torch.is_grad_enabled() and (x.requires_grad or self.params.requires_grad):
            return _MLPArrayFn.apply(x, ids, self.params, self)
        return self._inference(x.detach(), ids)

    def inference(self, x: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(x, net_ids)

    def _static_shape(self):
        return self.n_input_dims, self.width, self.n_output_dims, self.n_layers

    def _launch_forward(self, x, ids, params, order, keep_all):
        # Scratch buffers are feature-major and indexed by sorted position: (layer, feature, position).
        batch = x.shape[0]
        dev = x.device
        slots = (self.n_layers - 1) if keep_all else min(self.n_layers - 1, 2)
        acts = torch.empty(max(slots, 1), self.width, batch if slots else 1, device=dev)
        pre = torch.empty((self.n_layers, max(self.width, self.n_output_dims), batch) if self.keep_pre else (1, 1, 1),
                          device=dev)
        out = torch.empty(batch, self.n_output_dims, device=dev)
        if batch:
            K.forward(x, ids, order, params, acts, pre, out, *self._static_shape(),
                      self.hidden_act, self.output_act, keep_all, self.keep_pre)
        return out, acts, pre

    def _fused_tiles(self, ids, train: bool) -> tuple[TileRouting, ...]:
        """Forward tiles, plus when training the weight-gradient chunks and the backward-deltas tiles
        (one sort for all; the backward reuses the forward's tiles when both have one size)."""
        g = self.fused_geometry
        separate_backward = train and g.backward_tile != g.tile
        sizes = (g.tile,) + ((FK.grad_chunk(ids.shape[0]),) if train else ()) + \
            ((g.backward_tile,) if separate_backward else ())
        if self.n_networks > 1:
            tiles = route_fused(ids, self.n_networks, sizes)
        else:
            key = (ids.shape[0], train)
            tiles = self._single_network_tiles.get(key)
            if tiles is None:
                if len(self._single_network_tiles) >= 4:
                    self._single_network_tiles.clear()
                tiles = self._single_network_tiles[key] = route_fused(ids, 1, sizes)
        return tiles if not train or separate_backward else tiles + (tiles[0],)

    def _launch_fused_forward(self, x, ids, params, keep_all, x_fm=False):
        ts, staged, f, _ = self.fused_geometry
        tiles = self._fused_tiles(ids, train=keep_all)
        batch = ids.shape[0]
        acts = torch.empty((self.n_layers - 1, self.width, batch) if keep_all and self.n_layers > 1 else (1, 1, 1),
                           device=x.device)
        out = torch.empty(batch, self.n_output_dims, device=x.device)
        if batch:
            t = tiles[0]
            FK.forward(x, t.order, t.tile_net, t.tile_start, t.tile_count, params, acts, out,
                       *self._static_shape(), self.hidden_act, self.output_act, keep_all, ts, staged, f, x_fm)
        return out, acts, (tiles if keep_all else None)

    def _inference(self, x, ids):
        if self.fused:
            return self._launch_fused_forward(x, ids, self.params.detach(), keep_all=False)[0]
        order = route(ids, self.n_networks, self.tile_size, tiles=False).order
        out, _, _ = self._launch_forward(x, ids, self.params.detach(), order, keep_all=False)
        return out

    def _forward_train(self, x, ids, params, x_feature_major=False):
        """Forward keeping what the backward needs. `x_feature_major` (fused path only): x is (n_in, batch),
        as a grid encoding writes it, and `_backward` then returns dx the same way."""
        if x_feature_major and not self.fused:
            raise ValueError("feature-major inputs need the fused kernels")
        if self.fused:
            out, acts, routing = self._launch_fused_forward(x, ids, params, keep_all=True, x_fm=x_feature_major)
            return out, acts, acts[:0], routing[1:]  # (the weight-gradient chunks, the backward's tiles)
        routing = route(ids, self.n_networks, self.tile_size)
        out, acts, pre = self._launch_forward(x, ids, params, routing.order, keep_all=True)
        return out, acts, pre, routing

    def _backward(self, dy, x, ids, params, acts, pre, out, routing: Routing | tuple[TileRouting, TileRouting],
                  want_dx: bool, x_feature_major: bool = False):
        batch = ids.shape[0]
        dev = x.device
        dx_shape = (self.n_input_dims, batch) if x_feature_major else (batch, self.n_input_dims)
        dx = torch.empty(dx_shape, device=dev) if want_dx else torch.empty(1, 1, device=dev)
        gemm = batch > 0 and self.n_networks == 1 and VENDOR_WEIGHT_GRADIENTS
        dparams = torch.empty_like(params) if gemm else torch.zeros_like(params)  # the GEMMs write every weight
        if not batch:
            return (dx if want_dx else None), dparams
        deltas = torch.empty(self.n_layers, max(self.width, self.n_output_dims), batch, device=dev)
        if self.fused:
            chunks, tiles = routing
            _, _, f, ts = self.fused_geometry
            FK.backward_deltas(dy, tiles.order, tiles.tile_net, tiles.tile_start, tiles.tile_count, params,
                               acts, out, deltas, dx, *self._static_shape(), self.hidden_act, self.output_act,
                               want_dx, ts, f, x_feature_major)
        else:
            K.backward_deltas(dy, ids, routing.order, params, acts, pre, out, deltas, dx, *self._static_shape(),
                              self.hidden_act, self.output_act, self.keep_pre, want_dx)
        if gemm:
            self._gemm_weight_gradients(x if x_feature_major else x.t(), acts, deltas, dparams)
        elif self.fused:
            FK.weight_gradients(x, chunks.order, chunks.tile_net, chunks.tile_start, chunks.tile_count,
                                acts, deltas, dparams, *self._static_shape(), f, x_feature_major)
        else:
            partial = torch.empty(routing.n_tiles, params.shape[1], device=dev)
            offset = 0
            for l, (fan_out, fan_in) in enumerate(self.layer_shapes()):
                K.tile_weight_gradient(x, acts, l > 0, routing.order, routing.tile_start, routing.tile_end,
                                       deltas, partial, l, fan_in, fan_out, offset)
                offset += fan_out * fan_in
            K.reduce_tiles(partial, routing.tile_net, dparams)
        return (dx if want_dx else None), dparams

    def _gemm_weight_gradients(self, x_t, acts, deltas, dparams):
        """One network: dW_l = deltas_l @ input_l^T over the whole batch, vendor GEMMs per layer.

        With a single network the batch is one long reduction (K = batch), what split-K GEMMs are for
        (tcnn computes its weight gradients with CUTLASS GEMMs the same way). Its sorted order is the
        identity, so the feature-major deltas and activations line up with the input's samples; `x_t`
        is the network input as (n_in, batch), a view of either layout. Plain float32 unless
        torch.backends.cuda.matmul.allow_tf32 is set. Used by the fused (CUDA) and the unfused (CPU)
        backward alike: both keep deltas and activations feature-major by sorted position.
        """
        # Row 0 of dparams holds the layers' (fan_out, fan_in) blocks one after the other.
        mm_long_k([(deltas[l, :fan_out], x_t if l == 0 else acts[l - 1, :fan_in])   # (fan_out, B), (fan_in, B)
                   for l, (fan_out, fan_in) in enumerate(self.layer_shapes())], dparams)

    def memory_bytes(self) -> int:
        return self.params.numel() * self.params.element_size()

    def extra_repr(self) -> str:
        return (f"n_networks={self.n_networks}, in={self.n_input_dims}, out={self.n_output_dims}, "
                f"width={self.width}, hidden_layers={self.n_layers - 1}, "
                f"activation={activation_name(self.hidden_act)}, output_activation={activation_name(self.output_act)}")


class Network(NetworkArray):
    """A single MLP (tcnn's `Network`): a NetworkArray of one."""

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config=None, seed: int = 1337):
        super().__init__(n_input_dims, n_output_dims, network_config, n_networks=1, seed=seed)
