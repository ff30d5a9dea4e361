"""Multiresolution grid encodings: tcnn's `Grid` / `HashGrid` / `DenseGrid` / `TiledGrid`.

With `n_networks > 1` the module holds one independent grid per network (one per
KiloNeRF cell / octree node) in a single `params` tensor shaped
`(n_networks, n_params_per_network)`; every sample looks up the grid of its
`net_ids` entry. Gradients reach `params` and the inputs through torch autograd,
and the input-gradient path is itself differentiable (second order), so
eikonal / normal losses on `d(encoding)/dx` train the grids.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from .. import runtime
from ..config import Section, count
from ..errors import ConfigError
from ..kernels import grid_encoding as K
from .base import Encoding
from .grid_layout import (GRID_TYPES, HASH_PRIMES, HASH_TYPES, INTERPOLATIONS, MAX_N_LEVELS, GridLayout,
                          default_per_level_scale, grid_layout)

_OTYPE_DEFAULT_TYPE = {"Grid": "Hash", "HashGrid": "Hash", "DenseGrid": "Dense", "TiledGrid": "Tiled"}
_INTERP_CODE = {"Nearest": K.NEAREST, "Linear": K.LINEAR, "Smoothstep": K.SMOOTHSTEP}
_TYPE_CODE = {"Hash": K.HASH, "Dense": K.DENSE, "Tiled": K.TILED}
_INT32_MAX = 2**31 - 1
# One thread per (level, sample, feature) instead of per (level, sample) for the parameter gradient
# (see grid_backward_lanes): it pays on a GPU, whose memory system serves a warp's neighbouring
# words as one request; a CPU thread only repeats the hashing (measured a little slower). None = by backend;
# TINN_GRID_FEATURE_LANES=0/1 forces it (A/B scripts).
_LANES_ENV = os.environ.get("TINN_GRID_FEATURE_LANES")
FEATURE_LANES = None if _LANES_ENV is None else _LANES_ENV != "0"


def _feature_lanes() -> bool:
    return runtime.arch() == "cuda" if FEATURE_LANES is None else FEATURE_LANES


_PLACEHOLDERS: dict = {}


def _placeholder(device) -> torch.Tensor:
    """A shared (1, 1) tensor for kernel arguments a launch never touches (never returned to autograd)."""
    t = _PLACEHOLDERS.get(device)
    if t is None:
        t = _PLACEHOLDERS[device] = torch.zeros(1, 1, dtype=torch.float32, device=device)
    return t


class _GridLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, params, net_ids, grid, param_offset):
        out = grid._launch_forward(x.detach(), net_ids, params.detach(), param_offset)
        # Save the originals, not detached copies: with create_graph the backward must stay connected to them.
        ctx.save_for_backward(x, params, net_ids)
        ctx.grid, ctx.param_offset = grid, param_offset
        return out

    @staticmethod
    def backward(ctx, dy):
        x, params, net_ids = ctx.saved_tensors
        want_x, want_params = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (want_x or want_params):
            return None, None, None, None, None
        dx, dparams = _GridLookupBackward.apply(x, params, dy.contiguous(), net_ids, ctx.grid, ctx.param_offset,
                                                want_x, want_params)
        return (dx if want_x else None), (dparams if want_params else None), None, None, None


class _GridLookupBackward(torch.autograd.Function):
    """(dx, dparams) = backward of the lookup; differentiable once more for eikonal-style losses."""

    @staticmethod
    def forward(ctx, x, params, dy, net_ids, grid, param_offset, want_x, want_params):
        ctx.set_materialize_grads(False)
        # Unwanted outputs are tiny fresh tensors (outputs of a Function must not be shared).
        dx = torch.zeros_like(x) if want_x else x.new_zeros(1, 1)
        dparams = torch.zeros_like(params) if want_params else x.new_zeros(1, 1)
        grid._launch_backward(x.detach(), net_ids, params.detach(), param_offset, dy.detach(), dparams, dx,
                              want_params, want_x)
        ctx.save_for_backward(x, params, dy, net_ids)
        ctx.grid, ctx.param_offset = grid, param_offset
        ctx.want_x, ctx.want_params = want_x, want_params
        return dx, dparams

    @staticmethod
    @once_differentiable
    def backward(ctx, g_dx, g_dparams):
        x, params, dy, net_ids = (t.detach() for t in ctx.saved_tensors)
        grid, off = ctx.grid, ctx.param_offset
        need_x, need_params, need_dy = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        out_x = torch.zeros_like(x) if need_x else None
        out_params = torch.zeros_like(params) if need_params else None
        out_dy = torch.zeros_like(dy) if need_dy else None
        if g_dx is not None and ctx.want_x:
            grid._launch_backward_backward(x, net_ids, params, off, dy, g_dx.contiguous(), out_dy, out_params, out_x)
        if g_dparams is not None and ctx.want_params and (need_dy or need_x):
            # dparams scatters w(x) * dy, so its derivative is a lookup into g_dparams:
            # w.r.t. dy the plain lookup, w.r.t. x the lookup's input gradient.
            g_table = g_dparams.contiguous()
            if need_dy:
                out_dy += grid._launch_forward(x, net_ids, g_table, off)
            if need_x:
                grid._launch_backward(x, net_ids, g_table, off, dy, _placeholder(x.device), out_x, False, True)
        return out_x, out_params, out_dy, None, None, None, None, None


class GridEncoding(Encoding):
    """Trainable multiresolution grid (tcnn semantics), one grid per network.

    Output: `n_levels * n_features_per_level` features, level-major
    (`out[:, level * F + f]`). Inputs are expected in [0, 1]^D; outside they wrap
    (dense/tiled) or hash, as in tcnn.
    """

    otype = "Grid"
    # "stochastic_interpolation" is tcnn's; only false is supported.
    OPTIONS = ("n_levels", "n_features", "n_grid_features", "n_features_per_level", "log2_hashmap_size",
               "base_resolution", "per_level_scale", "type", "interpolation", "hash", "stochastic_interpolation")

    def __init__(self, n_input_dims: int, n_levels: int = 16, n_features_per_level: int = 2,
                 log2_hashmap_size: int = 19, base_resolution: int = 16, per_level_scale: float | None = None,
                 interpolation: str = "Linear", grid_type: str = "Hash", hash: str = "CoherentPrime",
                 n_networks: int = 1, seed: int = 1337):
        if count("n_input_dims", n_input_dims) not in (2, 3, 4):
            raise ConfigError(f"grid encodings take 2, 3 or 4 input dims, got n_input_dims={n_input_dims}")
        if count("n_features_per_level", n_features_per_level) not in (1, 2, 4, 8):
            raise ConfigError(f"n_features_per_level={n_features_per_level} is not supported; allowed: [1, 2, 4, 8]")
        n_levels = count("n_levels", n_levels, hi=MAX_N_LEVELS)
        log2_hashmap_size = count("log2_hashmap_size", log2_hashmap_size, hi=30)
        base_resolution = count("base_resolution", base_resolution)
        for name, value, allowed in (("interpolation", interpolation, INTERPOLATIONS),
                                     ("type", grid_type, GRID_TYPES), ("hash", hash, HASH_TYPES)):
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is not supported; allowed: {list(allowed)}")
        count("n_networks", n_networks)
        if per_level_scale is None:
            per_level_scale = default_per_level_scale(grid_type, n_levels, base_resolution)
        layout = grid_layout(n_input_dims, n_levels, n_features_per_level, log2_hashmap_size, base_resolution,
                             per_level_scale, grid_type)
        if layout.levels[-1].resolution > _INT32_MAX:
            raise ConfigError(f"the finest level's resolution {layout.levels[-1].resolution} exceeds 2^31-1; "
                              "lower n_levels, base_resolution or per_level_scale")
        if layout.n_params > _INT32_MAX:
            raise ConfigError(f"one grid would hold {layout.n_params} floats (> 2^31-1); lower n_levels, "
                              f"base_resolution, per_level_scale or log2_hashmap_size (type={grid_type!r})")
        super().__init__(n_input_dims, n_levels * n_features_per_level, n_networks)
        self.layout: GridLayout = layout
        self.n_levels, self.n_features_per_level = n_levels, n_features_per_level
        self.log2_hashmap_size, self.base_resolution = log2_hashmap_size, base_resolution
        self.per_level_scale, self.interpolation = float(per_level_scale), interpolation
        self.grid_type, self.hash = grid_type, hash
        self.seed = seed

        self._meta = self._kernel_table()
        self._shared_levels = self._shared_level_count()
        self.params = torch.nn.Parameter(self.initial_params(seed))

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        otype = cfg.otype(list(_OTYPE_DEFAULT_TYPE))
        f = cfg.integer("n_features_per_level", 2, allowed=(1, 2, 4, 8))
        n_features_key = next((k for k in ("n_features", "n_grid_features") if cfg.has(k)), None)
        if n_features_key is not None:
            if cfg.has("n_levels"):
                raise ConfigError(f"{cfg.key('n_levels')} and {cfg.key(n_features_key)} are exclusive "
                                  "(one determines the other); give only one")
            n_features = cfg.integer(n_features_key, lo=f)
            if n_features % f:
                raise ConfigError(f"{cfg.key(n_features_key)}={n_features} must be a multiple of "
                                  f"n_features_per_level={f}")
            n_levels = n_features // f
        else:
            n_levels = cfg.integer("n_levels", 16, lo=1, hi=MAX_N_LEVELS)
        grid_type = cfg.choice("type", GRID_TYPES, _OTYPE_DEFAULT_TYPE[otype])
        base = cfg.integer("base_resolution", 16, lo=1)
        scale = cfg.number("per_level_scale", default_per_level_scale(grid_type, n_levels, base), lo=0.0,
                           lo_open=True)
        if cfg.has("stochastic_interpolation") and cfg.boolean("stochastic_interpolation"):
            raise ConfigError(f"{cfg.key('stochastic_interpolation')}=true is not supported; allowed: false")
        return cls(
            n_input_dims,
            n_levels=n_levels,
            n_features_per_level=f,
            log2_hashmap_size=cfg.integer("log2_hashmap_size", 19, lo=1, hi=30),
            base_resolution=base,
            per_level_scale=scale,
            interpolation=cfg.choice("interpolation", INTERPOLATIONS, "Linear"),
            grid_type=grid_type,
            hash=cfg.choice("hash", HASH_TYPES, "CoherentPrime"),
            n_networks=n_networks,
            seed=seed,
        )

    def _kernel_table(self):
        """The per-level table the kernels read (see tinn/kernels/grid_encoding.py), as a persistent Taichi
        ndarray on the device: cheaper to pass per launch than torch tensors, and it never changes."""
        meta = np.zeros((self.n_levels + 1, 4), dtype=np.int32)
        for i, lv in enumerate(self.layout.levels):
            meta[i, :3] = (lv.offset, lv.resolution, lv.size)
            meta[i, 3] = np.array(lv.scale, dtype=np.float32).view(np.int32)
        primes = np.array(HASH_PRIMES[self.hash][:self.n_input_dims], dtype=np.uint32)
        meta[-1, :self.n_input_dims] = primes.view(np.int32)  # same bits; the kernel reads them as uint32
        return K.make_table(meta)

    def _shared_level_count(self) -> int:
        """Coarse levels whose parameter gradient a CUDA block sums in shared memory first (single grid only)."""
        if runtime.arch() != "cuda":
            return 0
        return K.shared_levels([lv.size for lv in self.layout.levels], self.n_features_per_level)

    def __getstate__(self):  # pickling (torch.save(module)): backend-specific state is rebuilt, not serialised
        state = self.__dict__.copy()
        state.pop("_meta", None)
        state.pop("_shared_levels", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._meta = self._kernel_table()
        self._shared_levels = self._shared_level_count()

    # -- parameters ---------------------------------------------------------------------------
    def initial_params(self, seed: int) -> torch.Tensor:
        """tcnn's init: uniform in [-1e-4, 1e-4], reproducible from `seed` (drawn on the CPU, then moved)."""
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        values = torch.rand(self.n_networks, self.layout.n_params, generator=gen, dtype=torch.float32)
        return (values * 2e-4 - 1e-4).to(runtime.device())

    def n_params_per_network(self) -> int:
        return self.layout.n_params

    # -- memory reporting ----------------------------------------------------------------------
    def memory_bytes_per_network(self) -> int:
        return self.layout.n_params * 4

    def memory_bytes(self) -> int:
        # From the layout, not self.params: inside a Composite the table lives in the composite.
        return self.n_networks * self.memory_bytes_per_network()

    def memory_report(self) -> dict:
        """Parameter memory per level, per grid and in total (float32; gradients and optimizer state add
        the same amount again each)."""
        f = self.n_features_per_level
        levels = [
            {"level": i, "resolution": lv.resolution, "scale": lv.scale, "entries": lv.size,
             "hashed": self.layout.level_is_hashed(i), "bytes_per_network": lv.size * f * 4}
            for i, lv in enumerate(self.layout.levels)
        ]
        return {
            "otype": self.otype, "type": self.grid_type, "n_networks": self.n_networks,
            "params_per_network": self.layout.n_params, "bytes_per_network": self.memory_bytes_per_network(),
            "total_bytes": self.memory_bytes(), "levels": levels,
        }

    # -- forward ---------------------------------------------------------------------------------
    def encode(self, x, net_ids):
        return self.encode_with(x, net_ids, self.params, 0)

    def encode_with(self, x, net_ids, params, param_offset: int):
        """Look up with an external parameter table whose columns [param_offset, param_offset + n_params)
        hold this grid (used by Composite, which owns one table for all nested encodings)."""
        if x.shape[0] == 0:
            return x.new_zeros(0, self.n_output_dims) + params.sum() * 0
        return _GridLookup.apply(x, params, net_ids, self, int(param_offset))

    # -- kernel launches (tensors already validated, contiguous and detached) -----------------------
    def _common(self):
        return (self._meta,)

    def _codes(self):
        return self.n_features_per_level, _INTERP_CODE[self.interpolation], _TYPE_CODE[self.grid_type]

    def _launch_forward(self, x, net_ids, params, off) -> torch.Tensor:
        """(batch, n_output_dims) features; the kernel writes them feature-major (coalesced), then one transpose."""
        return self._launch_forward_feature_major(x, net_ids, params, off).t().contiguous()

    def _launch_forward_feature_major(self, x, net_ids, params, off) -> torch.Tensor:
        """(n_output_dims, batch) features, as the kernel writes them (a fused network reads them so)."""
        f, interp, gtype = self._codes()
        out_t = torch.empty(self.n_output_dims, x.shape[0], dtype=torch.float32, device=x.device)
        K.grid_forward(x, net_ids, params, off, *self._common(), out_t, f, interp, gtype, self.n_input_dims)
        return out_t

    def _launch_backward(self, x, net_ids, params, off, dy, dparams, dx, want_params, want_x,
                         dy_feature_major=False):
        f, interp, gtype = self._codes()
        dy_t = dy if dy_feature_major else dy.t().contiguous()  # feature-major, read coalesced by the kernel
        n_shared = self._shared_levels if params.shape[0] == 1 else 0  # 0 off CUDA
        if want_params and not want_x and _feature_lanes():
            # The usual training case (no input gradient), a thread per (level, sample, feature). On CUDA
            # in one launch with the coarse levels of a single grid, which are summed per block in shared
            # memory first; elsewhere (tests, A/B runs) the lanes kernel alone.
            if runtime.arch() == "cuda":
                K.grid_backward_params(x, net_ids, off, *self._common(), dy_t, dparams, f, interp, gtype,
                                       n_shared, self.n_input_dims)
            else:
                K.grid_backward_lanes(x, net_ids, off, *self._common(), dy_t, dparams, f, interp, gtype,
                                      self.n_input_dims)
            return
        first_level = 0
        if want_params and n_shared:
            # A single grid: coarse levels are summed per block in shared memory first.
            first_level = n_shared
            K.grid_backward_shared(x, off, *self._common(), dy_t, dparams, f, interp, gtype, first_level,
                                   self.n_input_dims)
        if first_level < self.n_levels or want_x:
            K.grid_backward(x, net_ids, params, off, *self._common(), dy_t, dparams, dx, f, interp, gtype,
                            int(bool(want_params)), int(bool(want_x)), first_level, self.n_input_dims)

    def _launch_backward_backward(self, x, net_ids, params, off, dy, g_dx, out_dy, out_params, out_x):
        f, interp, gtype = self._codes()
        ph = _placeholder(x.device)
        K.grid_backward_backward(
            x, net_ids, params, off, *self._common(), dy, g_dx,
            out_dy if out_dy is not None else ph, out_params if out_params is not None else ph,
            out_x if out_x is not None else ph, f, interp, gtype,
            int(out_dy is not None), int(out_params is not None), int(out_x is not None), self.n_input_dims)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", type={self.grid_type}, n_levels={self.n_levels}, "
                f"F={self.n_features_per_level}, log2_hashmap_size={self.log2_hashmap_size}, "
                f"base_resolution={self.base_resolution}, per_level_scale={self.per_level_scale:g}, "
                f"interpolation={self.interpolation}")
