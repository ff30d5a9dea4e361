"""`NetworkArray`: N independent MLPs of one shape, each sample routed by network id.

Follows tcnn's network config (`otype` FullyFusedMLP / CutlassMLP, `n_neurons`,
`n_hidden_layers`, `activation`, `output_activation`); like tcnn the layers have
no biases. All N weight sets live in one (N, n_params) float32 nn.Parameter that
the Taichi kernels read and write in place.
"""
from __future__ import annotations

import torch

from .. import chunks, dense_graphs, dense_mlp, gradient_pieces, gradient_scaling, losses, memory, runtime, second_order
from ..activations import ACTIVATIONS, NEEDS_PRE_ACTIVATION, activation_name
from ..config import count
from ..errors import ConfigError, InputError
from ..initialisation import initial_weights
from ..kernels import mlp_array
from ..kernels import mlp_fused
from ..part import FEATURE_MAJOR, SAMPLE_MAJOR, Context, Part
from ..routing import Routing, TileRouting, route, route_fused
from .config import MAX_CUTLASS_WIDTH, MAX_NETWORKS, parse_network_config
from . import selection, tensor_cores
from .batched_gemm import BatchedGemmPath
from .gemm import GemmOperand, mm_long_k


class NetworkArray(Part):
    """N MLPs sharing one shape. `forward(x, net_ids)` runs sample b through network net_ids[b].

    `kernels` forces a path ("tensor_cores", "fused", "unfused", or "auto" for the selection rule; default: the
    settings' `kernels`) and `precision` the precision of its products ("auto", "float32", "tf32",
    "float16", "bfloat16"; default: `settings.precision`); `selection.choose_path` decides, and refuses a
    combination that cannot run here. `path` and `precision` say what runs. The fused, dense and tensor-core
    paths also read their input feature-major, as a grid writes it.

    Args:
        n_input_dims: input width of every network.
        n_output_dims: output width of every network.
        network_config: a tcnn-style `network` config (`otype`, `n_neurons`, `n_hidden_layers`,
            `activation`, `output_activation`); None for tcnn's defaults.
        n_networks: how many networks; sample b runs through network `net_ids[b]`.
        seed: initialisation seed (tcnn's uniform +-sqrt(6 / (fan_in + fan_out))).
        tile_size: samples per tile of the unfused kernels; None for the arch's default.
        kernels: force a path (see above); None for the settings' choice.
        input_padding: (n, value): n constant input columns after the real ones, as tcnn pads.
        output_padding: tcnn's padded output rows, kept in the parameter layout but never computed.
        precision: the precision of the products (see above); None for the settings' choice.
        served_ids: the ids these networks decode between them (None: n_networks); a model's shared decoder
            (one network for every id) passes its model's count, and computes as an array of them would.

    Raises:
        ConfigError: a bad config value, or a path or precision that cannot run here (the message names
            the field and the allowed values).
    """

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config: dict | Section | None = None,
                 n_networks: int = 1, seed: int = 1337, tile_size: int | None = None, kernels: str | None = None,
                 input_padding: tuple[int, float] | None = None, output_padding: int = 0,
                 precision: str | None = None, served_ids: int | None = None):
        runtime.ensure_init()
        cfg = parse_network_config(network_config or {})
        n_input_dims, n_output_dims = count("n_input_dims", n_input_dims), count("n_output_dims", n_output_dims)
        n_networks = count("n_networks", n_networks, hi=MAX_NETWORKS)
        # served_ids: the ids the array's networks decode between them (default n_networks); more for a decoder
        # shared by a model's ids (NetworkWithInputEncoding(share_network=True)), which then computes as an
        # array of that many networks would (selection.Candidate).
        self.served_ids = n_networks if served_ids is None else count("served_ids", served_ids, lo=n_networks,
                                                                        hi=MAX_NETWORKS)
        kernels = runtime.settings().kernels if kernels is None else kernels
        super().__init__(n_input_dims, n_output_dims, n_networks)
        # tcnn's padding: `n` constant input columns of `value` after the real ones (ones act as a bias).
        n_pad, pad_value = input_padding or (0, 0.0)
        self.input_padding = (count("input_padding", n_pad, lo=0), float(pad_value))
        self.kernel_inputs = n_input_dims + self.input_padding[0]  # the inputs the weight matrices see
        # tcnn's padded output rows: part of the parameter layout (the last matrix's trailing rows, initialised
        # as tcnn does), never computed. Their outputs would be dropped and their gradients are exactly zero,
        # so the kernels run n_output_dims rows and the gradient keeps zeros there.
        self.kernel_outputs = n_output_dims + count("output_padding", output_padding, lo=0)
        self.config = cfg
        self.width = cfg["n_neurons"]
        self.n_layers = cfg["n_hidden_layers"] + 1  # weight matrices
        self.hidden_act, self.output_act = cfg["activation"], cfg["output_activation"]
        self.keep_pre = bool(NEEDS_PRE_ACTIVATION & {self.hidden_act, self.output_act})
        # Small tiles on the GPU keep many blocks busy; on the CPU fewer, longer tiles mean fewer atomics.
        self.tile_size = tile_size or (256 if runtime.arch() == "cuda" else 4096)
        settings, tuning = runtime.settings(), runtime.tuning()
        # The fused kernels (one launch for all layers, shared memory) need CUDA; Sine and SiLU keep
        # the unfused path because their derivatives need pre-activations.
        fusable = (runtime.arch() == "cuda" and not self.keep_pre
                   and mlp_fused.supported(self.kernel_inputs, self.width, n_output_dims))
        choice = selection.choose_path(
            selection.Candidate(arch=runtime.arch(), n_networks=n_networks, width=self.width, fusable=fusable,
                                tensor_cores=tensor_cores.unavailable_reason(runtime.arch(), self.shape),
                                deterministic=settings.deterministic, dense_setting=tuning.dense_single_network,
                                vendor_faster=dense_mlp.faster_than_kernels(runtime.arch(), fusable, self.width),
                                step_graphs=bool(tuning.step_graphs), served_ids=self.served_ids),
            kernels, settings.precision if precision is None else precision,
            precision_from_settings=precision is None)
        self.path, self.precision = choice
        self.dense = self.path == "dense"
        self.fused = self.path == "fused"
        self.tensor_cores = (tensor_cores.TensorCorePath(self.shape, n_networks, self.precision, self.input_padding)
                             if self.path == "tensor_cores" else None)
        self.batched = (BatchedGemmPath(self.shape, n_networks)
                        if self.path == "batched_gemm" else None)
        self.compute_dtype = dense_mlp.COMPUTE_DTYPES[self.precision] if self.dense else torch.float32
        # float16 scales its gradients dynamically unless settings.gradient_scaling says "static": the scale is
        # then the scaler's device tensor, which every path (and replayed steps) reads on the device
        # (gradient_scaling.py).
        self.gradient_scaler = gradient_scaling.for_precision(self.precision, settings.gradient_scaling,
                                                              runtime.device())
        self.gradient_scale = dense_mlp.GRADIENT_SCALES.get(self.precision, 1.0) if self.gradient_scaler is None \
            else self.gradient_scaler.scale
        # The dense training step replayed from fixed buffers (CUDA graphs): where its weight gradients are GEMMs
        # too, so that the whole step is torch's.
        graphs = tuning.dense_step_graphs
        replay = graphs or (graphs is None and runtime.arch() == "cuda")
        self._step_graphs = (dense_graphs.StepGraphs(self, any_size=bool(graphs))
                             if self.dense and replay and self._vendor_weight_gradients() else None)
        if self.width > MAX_CUTLASS_WIDTH and self.path in ("fused", "unfused"):
            raise ConfigError(f"network.n_neurons={self.width} exceeds the limit of tinn's kernels, "
                              f"{MAX_CUTLASS_WIDTH}: they hold a layer's inputs in registers, unrolled at compile time "
                              "(tcnn's CUTLASS GEMMs have no such limit). A single network runs any width as dense "
                              "GEMMs (n_networks=1, kernels='auto', tuning.dense_single_network not False, not "
                              f"deterministic); allowed here: 1..{MAX_CUTLASS_WIDTH}")
        self.input_layouts = ((SAMPLE_MAJOR,) if self.path in ("unfused", "batched_gemm")
                              else (FEATURE_MAJOR, SAMPLE_MAJOR))
        # Tile sizes of the fused kernels, fixed by the shape: computed once, not per call.
        self.fused_geometry = (mlp_fused.geometry(self.kernel_inputs, self.width, n_output_dims, self.n_layers,
                                           tuning, n_networks) if self.fused else None)
        # A single network's tiles depend only on the batch size: kept for the last few sizes.
        self._single_network_tiles: dict[tuple[int, bool], tuple[TileRouting, ...]] = {}
        self.seed = seed
        memory.table_fits(f"NetworkArray(n_networks={n_networks}, {self.n_params_per_network()} parameters each)",
                          n_networks, self.n_params_per_network(), runtime.device())
        self.params = torch.nn.Parameter(torch.empty(n_networks, self.n_params_per_network(), device=runtime.device()))
        self.params.tinn_layer_shapes = self.layer_shapes()  # lets matrix-aware optimizers (Shampoo) see layers
        self.reset_parameters(seed)

    # ---- shapes -------------------------------------------------------------------------------
    def layer_shapes(self) -> list[tuple[int, int]]:
        """(fan_out, fan_in) of each weight matrix."""
        return mlp_array.layer_shapes(self.kernel_inputs, self.width, self.kernel_outputs, self.n_layers)

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
        """tcnn's init per activation (see tinn/initialisation.py), reproducible from the seed."""
        gen = torch.Generator().manual_seed(self.seed if seed is None else seed)
        self.params.copy_(initial_weights(self.layer_shapes(), self.hidden_act, self.output_act, gen, self.n_networks))

    # ---- the part contract ------------------------------------------------------------------------
    def _padded(self, t: torch.Tensor, fm: bool, value: float) -> torch.Tensor:
        """`t` with the padding columns (rows, feature-major) appended, filled with `value`."""
        n_pad = self.input_padding[0]
        if not n_pad:
            return t
        shape = (n_pad, t.shape[1]) if fm else (t.shape[0], n_pad)
        return torch.cat([t, t.new_full(shape, value)], dim=0 if fm else 1)

    def _unpadded(self, t: torch.Tensor | None, fm: bool) -> torch.Tensor | None:
        if t is None or not self.input_padding[0]:
            return t
        return (t[:self.n_input_dims] if fm else t[:, :self.n_input_dims]).contiguous()

    def forward_with_context(self, x, ids, *, train, x_layout=SAMPLE_MAJOR, y_layout=SAMPLE_MAJOR):
        x_feature_major = x_layout == FEATURE_MAJOR
        params = self.params.detach()
        self._check_batch(x.shape[1] if x_feature_major else x.shape[0], train)
        if self.tensor_cores is not None:  # (its kernels append tcnn's constant input columns themselves)
            if not train:
                return self.tensor_cores.inference(x, ids, params, x_feature_major), None
            out, saved = self.tensor_cores.forward_train(x, ids, params, x_feature_major)
            return out, Context(x=x, ids=ids, params=params, saved=saved, x_feature_major=x_feature_major,
                                held_buffers=None)
        x = self._padded(x, x_feature_major, self.input_padding[1])
        if x_feature_major and FEATURE_MAJOR not in self.input_layouts:
            raise ValueError("feature-major inputs need the tensor-core, fused or dense path")
        # (Not inside a whole step's capture, tinn/step_graphs.py, which takes the eager ops into its own graph.)
        if train and self._step_graphs is not None and not runtime.capturing():
            replayed = self._step_graphs.forward(x, params, x_feature_major)
            if replayed is not None:
                out, held_buffers = replayed
                return out, Context(x=x, ids=ids, params=params, held_buffers=held_buffers,
                                    x_feature_major=x_feature_major)
        if self.batched is not None:  # None back: an empty batch, which Taichi's kernels run
            if not train:
                out = self.batched.inference(x, ids, params)
                if out is not None:
                    return out, None
            else:
                result = self.batched.forward_train(x, ids, params)
                if result is not None:
                    return result[0], Context(x=x, ids=ids, params=params, batched=result[1],
                                              x_feature_major=x_feature_major, held_buffers=None)
        if not train:
            x_c, params_c = dense_mlp.compute_operands(x, params, self.compute_dtype)
            return self._inference(x_c, ids, params_c, x_feature_major), None
        return self._eager_forward_with_context(x, ids, params, x_feature_major)

    def _eager_forward_with_context(self, x, ids, params, x_feature_major):
        """The training forward on buffers of its own: (output, context)."""
        # The GEMMs' operands in the network's precision (x and params themselves in float32).
        x_c, params_c = dense_mlp.compute_operands(x, params, self.compute_dtype)
        out, acts, pre, routing = self._forward_train(x_c, ids, params_c, x_feature_major)
        # The context keeps a detached alias of the output (autograd marks the returned tensor itself), and
        # only when the output activation's derivative reads it: otherwise the output's memory is free once
        # the caller drops it, before the backward allocates its deltas. The second-order pass reads the float32
        # x and params; the backward, the operands.
        kept = out.detach() if self.output_act != ACTIVATIONS["None"] else None
        return out, Context(x=x, ids=ids, params=params, x_c=x_c, params_c=params_c, acts=acts, pre=pre, out=kept,
                            routing=routing, x_feature_major=x_feature_major, held_buffers=None)

    def backward_backward(self, ctx, dy, ddx, *, need_ddy, need_dx, need_dtables):
        """Through torch autograd over the network's function (tinn/second_order.py)."""
        x = ctx.x.t() if ctx.x_feature_major else ctx.x
        if x.shape[1] != self.kernel_inputs:  # the tensor-core path keeps the input without tcnn's columns
            x = self._padded(x, False, self.input_padding[1])
        ddx = ddx.t() if ctx.x_feature_major else ddx
        ddx = self._padded(ddx, False, 0.0)
        d_dy, d_x, d_p = second_order.mlp_backward_backward(x, ctx.ids, ctx.params, self.shape, dy, ddx,
                                                            need_ddy=need_ddy, need_dx=need_dx,
                                                            need_dparams=need_dtables)
        d_x = self._unpadded(d_x, False)
        if ctx.x_feature_major and d_x is not None:
            d_x = d_x.t().contiguous()
        return d_dy, d_x, (d_p,)

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        # float16's deltas (the tensor cores, or a single network's dense GEMMs): a small dy lifted to a unit size
        # before the scale (tinn/gradient_scaling.py), unless the gradient is handed over in pieces as the backward
        # finishes them (a consumer may read them now).
        unlift = None
        if self.precision == "float16" and gradient_pieces.current() is None:
            dy, unlift = gradient_scaling.lift_small(dy)
        if self.tensor_cores is not None:
            dx, dparams = self.tensor_cores.backward(ctx.saved, dy, need_dx, need_grads, self.gradient_scale)
            self._record_overflow(dx, dparams, need_grads, unlift)
            return dx, (dparams,)
        dx, dparams = self._backward_off_tensor_cores(ctx, dy, need_dx, need_grads)
        if unlift is not None:  # (after these paths' own unscaling and overflow check: a power of two keeps inf)
            for g in (dx, dparams):
                if g is not None:
                    g.mul_(unlift)
        return dx, (dparams,)

    def _backward_off_tensor_cores(self, ctx, dy, need_dx, need_grads):
        """(dx, dparams) of the batched-GEMM, replayed, dense and Taichi paths."""
        if getattr(ctx, "batched", None) is not None:
            dx, dparams = BatchedGemmPath.backward(ctx.batched, dy, need_dx, need_grads)
            return self._unpadded(dx, ctx.x_feature_major), dparams
        if ctx.held_buffers is not None:
            replayed = self._step_graphs.backward(ctx.held_buffers, dy, need_dx, need_grads)
            if replayed is not None:
                dx, dparams = replayed
                return self._unpadded(dx, ctx.x_feature_major), dparams
            # A second backward through this forward, whose buffers a later forward has taken: recompute it.
            ctx = self._eager_forward_with_context(ctx.x, ctx.ids, ctx.params, ctx.x_feature_major)[1]
        # Without an output activation the kernels' read of the output is unused: dy stands in (same shape).
        dx, dparams = self._backward(dy, ctx.x_c, ctx.ids, ctx.params_c, ctx.acts, ctx.pre,
                                     dy if ctx.out is None else ctx.out, ctx.routing, need_dx, need_grads,
                                     ctx.x_feature_major)
        return self._unpadded(dx, ctx.x_feature_major), dparams

    def hands_over_gradients(self) -> bool:
        """Whether a backward can hand the parameter gradient over range of networks by range as it finishes them
        (tinn/gradient_pieces.py): on the tensor cores, with several networks."""
        return self.tensor_cores is not None and self.n_networks > 1

    def fuses_loss(self, need_dx: bool = False) -> bool:
        setting = runtime.tuning().fused_loss
        if self.tensor_cores is not None:
            # the output layer's backward recomputes the prediction and takes the loss's gradient: one pass over
            # outputs and targets less, with or without the input gradient
            return True if setting is None else setting
        return self.fused and (self.n_networks > 1 and not need_dx if setting is None else setting)

    def backward_from_loss(self, ctx, y, loss, target, *, need_dx, need_grads=True):
        """Where `fuses_loss(need_dx)`, the deltas kernel computes the loss's gradient (and per-warp sums of its
        values) as it reads the output, so the loss kernel's pass over outputs and targets does not run."""
        kind = getattr(loss, "kind", None)
        if kind is None or y.shape[0] == 0 or not self.fuses_loss(need_dx):
            return super().backward_from_loss(ctx, y, loss, target, need_dx=need_dx, need_grads=need_grads)
        y, target = losses.checked_pair(kind, y, target)
        mean_over = getattr(loss, "mean_over", None)
        if self.tensor_cores is not None:
            dx, dparams, value = self.tensor_cores.backward_from_loss(ctx.saved, kind, target, need_dx, need_grads,
                                                                      self.gradient_scale, mean_over,
                                                                      self._mean_lift(mean_over, target))
            self._record_overflow(dx, dparams, need_grads)
            return dx, (dparams,), value
        tiles = ctx.routing[1]
        parts = torch.zeros(tiles.tile_net.shape[0] * mlp_fused.WARPS, device=y.device)
        count = mean_over or y.numel()
        dx, dparams = self._backward(y, ctx.x_c, ctx.ids, ctx.params_c, ctx.acts, ctx.pre, y, ctx.routing, need_dx,
                                     need_grads, ctx.x_feature_major, loss=(kind, target, parts, 1.0 / count))
        return self._unpadded(dx, ctx.x_feature_major), (dparams,), parts.sum() / count

    def gradients_from_loss(self, x, ids, loss, target, *, need_dx, need_grads=True, x_layout=SAMPLE_MAJOR):
        """On the tensor cores with a backward that recomputes the forward: routing, weight packing and that
        backward with the loss inside, and no forward kernel (its output would go unread)."""
        kind = getattr(loss, "kind", None)
        tc = self.tensor_cores
        x_feature_major = x_layout == FEATURE_MAJOR
        batch = x.shape[1] if x_feature_major else x.shape[0]
        if tc is None or kind is None or not tc.recomputes() or not batch or not self.fuses_loss(need_dx):
            return super().gradients_from_loss(x, ids, loss, target, need_dx=need_dx, need_grads=need_grads,
                                               x_layout=x_layout)
        self._check_batch(batch, True)
        if tuple(target.shape) != (batch, self.n_output_dims):
            raise InputError(f"target has shape {tuple(target.shape)}; expected ({batch}, "
                             f"{self.n_output_dims}) for the batch's outputs")
        _, target = losses.checked_pair(kind, target, target)
        saved = tc.saved_without_forward(x, ids, self.params.detach(), x_feature_major)
        mean_over = getattr(loss, "mean_over", None)
        dx, dparams, value = tc.backward_from_loss(saved, kind, target, need_dx, need_grads, self.gradient_scale,
                                                   mean_over, self._mean_lift(mean_over, target))
        self._record_overflow(dx, dparams, need_grads)
        return dx, (dparams,), value

    def _mean_lift(self, mean_over: int | None, target: torch.Tensor) -> float:
        """The power of two a float16 backward with the loss inside multiplies its scale by, so that a mean over
        many elements does not round its deltas to zero (tinn/gradient_scaling.py); 1 in other precisions, and
        with the static scale (tcnn's fixed 128 on the mean): the lift gives large per-element gradients a sum's
        size, which can overflow, and only the dynamic scaler skips such a step and backs off."""
        if self.precision != "float16" or self.gradient_scaler is None:
            return 1.0
        return gradient_scaling.mean_lift(mean_over or target.numel())

    def _record_overflow(self, dx, dparams, need_grads: bool, unlift: torch.Tensor | None = None) -> None:
        """A tensor-core backward's results (unscaled by the kernels): any inf or NaN recorded with the gradient
        scaler, for the step's skip decision. Gradients handed over in pieces (tinn/gradient_pieces.py) are the
        consumer's to check, once reduced: it may be writing them on another stream now. `unlift`: the factor
        `gradient_scaling.lift_small` left to multiply the results by (never with pieces), applied here, to the
        checked gradient in the pass that checks it."""
        scaler = self.gradient_scaler
        checked = (dparams if need_grads else dx) if scaler is not None else None
        if unlift is not None:
            for g in (dx, dparams):
                if g is not None and g is not checked:
                    g.mul_(unlift)
        if checked is None:
            return
        if unlift is not None:
            scaler.unscale_by(checked, unlift)
            return
        pieces = gradient_pieces.current()
        if need_grads and pieces is not None and pieces.was_handed(dparams):
            return
        scaler.record_non_finite([checked])

    def _check_batch(self, batch: int, train: bool) -> None:
        """Refuse a batch whose largest per-sample buffer that a Taichi kernel indexes passes the index limit."""
        hidden, rows = self.n_layers - 1, max(self.width, self.n_output_dims)
        buffers = [(self.kernel_inputs, "inputs"), (self.n_output_dims, "outputs")]  # other parts' kernels read them
        tc = self.tensor_cores
        if tc is not None and (not train or tc.recomputes()):
            # The tensor-core kernels switch to 64-bit offsets where an operand needs them (launch._wide_offsets),
            # and neither their inference nor their recomputing training step keeps a per-sample buffer of its own.
            chunks.check_batch("NetworkArray", batch, *max(buffers))
            return
        # The dense path's scratch buffers go through torch alone (64-bit indexing), unless Taichi's kernel
        # computes the weight gradients from them.
        if not (self.dense and self._vendor_weight_gradients()):
            buffers.append((min(hidden, 2) * self.width, f"activations ({min(hidden, 2)}, {self.width}, batch)"))
            if train:
                buffers.append((hidden * self.width, f"activations and deltas ({hidden}, {self.width}, batch)"))
            if self.keep_pre:
                buffers.append((self.n_layers * rows, f"pre-activations ({self.n_layers}, {rows}, batch)"))
        per_sample, buffer = max(buffers)
        chunks.check_batch("NetworkArray", batch, per_sample, buffer)

    @property
    def shape(self) -> mlp_array.MLPShape:
        """The compile-time shape the kernels take: the computed outputs, without tcnn's padded rows (the
        parameter offsets they use do not depend on the last matrix's row count)."""
        return mlp_array.MLPShape(self.kernel_inputs, self.width, self.n_output_dims, self.n_layers, self.hidden_act,
                          self.output_act)

    def scratch_shapes(self, batch: int, keep_all: bool = True) -> dict[str, tuple[int, ...]]:
        """Shapes of a step's scratch buffers (in `compute_dtype`), feature-major and indexed by sorted position,
        (layer, feature, position): "acts", every hidden layer's output (with keep_all; else the kernels' two
        ping-pong slots), "pre", the pre-activations (where an activation's derivative reads them), "deltas",
        the hidden layers' dL/dz, and "dout", the output's (n_out rows, no padding to the width)."""
        hidden = self.n_layers - 1
        slots = hidden if keep_all else min(hidden, 2)
        return {"acts": (max(slots, 1), self.width, batch if slots else 1),
                "pre": (self.n_layers, max(self.width, self.n_output_dims), batch) if self.keep_pre else (1, 1, 1),
                "deltas": (hidden, self.width, batch) if hidden else (1, 1, 1),
                "dout": (1, self.n_output_dims, batch)}

    def _launch_forward(self, x, ids, params, order, keep_all, x_feature_major=False):
        batch = ids.shape[0]
        dev = x.device
        shapes = self.scratch_shapes(batch, keep_all)
        acts = torch.empty(shapes["acts"], device=dev, dtype=self.compute_dtype)
        pre = torch.empty(shapes["pre"], device=dev, dtype=self.compute_dtype)
        out = torch.empty(batch, self.n_output_dims, device=dev)
        if batch and self.dense:
            dense_mlp.forward(x, params, self.shape, acts=acts, pre=pre, out=out, keep_all=keep_all,
                              keep_pre=self.keep_pre, x_feature_major=x_feature_major)
        elif batch:
            mlp_array.run_forward(x, ids, order, params, self.shape, acts=acts, pre=pre, out=out, keep_all=keep_all,
                          keep_pre=self.keep_pre)
        return out, acts, pre

    def _fused_tiles(self, ids, train: bool) -> tuple[TileRouting, ...]:
        """Forward tiles, plus when training the weight-gradient chunks and the backward-deltas tiles
        (one sort for all; the backward reuses the forward's tiles when both have one size)."""
        g = self.fused_geometry
        separate_backward = train and g.backward_tile != g.tile
        sizes = (g.tile,) + ((mlp_fused.grad_chunk(ids.shape[0]),) if train else ()) + \
            ((g.backward_tile,) if separate_backward else ())
        if self.n_networks > 1:
            tiles = route_fused(ids, self.n_networks, sizes)
        else:
            key = (ids.shape[0], train)
            tiles = self._single_network_tiles.get(key)
            if tiles is None:
                if len(self._single_network_tiles) >= 4:
                    self._single_network_tiles.clear()
                tiles = runtime.keep(self._single_network_tiles, key, route_fused(ids, 1, sizes))
        return tiles if not train or separate_backward else tiles + (tiles[0],)

    def _launch_fused_forward(self, x, ids, params, keep_all, x_feature_major=False, frequencies=0):
        tiles = self._fused_tiles(ids, train=keep_all)
        batch = ids.shape[0]
        acts = torch.empty((self.n_layers - 1, self.width, batch) if keep_all and self.n_layers > 1 else (1, 1, 1),
                           device=x.device)
        out = torch.empty(batch, self.n_output_dims, device=x.device)
        if batch:
            mlp_fused.run_forward(x, tiles[0], params, self.shape, self.fused_geometry, acts=acts, out=out,
                                  keep_all=keep_all, x_feature_major=x_feature_major, frequencies=frequencies,
                                  pad=self.input_padding[1])
        return out, acts, (tiles if keep_all else None)

    def fuses_frequency_inputs(self, n_raw_dims: int, n_frequencies: int) -> bool:
        """Whether `inference_of_frequencies` applies: the fused kernels run this array, and their inputs are
        the Frequency encoding of `n_raw_dims` values (tcnn's layout), padded."""
        return self.fused and n_raw_dims * 2 * n_frequencies == self.n_input_dims

    def inference_of_frequencies(self, x_raw: torch.Tensor, ids: torch.Tensor, n_frequencies: int) -> torch.Tensor:
        """The forward of Frequency(n_frequencies)(x_raw) without the encoded features in memory: the fused
        kernel encodes each sample's raw values as it loads them (validated inputs; `fuses_frequency_inputs`)."""
        self._check_batch(x_raw.shape[0], False)
        return self._launch_fused_forward(x_raw.contiguous(), ids, self.params.detach(), keep_all=False,
                                          frequencies=n_frequencies)[0]

    def _inference(self, x, ids, params, x_feature_major):
        if self.fused:
            return self._launch_fused_forward(x, ids, params, keep_all=False, x_feature_major=x_feature_major)[0]
        order = None if self.dense else route(ids, self.n_networks, self.tile_size, tiles=False).order
        out, _, _ = self._launch_forward(x, ids, params, order, keep_all=False, x_feature_major=x_feature_major)
        return out

    def _forward_train(self, x, ids, params, x_feature_major):
        """Forward keeping what the backward needs. `x_feature_major` (fused and dense paths): x is (n_in, batch),
        as a grid encoding writes it, and `_backward` then returns dx the same way."""
        if self.fused:
            out, acts, routing = self._launch_fused_forward(x, ids, params, keep_all=True,
                                                            x_feature_major=x_feature_major)
            return out, acts, acts[:0], routing[1:]  # (the weight-gradient chunks, the backward's tiles)
        # The dense path needs no routing (one network, samples in order) unless Taichi's kernel computes its
        # weight gradients; the routing's tile count would cost a host sync.
        needs_routing = not (self.dense and self._vendor_weight_gradients())
        routing = route(ids, self.n_networks, self.tile_size) if needs_routing else None
        out, acts, pre = self._launch_forward(x, ids, params, routing and routing.order, keep_all=True,
                                             x_feature_major=x_feature_major)
        return out, acts, pre, routing

    def _backward(self, dy, x, ids, params, acts, pre, out, routing: Routing | tuple[TileRouting, TileRouting],
                  want_dx: bool, want_params: bool, x_feature_major: bool, loss=None):
        """`loss` (fused kernels only): see mlp_fused.run_backward_deltas; dy is then not read."""
        batch = ids.shape[0]
        dev = x.device
        dx_shape = (self.kernel_inputs, batch) if x_feature_major else (batch, self.kernel_inputs)
        dx = torch.empty(dx_shape, device=dev) if want_dx else torch.empty(1, 1, device=dev)
        gemm = batch > 0 and self._vendor_weight_gradients()
        dparams = None
        if want_params:  # the GEMMs write every computed weight (tcnn's padded output rows stay zero); kernels add
            padded = self.kernel_outputs > self.n_output_dims
            dparams = torch.empty_like(params, dtype=torch.float32) if gemm and not padded else \
                torch.zeros_like(params, dtype=torch.float32)
        if not batch:
            return (torch.zeros(dx_shape, device=dev) if want_dx else None), dparams
        shapes = self.scratch_shapes(batch)
        deltas = torch.empty(shapes["deltas"], device=dev, dtype=self.compute_dtype)
        dout = torch.empty(shapes["dout"], device=dev, dtype=self.compute_dtype)
        if self.fused:
            grad_chunks, tiles = routing
            mlp_fused.run_backward_deltas(dy, tiles, params, self.shape, self.fused_geometry, acts=acts, out=out,
                                          deltas=deltas, dout=dout, dx=dx, want_dx=want_dx,
                                          x_feature_major=x_feature_major, loss=loss)
        elif self.dense:
            dense_mlp.backward_deltas(dy, params, self.shape, acts=acts, pre=pre, out=out, deltas=deltas, dout=dout,
                                      dx=dx, keep_pre=self.keep_pre, want_dx=want_dx, x_feature_major=x_feature_major,
                                      gradient_scale=self.gradient_scale)
        else:
            mlp_array.run_backward_deltas(dy, ids, routing.order, params, self.shape, acts=acts, pre=pre, out=out,
                                  deltas=deltas, dout=dout, dx=dx, keep_pre=self.keep_pre, want_dx=want_dx)
        if not want_params:
            pass
        elif gemm:
            self._gemm_weight_gradients(x, x_feature_major, acts, deltas, dout, dparams)
        elif self.fused:
            mlp_fused.run_weight_gradients(x, grad_chunks, self.shape, self.fused_geometry, acts=acts, deltas=deltas,
                                           dout=dout, dparams=dparams, x_feature_major=x_feature_major)
        else:
            mlp_array.run_weight_gradients(x, routing, self.shape, acts=acts, deltas=deltas, dout=dout, dparams=dparams)
        return (dx if want_dx else None), dparams

    def _vendor_weight_gradients(self) -> bool:
        """Whether the weight gradients are vendor GEMMs (`_gemm_weight_gradients`): a single network, where the
        settings say so. They read the scratch buffers through torch and need no routing."""
        return self.n_networks == 1 and runtime.tuning().vendor_weight_gradients

    def _gemm_weight_gradients(self, x, x_feature_major, acts, deltas, dout, dparams):
        """One network: dW_l = deltas_l @ input_l^T over the whole batch, vendor GEMMs per layer.

        With a single network the batch is one long reduction (K = batch), what split-K GEMMs are for
        (tcnn computes its weight gradients with CUTLASS GEMMs the same way). Its sorted order is the
        identity, so the feature-major deltas and activations line up with the input's samples; the network
        input is read as (n_in, batch) from either layout. Plain float32 unless
        torch.backends.cuda.matmul.allow_tf32 is set. Used by the fused (CUDA) and the unfused (CPU)
        backward alike: both keep deltas and activations feature-major by sorted position. tcnn's padded
        output rows of `dparams` are not written (the caller hands zeros when there are any). In float16 the
        deltas come scaled (`gradient_scale`); the result does not.
        """
        # Row 0 of dparams holds the layers' (fan_out, fan_in) blocks one after the other. The operands are
        # rows of the stacked buffers, described without a view op each.
        x_rows = GemmOperand.of(x) if x_feature_major else GemmOperand.transposed(x)
        last = self.n_layers - 1
        mm_long_k([(GemmOperand.stacked(dout, 0) if l == last else GemmOperand.stacked(deltas, l),   # (fan_out, B)
                    x_rows if l == 0 else GemmOperand.stacked(acts, l - 1, fan_in))         # (fan_in, B)
                   for l, (fan_out, fan_in) in enumerate(self.layer_shapes())], dparams)
        if self.gradient_scaler is not None:  # unscaled, and any inf or NaN recorded for the step's skip decision
            self.gradient_scaler.unscale_([dparams])
        elif self.gradient_scale != 1.0:  # the deltas carry the scale of the network's precision
            dparams.mul_(1.0 / self.gradient_scale)

    def extra_repr(self) -> str:
        pad = f" (+{self.input_padding[0]} x {self.input_padding[1]:g})" if self.input_padding[0] else ""
        opad = self.kernel_outputs - self.n_output_dims
        return (f"n_networks={self.n_networks}, in={self.n_input_dims}{pad}, out={self.n_output_dims}"
                f"{f' (+{opad})' if opad else ''}, "
                f"width={self.width}, hidden_layers={self.n_layers - 1}, "
                f"activation={activation_name(self.hidden_act)}, output_activation={activation_name(self.output_act)}"
                f"{'' if self.precision == 'float32' else f', precision={self.precision}'}")


class Network(NetworkArray):
    """A single MLP (tcnn's `Network`): a NetworkArray of one."""

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config=None, seed: int = 1337,
                 kernels: str | None = None):
        super().__init__(n_input_dims, n_output_dims, network_config, n_networks=1, seed=seed, kernels=kernels)
