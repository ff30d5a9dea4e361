"""Multiresolution grid encodings: tcnn's `Grid` / `HashGrid` / `DenseGrid` / `TiledGrid`.

With `n_networks > 1` the module holds one independent grid per network (one per
KiloNeRF cell / octree node) in a single `params` tensor shaped
`(n_networks, n_params_per_network)`; every sample looks up the grid of its
`net_ids` entry. It follows the part contract (tinn/part.py) with a second derivative, so
eikonal / normal losses on `d(encoding)/dx` train the grids. The kernels write
features feature-major, the layout a fused network reads.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import chunks, memory, runtime
from ..config import Section, count
from ..errors import ConfigError
from ..kernels import deterministic as deterministic_kernels
from ..kernels import grid_encoding, triton_grid_kernels
from ..part import FEATURE_MAJOR, SAMPLE_MAJOR, Context, SecondOrderError, to_layout
from .base import Encoding
from .grid_layout import (GRID_TYPES, HASH_RNG, HASH_TYPES, INTERPOLATIONS, MAX_N_LEVELS, GridLayout,
                          default_per_level_scale, grid_layout, hash_code)

_OTYPE_DEFAULT_TYPE = {"Grid": "Hash", "HashGrid": "Hash", "DenseGrid": "Dense", "TiledGrid": "Tiled"}
_INTERP_CODE = {"Nearest": grid_encoding.NEAREST, "Linear": grid_encoding.LINEAR,
                "Smoothstep": grid_encoding.SMOOTHSTEP}
_TYPE_CODE = {"Hash": grid_encoding.HASH, "Dense": grid_encoding.DENSE, "Tiled": grid_encoding.TILED}
_INT32_MAX = 2**31 - 1
# table_dtype: float32 (tcnn's precision for the optimizer's copy) or bfloat16, a compact table
# (tinn/kernels/compact.py) with sparse gradients, for grids too large to train at 4 bytes per value.
TABLE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


_PLACEHOLDERS: dict = {}


def _placeholder(device) -> torch.Tensor:
    """A shared (1, 1) tensor for kernel arguments a launch never touches (never returned to autograd)."""
    t = _PLACEHOLDERS.get(device)
    if t is None:
        t = _PLACEHOLDERS[device] = torch.zeros(1, 1, dtype=torch.float32, device=device)
    return t


def _chunk_views(table: torch.Tensor):
    """(lo, hi, rows) per row chunk of `table` (tinn/chunks.py); `rows(t)` cuts a tensor shaped like the
    table to the chunk (the whole tensor when one chunk covers it)."""
    spans = chunks.row_spans(table.shape[0], table.shape[1], "the grid table")
    if len(spans) == 1:
        return ((0, table.shape[0], _whole),)
    return tuple((lo, hi, (lambda t, lo=lo, hi=hi: t[lo:hi])) for lo, hi in spans)


def _whole(t):
    return t


def _kernel_cells(table: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(what the grid kernels index, whether it is compact): a bfloat16 table goes in as its int16 bits."""
    compact = table.dtype == torch.bfloat16
    return (table.view(torch.int16) if compact else table), compact


class GridEncoding(Encoding):
    """Trainable multiresolution grid (tcnn semantics), one grid per network.

    Output: `n_levels * n_features_per_level` features, level-major
    (`out[:, level * F + f]`). Inputs are expected in [0, 1]^D; outside they wrap
    (dense/tiled) or hash, as in tcnn.
    """

    otype = "Grid"
    output_layouts = (FEATURE_MAJOR, SAMPLE_MAJOR)
    # tcnn's "fixed_point_pos": only false is supported.
    OPTIONS = ("n_levels", "n_features", "n_grid_features", "n_features_per_level", "log2_hashmap_size",
               "base_resolution", "per_level_scale", "type", "interpolation", "hash", "stochastic_interpolation",
               "fixed_point_pos", "table_dtype")

    def __init__(self, n_input_dims: int, n_levels: int = 16, n_features_per_level: int = 2,
                 log2_hashmap_size: int = 19, base_resolution: int = 16, per_level_scale: float | None = None,
                 interpolation: str = "Linear", grid_type: str = "Hash", hash: str = "CoherentPrime",
                 n_networks: int = 1, seed: int = 1337, feature_lanes: bool | None = None,
                 table_dtype: str = "float32", stochastic_interpolation: bool = False):
        """Build `n_networks` grids of one shape (tcnn's `Grid`/`HashGrid`/`DenseGrid`/`TiledGrid` keys).

        Args:
            n_input_dims: 2, 3 or 4.
            n_levels: resolution levels (tcnn's default 16).
            n_features_per_level: 1, 2, 4 or 8.
            log2_hashmap_size: log2 of the entries per level of a hashed table (at most 30).
            base_resolution: the coarsest level's resolution.
            per_level_scale: resolution growth per level; None: tcnn's default for the grid type.
            interpolation: "Nearest", "Linear" or "Smoothstep".
            grid_type: "Hash", "Dense" or "Tiled".
            hash: the hash function of hashed levels (tcnn's names; "CoherentPrime" by default).
            n_networks: how many independent grids; sample b looks up grid `net_ids[b]`.
            seed: initialisation seed (tables start uniform in +-1e-4, as tcnn's).
            feature_lanes: one thread per (level, sample, feature) for the table gradient instead of
                per (level, sample). It pays on a GPU, whose memory system serves a warp's neighbouring
                words as one request; a CPU thread only repeats the hashing. None: the settings' choice
                (by default CUDA only).
            table_dtype: "float32", or "bfloat16" for a compact table: 2 bytes per value, and a sparse
                gradient (a coalesced `torch.sparse_coo_tensor` of the entries a batch touched) that
                tinn's Adam steps lazily with bfloat16 moments and stochastically rounded weights, so a
                trained value costs 6 bytes instead of 20 (float32 table, dense gradient, Adam's two
                moments and step count). No second derivatives; not inside a Composite.
            stochastic_interpolation: tcnn's option: the table gradient of each (level, sample) goes
                whole to one corner drawn with its interpolation weight (tcnn's generator, so the same
                corners as tcnn's) instead of N-linearly to all; features and input gradients stay
                N-linear. No fixed-order (`settings.deterministic`) or compact-table path, and no
                gradient of the table gradient.

        Raises:
            ConfigError: a value outside the allowed ones (the message names the field and lists them).
        """
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
        if table_dtype not in TABLE_DTYPES:
            raise ConfigError(f"table_dtype={table_dtype!r} is not supported; allowed: {list(TABLE_DTYPES)}")
        if not isinstance(stochastic_interpolation, bool):
            raise ConfigError(f"stochastic_interpolation={stochastic_interpolation!r} must be true or false")
        if stochastic_interpolation and table_dtype != "float32":
            raise ConfigError("stochastic_interpolation=true needs table_dtype='float32' (a compact table's "
                              "gradient is summed in a fixed order over all corners); allowed: float32")
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
        self._hashing = hash_code(hash, n_input_dims)[0]  # the kernels' template argument `H`
        self.stochastic_interpolation = stochastic_interpolation
        self.seed = seed
        self.table_dtype = TABLE_DTYPES[table_dtype]
        if feature_lanes is None:
            feature_lanes = runtime.tuning().feature_lanes
        self.feature_lanes = runtime.arch() == "cuda" if feature_lanes is None else bool(feature_lanes)
        # The CPU's table gradient: one task per level, no atomics (`grid_backward_levels`), where that
        # leaves no thread idle.
        level_tasks = runtime.tuning().level_tasks
        self.level_tasks = runtime.arch() == "cpu" and (runtime.cpu_threads() <= n_levels if level_tasks is None
                                                        else bool(level_tasks))

        self._meta = self._kernel_table()
        self._shared_levels = self._shared_level_count()
        memory.table_fits(f"{type(self).__name__}(n_networks={n_networks}, {layout.n_params} parameters each)",
                          n_networks, layout.n_params, runtime.device(), compact=self.compact)
        self.params = torch.nn.Parameter(self.initial_params(seed))

    @property
    def compact(self) -> bool:
        """Whether the table is compact (bfloat16, with sparse gradients)."""
        return self.table_dtype == torch.bfloat16

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
        if cfg.has("fixed_point_pos") and cfg.boolean("fixed_point_pos"):
            # In tcnn the flag only changes its JIT-fused device code, which reads each input as the bits of
            # a 32-bit fixed-point coordinate; its ordinary kernels (and tinn's) read float positions.
            raise ConfigError(f"{cfg.key('fixed_point_pos')}=true is not supported: tcnn honours it only in "
                              "JIT fusion, where inputs are 32-bit fixed-point bit patterns; tinn has no JIT "
                              "fusion and reads float positions; allowed: false")
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
            table_dtype=cfg.choice("table_dtype", tuple(TABLE_DTYPES), "float32"),
            stochastic_interpolation=cfg.boolean("stochastic_interpolation", False),
        )

    def _kernel_table(self):
        """The per-level table the kernels read (see tinn/kernels/grid_encoding.py), as a persistent Taichi
        ndarray on the device: cheaper to pass per launch than torch tensors, and it never changes."""
        return grid_encoding.make_table(self._meta_values())

    def _meta_values(self) -> np.ndarray:
        """The kernels' per-level table: (entry offset, resolution, entries, float32 bits of the scale) per level,
        and the hash's per-dimension factors in the last row."""
        meta = np.zeros((self.n_levels + 1, 4), dtype=np.int32)
        for i, lv in enumerate(self.layout.levels):
            meta[i, :3] = (lv.offset, lv.resolution, lv.size)
            meta[i, 3] = np.array(lv.scale, dtype=np.float32).view(np.int32)
        factors = hash_code(self.hash, self.n_input_dims)[1]
        meta[-1, :self.n_input_dims] = np.array(factors, dtype=np.uint32).view(np.int32)  # read back as uint32
        return meta

    def _shared_level_count(self) -> int:
        """Coarse levels whose parameter gradient a CUDA block sums in shared memory first (single grid only)."""
        if runtime.arch() != "cuda":
            return 0
        return grid_encoding.shared_levels([lv.size for lv in self.layout.levels], self.n_features_per_level)

    def _triton_levels(self, table: torch.Tensor):
        """The per-level table on the device (`grid_triton.LevelTable`) when a lookup or table gradient into
        `table` can run as a Triton launch (`tuning.triton_grid_kernels`; a float32 table, or for the lookup a
        compact one, and a hash other than Rng), else None: Taichi's kernels."""
        if (table.dtype not in (torch.float32, torch.bfloat16) or self._hashing == HASH_RNG
                or not triton_grid_kernels(table.device)):
            return None
        levels = self.__dict__.get("_levels_on_device")
        if levels is None or levels.device != table.device:
            from ..kernels import grid_triton
            levels = self._levels_on_device = grid_triton.LevelTable(self._meta_values(), table.device)
        return levels

    def _triton_table_gradient(self, dtable: torch.Tensor):
        """`_triton_levels` for the table gradient: a float32 table."""
        if dtable.dtype != torch.float32:
            return None
        return self._triton_levels(dtable)

    def __getstate__(self):  # pickling (torch.save(module)): backend-specific state is rebuilt, not serialised
        state = self.__dict__.copy()
        state.pop("_meta", None)
        state.pop("_levels_on_device", None)
        state.pop("_shared_levels", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("stochastic_interpolation", False)
        self.__dict__.setdefault("_hashing", hash_code(self.hash, self.n_input_dims)[0])
        self._meta = self._kernel_table()
        self._shared_levels = self._shared_level_count()

    # -- parameters ---------------------------------------------------------------------------
    def initial_params(self, seed: int) -> torch.Tensor:
        """tcnn's init: uniform in [-1e-4, 1e-4], reproducible from `seed` (drawn on the CPU, then moved;
        a compact table holds the same draws rounded to bfloat16)."""
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        n, p = self.n_networks, self.layout.n_params
        out = torch.empty(n, p, dtype=self.table_dtype, device=runtime.device())
        # Drawn in blocks of rows (the generator's stream is the same as in one draw): a table of
        # billions of floats needs no host copy of its own size.
        step = max(1, (1 << 24) // max(p, 1))
        for lo in range(0, n, step):
            values = torch.rand(min(step, n - lo), p, generator=gen, dtype=torch.float32)
            out[lo:lo + values.shape[0]].copy_(values.mul_(2e-4).sub_(1e-4))
        return out

    def n_params_per_network(self) -> int:
        return self.layout.n_params

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        if self.params is not None:  # (inside a Composite the composite owns the table)
            self.params.copy_(self.initial_params(self.seed if seed is None else seed))

    # -- memory reporting ----------------------------------------------------------------------
    def memory_bytes_per_network(self) -> int:
        return self.layout.n_params * self.table_dtype.itemsize

    def memory_bytes(self) -> int:
        # From the layout, not self.params: inside a Composite the table lives in the composite.
        return self.n_networks * self.memory_bytes_per_network()

    def memory_report(self) -> dict:
        """Parameter memory per level, per grid and in total (float32: gradients and Adam's moments add the
        same amount again each; bfloat16: the moments add as much again each, gradients are sparse)."""
        f = self.n_features_per_level
        size = self.table_dtype.itemsize
        levels = [
            {"level": i, "resolution": lv.resolution, "scale": lv.scale, "entries": lv.size,
             "hashed": self.layout.level_is_hashed(i), "bytes_per_network": lv.size * f * size}
            for i, lv in enumerate(self.layout.levels)
        ]
        return {
            "otype": self.otype, "type": self.grid_type, "n_networks": self.n_networks,
            "table_dtype": str(self.table_dtype).removeprefix("torch."),
            "params_per_network": self.layout.n_params, "bytes_per_network": self.memory_bytes_per_network(),
            "total_bytes": self.memory_bytes(), "levels": levels,
        }

    # -- the part contract ------------------------------------------------------------------------
    def forward_with_context(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR):
        y = self.lookup(x, ids, self.params.detach(), 0, y_layout)
        return y, (Context(x=x, ids=ids, y_layout=y_layout) if train else None)

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        if self.compact:
            return self._sparse_backward(ctx, dy, need_dx, need_grads)
        dtable = torch.zeros_like(self.params) if need_grads else None
        dx = self.lookup_backward(ctx.x, ctx.ids, self.params.detach(), 0, dy, dtable, need_dx, ctx.y_layout)
        return dx, (dtable,)

    def _refuse_second_order(self):
        if self.compact:
            raise SecondOrderError(f"{type(self).__name__} with table_dtype='bfloat16' has no second derivative "
                                   "(its table gradient is sparse); use table_dtype='float32' for eikonal or "
                                   "normal losses")

    def backward_backward(self, ctx, dy, ddx, *, need_ddy, need_dx, need_dtables):
        self._refuse_second_order()
        dy_sm = to_layout(dy, ctx.y_layout, SAMPLE_MAJOR)
        table = self.params.detach()
        out_dy = torch.zeros_like(dy_sm) if need_ddy else None
        out_table = torch.zeros_like(table) if need_dtables else None
        out_x = torch.zeros_like(ctx.x) if need_dx else None
        self._launch_backward_backward(ctx.x, ctx.ids, table, 0, dy_sm, ddx, out_dy, out_table, out_x)
        d_dy = None if out_dy is None else to_layout(out_dy, SAMPLE_MAJOR, ctx.y_layout)
        return d_dy, out_x, (out_table,)

    def backward_backward_tables(self, ctx, dy, g_tables, *, need_ddy, need_dx):
        """The table gradient scatters w(x) * dy, so its derivative is a lookup into the incoming
        gradient: with respect to dy the plain lookup, with respect to x the lookup's input gradient."""
        self._refuse_second_order()
        if self.stochastic_interpolation:
            raise SecondOrderError(f"{type(self).__name__} with stochastic_interpolation=true has no derivative of "
                                   "its table gradient (a random corner per sample); differentiate the input "
                                   "gradient instead, or set stochastic_interpolation=false")
        (g_table,) = g_tables
        g_table = g_table.contiguous()
        d_dy = self.lookup(ctx.x, ctx.ids, g_table, 0, ctx.y_layout) if need_ddy else None
        d_x = None
        if need_dx:
            d_x = self.lookup_backward(ctx.x, ctx.ids, g_table, 0, dy, None, True, ctx.y_layout)
        return d_dy, d_x, (None,)

    # -- lookups into a table that may hold more than this grid (Composite owns one for all) --------
    def lookup(self, x, ids, table, offset: int, layout: str = SAMPLE_MAJOR) -> torch.Tensor:
        """Features of `x` from the grid stored in `table` columns [offset, offset + n_params)."""
        f, interp, gtype = self._codes()
        chunks.check_batch(type(self).__name__, x.shape[0], max(self.n_output_dims, self.n_input_dims),
                           f"features ({self.n_output_dims}, batch)")
        out_t = torch.empty(self.n_output_dims, x.shape[0], dtype=torch.float32, device=x.device)
        levels = self._triton_levels(table) if x.shape[0] else None
        if levels is not None:
            from ..kernels import grid_triton
            for lo, hi, rows in _chunk_views(table):
                grid_triton.grid_forward(x, ids, rows(table), offset, levels, out_t, f, interp, gtype,
                                         self.n_input_dims, lo, self._hashing)
        elif x.shape[0]:
            cells, compact = _kernel_cells(table)
            for lo, hi, rows in _chunk_views(table):
                grid_encoding.grid_forward(x, ids, rows(cells), offset, self._meta, out_t, f, interp, gtype,
                                           self.n_input_dims, lo, compact, self._hashing)
        return to_layout(out_t, FEATURE_MAJOR, layout)

    def lookup_backward(self, x, ids, table, offset: int, dy, dtable, need_dx: bool,
                        dy_layout: str = SAMPLE_MAJOR) -> torch.Tensor | None:
        """Adds the table gradient into `dtable` (when given) and returns dx (when `need_dx`)."""
        dx = torch.zeros_like(x) if need_dx else None
        if x.shape[0] and (dtable is not None or need_dx):
            ph = _placeholder(x.device)
            self._launch_backward(x, ids, table, offset, dy, ph if dtable is None else dtable,
                                  ph if dx is None else dx, dtable is not None, need_dx,
                                  dy_feature_major=dy_layout == FEATURE_MAJOR)
        return dx

    # -- kernel launches (tensors already validated, contiguous and detached) -----------------------
    def _codes(self):
        return self.n_features_per_level, _INTERP_CODE[self.interpolation], _TYPE_CODE[self.grid_type]

    def _launch_backward(self, x, net_ids, params, off, dy, dparams, dx, want_params, want_x,
                         dy_feature_major=False):
        f, interp, gtype = self._codes()
        dy_t = dy if dy_feature_major else dy.t().contiguous()  # feature-major, read coalesced by the kernel
        if want_params and self.stochastic_interpolation and interp != grid_encoding.NEAREST:
            self._launch_stochastic(x, net_ids, params, off, dy_t, dparams)
            if not want_x:
                return
            want_params, dparams = False, _placeholder(x.device)  # dx alone: N-linear, as in tcnn
        if runtime.settings().deterministic:
            self._launch_backward_in_order(x, net_ids, params, off, dy_t, dparams, dx, want_params, want_x)
            return
        n_shared = self._shared_levels if params.shape[0] == 1 else 0  # 0 off CUDA
        for lo, hi, rows in _chunk_views(params):
            self._launch_backward_chunk(x, net_ids, rows(params), off, dy_t, rows(dparams) if want_params else dparams,
                                        dx, want_params, want_x, f, interp, gtype, n_shared, lo)

    def _launch_stochastic(self, x, net_ids, params, off, dy_t, dparams):
        """The table gradient with tcnn's stochastic interpolation (one corner per level and sample)."""
        if runtime.settings().deterministic:
            raise ConfigError("stochastic_interpolation=true has no fixed-order table gradient (float atomics); "
                              "allowed with settings.deterministic=False")
        f, interp, gtype = self._codes()
        for lo, hi, rows in _chunk_views(params):
            grid_encoding.grid_backward_stochastic(x, net_ids, off, self._meta, dy_t, rows(dparams), f, interp, gtype,
                                                   self.n_input_dims, lo, self._hashing)

    def _launch_backward_chunk(self, x, net_ids, params, off, dy_t, dparams, dx, want_params, want_x, f, interp,
                               gtype, n_shared, lo):
        """The backward launches for the grids in the chunk view `params` (rows from `lo`; a single grid
        is one chunk, so the shared-memory levels, which read row 0, see the whole table)."""
        levels = self._triton_table_gradient(dparams) if want_params and not want_x else None
        if levels is not None:
            from ..kernels import grid_triton
            # A sample's features leave in vector reductions where they fit one, and a single grid or a few sum their
            # coarse levels in private copies first (design notes, "A grid's table gradient in vector reductions").
            vector = grid_triton.vector_reductions(f, dparams, off)
            copies = grid_triton.private_copies(dparams.shape[0]) if vector else 0
            grid_triton.grid_backward_table(x, net_ids, off, levels, dy_t, dparams, f, interp, gtype,
                                            self.n_input_dims, lo, self._hashing, vector=vector, copies=copies)
            return
        if want_params and not want_x and self.level_tasks:
            grid_encoding.grid_backward_levels(x, net_ids, off, self._meta, dy_t, dparams, f, interp, gtype,
                                               self.n_input_dims, lo, self._hashing)
            return
        if want_params and not want_x and self.feature_lanes:
            # The usual training case (no input gradient), a thread per (level, sample, feature). On CUDA
            # in one launch with the coarse levels of a single grid, which are summed per block in shared
            # memory first; elsewhere (tests, A/B runs) the lanes kernel alone.
            if runtime.arch() == "cuda":
                grid_encoding.grid_backward_params(x, net_ids, off, self._meta, dy_t, dparams, f, interp, gtype,
                                                   n_shared, self.n_input_dims, lo, self._hashing)
            else:
                grid_encoding.grid_backward_lanes(x, net_ids, off, self._meta, dy_t, dparams, f, interp, gtype,
                                                  self.n_input_dims, lo, self._hashing)
            return
        first_level = 0
        if want_params and n_shared:
            # A single grid: coarse levels are summed per block in shared memory first.
            first_level = n_shared
            grid_encoding.grid_backward_shared(x, off, self._meta, dy_t, dparams, f, interp, gtype, first_level,
                                               self.n_input_dims, self._hashing)
        if first_level < self.n_levels or want_x:
            grid_encoding.grid_backward(x, net_ids, params, off, self._meta, dy_t, dparams, dx, f, interp, gtype,
                                        int(bool(want_params)), int(bool(want_x)), first_level, self.n_input_dims, lo,
                                        self._hashing)

    def _term_blocks(self, x, net_ids, params, off, dy_t, want_params, want_x):
        """The backward's terms (tinn/kernels/deterministic.py), in blocks of samples:
        yields (b0, b1, keys, terms, dx_terms) per block [b0, b1), keys of the whole table."""
        f, interp, gtype = self._codes()
        levels, d, dev = self.n_levels, self.n_input_dims, x.device
        slots = (1 << d) * f
        block = max(1, deterministic_kernels.GRID_TERMS_PER_BLOCK // (levels * slots))
        ph = torch.empty(1, 1, 1, device=dev)
        ph_keys = torch.empty(1, 1, 1, dtype=torch.int64, device=dev)
        cells, compact = _kernel_cells(params)
        for b0 in range(0, x.shape[0], block):
            b1 = min(x.shape[0], b0 + block)
            keys = torch.full((levels, b1 - b0, slots), -1, dtype=torch.int64, device=dev) if want_params else ph_keys
            terms = torch.empty(levels, b1 - b0, slots, device=dev) if want_params else ph
            dx_terms = torch.zeros(levels, b1 - b0, d, device=dev) if want_x else ph
            xs, ids, dys = x[b0:b1], net_ids[b0:b1], dy_t[:, b0:b1].contiguous()
            for lo, hi, rows in _chunk_views(params):
                deterministic_kernels.grid_backward_terms(xs, ids, rows(cells), off, self._meta, dys, keys, terms,
                                                          dx_terms, f, interp, gtype, int(bool(want_params)),
                                                          int(bool(want_x)), d, lo, compact, self._hashing)
            yield b0, b1, keys, terms, dx_terms

    def _launch_backward_in_order(self, x, net_ids, params, off, dy_t, dparams, dx, want_params, want_x):
        """`Settings.deterministic`: the backward's terms written out, then summed in a fixed order
        (tinn/kernels/deterministic.py), in blocks of samples added one after the other."""
        for b0, b1, keys, terms, dx_terms in self._term_blocks(x, net_ids, params, off, dy_t, want_params, want_x):
            if want_params:
                deterministic_kernels.add_sorted_terms(dparams.view(-1), keys.view(-1), terms.view(-1))
            if want_x:
                dx[b0:b1] += dx_terms.sum(0)

    def _sparse_backward(self, ctx, dy, need_dx, need_grads):
        """A compact table's backward: dx as usual, and the table gradient as a coalesced sparse COO tensor
        (bfloat16 values, each the fixed-order sum of its entry's terms), so no dense gradient is stored."""
        x, ids, table = ctx.x, ctx.ids, self.params.detach()
        dx = torch.zeros_like(x) if need_dx else None
        if not (need_grads or need_dx) or not x.shape[0]:
            none = torch.zeros(0, dtype=torch.int64, device=table.device)
            return dx, (self._sparse_gradient(none, none.float()) if need_grads else None,)
        dy_t = to_layout(dy, ctx.y_layout, FEATURE_MAJOR).contiguous()
        positions, sums = [], []
        for b0, b1, keys, terms, dx_terms in self._term_blocks(x, ids, table, 0, dy_t, need_grads, need_dx):
            if need_grads:
                unique, total = deterministic_kernels.sum_terms_by_key(keys.view(-1), terms.view(-1))
                positions.append(unique)
                sums.append(total)
            if need_dx:
                dx[b0:b1] += dx_terms.sum(0)
        if not need_grads:
            return dx, (None,)
        if len(positions) > 1:  # blocks may share entries: their sums are added in block order
            positions, sums = deterministic_kernels.sum_terms_by_key(torch.cat(positions), torch.cat(sums))
        else:
            positions, sums = positions[0], sums[0]
        return dx, (self._sparse_gradient(positions, sums),)

    def _sparse_gradient(self, positions: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
        """The table gradient as a COO tensor from flat table positions (increasing, distinct) and their sums."""
        cols = self.layout.n_params
        indices = torch.stack((torch.div(positions, cols, rounding_mode="floor"), positions % cols))
        with torch.sparse.check_sparse_tensor_invariants(False):  # built sorted and unique by the caller
            return torch.sparse_coo_tensor(indices, sums.to(self.table_dtype), tuple(self.params.shape),
                                           is_coalesced=True, check_invariants=False)

    def _launch_backward_backward(self, x, net_ids, params, off, dy, g_dx, out_dy, out_params, out_x):
        f, interp, gtype = self._codes()
        ph = _placeholder(x.device)
        for lo, hi, rows in _chunk_views(params):
            grid_encoding.grid_backward_backward(
                x, net_ids, rows(params), off, self._meta, dy, g_dx,
                out_dy if out_dy is not None else ph, rows(out_params) if out_params is not None else ph,
                out_x if out_x is not None else ph, f, interp, gtype,
                int(out_dy is not None), int(out_params is not None), int(out_x is not None), self.n_input_dims,
                lo, self._hashing)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", type={self.grid_type}, n_levels={self.n_levels}, "
                f"F={self.n_features_per_level}, log2_hashmap_size={self.log2_hashmap_size}, "
                f"base_resolution={self.base_resolution}, per_level_scale={self.per_level_scale:g}, "
                f"interpolation={self.interpolation}")
