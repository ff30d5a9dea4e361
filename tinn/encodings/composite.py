"""Composite encoding (tcnn): nested encodings over ranges of input dims, then a reduction.

Trainable nested encodings (grids) do not keep their own tensors here: the composite owns a
single `params` table `(n_networks, sum of nested params)` so the contract "one nn.Parameter
whose first dim is the network id" still holds, and each nested grid reads its column range.
"""
from __future__ import annotations

import torch

from ..config import Section
from ..errors import ConfigError
from ..part import Context, SecondOrderError, run
from .base import Encoding
from .registry import create_encoding

REDUCTIONS = ("Concatenation", "Sum", "Product")
# Keys of each nested encoding's config that the composite reads (tcnn's), besides the encoding's own.
NESTED_KEYS = ("n_dims_to_encode", "dims_to_encode_begin")


class CompositeEncoding(Encoding):
    otype = "Composite"
    OPTIONS = ("nested", "reduction")

    def __init__(self, n_input_dims: int, nested: list, reduction: str = "Concatenation", n_networks: int = 1):
        """`nested`: list of (first input dim, Encoding) pairs."""
        if reduction not in REDUCTIONS:
            raise ConfigError(f"reduction={reduction!r} is not supported; allowed: {list(REDUCTIONS)}")
        if not nested:
            raise ConfigError("Composite needs at least one nested encoding")
        for begin, enc in nested:
            if begin < 0 or begin + enc.n_input_dims > n_input_dims:
                raise ConfigError(f"nested {enc.otype} encodes dims [{begin}, {begin + enc.n_input_dims}) "
                                  f"but the composite has only {n_input_dims} input dims")
        widths = [enc.n_output_dims for _, enc in nested]
        if reduction != "Concatenation" and len(set(widths)) != 1:
            raise ConfigError(f"reduction={reduction!r} needs nested encodings of equal output width, got {widths}")
        n_out = sum(widths) if reduction == "Concatenation" else widths[0]
        super().__init__(n_input_dims, n_out, n_networks)
        self.reduction = reduction
        self.begins = [int(b) for b, _ in nested]
        self.nested = torch.nn.ModuleList([enc for _, enc in nested])

        # Take over the nested parameter tables: one (n_networks, total) table, column ranges per child.
        self.param_offsets: list[int | None] = []
        tables, offset = [], 0
        for enc in self.nested:
            if enc.n_params_per_network() > 0:
                if enc.params is None or not hasattr(enc, "lookup"):
                    raise ConfigError(f"nested {enc.otype} has parameters but cannot read them from a shared table")
                if getattr(enc, "compact", False):
                    raise ConfigError(f"nested {enc.otype} has table_dtype='bfloat16'; a Composite holds one float32 "
                                      "table for its nested grids; allowed inside a Composite: table_dtype='float32'")
                tables.append(enc.params.data)
                enc.params = None
                self.param_offsets.append(offset)
                offset += tables[-1].shape[1]
            else:
                self.param_offsets.append(None)
        self._n_params = offset
        if tables:
            self.params = torch.nn.Parameter(torch.cat(tables, dim=1))
        else:
            self.uses_ids = False

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        items = cfg.data.get("nested")
        if not isinstance(items, list) or not items:
            raise ConfigError(f"{cfg.key('nested')} must be a non-empty JSON array of encodings")
        reduction = cfg.choice("reduction", REDUCTIONS, "Concatenation")
        sections = [Section(item, f"{cfg.key('nested')}[{i}]", extra_keys=NESTED_KEYS) for i, item in enumerate(items)]
        any_begin = any(s.has("dims_to_encode_begin") for s in sections)
        specified = sum(s.integer("n_dims_to_encode", 0, lo=0) for s in sections if s.has("n_dims_to_encode"))
        if not any_begin and specified > n_input_dims:
            raise ConfigError(f"{cfg.key('nested')}: nested encodings encode {specified} dims but the composite "
                              f"has {n_input_dims}")
        remaining = None if any_begin else n_input_dims - specified
        nested, offset = [], 0
        for i, s in enumerate(sections):
            if s.has("n_dims_to_encode"):
                if s.has("dims_to_encode_begin"):
                    offset = s.integer("dims_to_encode_begin", lo=0, hi=n_input_dims)
                n_dims = s.integer("n_dims_to_encode", lo=0, hi=n_input_dims)
            else:
                if remaining is None:
                    raise ConfigError(f"{s.path}.n_dims_to_encode is missing: only one nested encoding may leave it "
                                      "unspecified, and none when dims_to_encode_begin is used")
                n_dims, remaining = remaining, None
            if n_dims > 0:
                if offset + n_dims > n_input_dims:
                    raise ConfigError(f"{s.path} encodes dims [{offset}, {offset + n_dims}) but the composite has "
                                      f"only {n_input_dims} input dims")
                nested.append((offset, create_encoding(n_dims, s, n_networks=n_networks, seed=seed + i)))
            offset += n_dims
        return cls(n_input_dims, nested, reduction, n_networks)

    def n_params_per_network(self) -> int:
        return self._n_params

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        if self.params is not None:
            tables = [enc.initial_params(enc.seed if seed is None else seed + i)
                      for i, (enc, off) in enumerate(zip(self.nested, self.param_offsets)) if off is not None]
            self.params.copy_(torch.cat(tables, dim=1))

    def memory_report(self) -> dict:
        return {"otype": self.otype, "n_networks": self.n_networks, "params_per_network": self._n_params,
                "bytes_per_network": self._n_params * 4, "total_bytes": self.memory_bytes(),
                "nested": [enc.memory_report() if hasattr(enc, "memory_report") else {"otype": enc.otype}
                           for enc in self.nested]}

    # ---- the part contract: each nested part on its dims, then the reduction ----------------------
    def _slice(self, x, begin, enc):
        xi = x[:, begin:begin + enc.n_input_dims]
        return xi if xi.is_contiguous() else xi.contiguous()

    def forward_with_context(self, x, ids, *, train, x_layout="sample_major", y_layout="sample_major"):
        table = None if self.params is None else self.params.detach()
        outs, ctxs = [], []
        for begin, enc, off in zip(self.begins, self.nested, self.param_offsets):
            xi = self._slice(x, begin, enc)
            if off is None:
                y, c = enc.forward_with_context(xi, ids, train=train)
            else:
                y, c = enc.lookup(xi, ids, table, off), Context(x=xi)
            outs.append(y)
            ctxs.append(c)
        y = self._reduce(outs)
        outs = [o.detach() for o in outs]  # aliases: autograd marks the returned tensor itself
        return y, (Context(x=x, ids=ids, outs=outs, ctxs=ctxs) if train else None)

    def _reduce(self, outs):
        if self.reduction == "Concatenation":
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        result = outs[0]
        for o in outs[1:]:
            result = result + o if self.reduction == "Sum" else result * o
        return result

    def _nested_dy(self, ctx, dy):
        """The gradient reaching each nested output."""
        if self.reduction == "Concatenation":
            widths = [enc.n_output_dims for enc in self.nested]
            return [d.contiguous() for d in torch.split(dy, widths, dim=1)]
        if self.reduction == "Sum":
            return [dy] * len(self.nested)
        result = []
        for i in range(len(ctx.outs)):  # Product: dy times the other factors
            others = [o for j, o in enumerate(ctx.outs) if j != i]
            g = dy
            for o in others:
                g = g * o
            result.append(g.contiguous())
        return result

    def backward(self, ctx, dy, *, need_dx, need_grads=True):
        table = None if self.params is None else self.params.detach()
        dtable = torch.zeros_like(table) if (need_grads and table is not None) else None
        dx = torch.zeros_like(ctx.x) if need_dx else None
        for begin, enc, off, c, g in zip(self.begins, self.nested, self.param_offsets, ctx.ctxs,
                                         self._nested_dy(ctx, dy)):
            if off is None:
                dxi = enc.backward(c, g, need_dx=need_dx, need_grads=False)[0] if need_dx else None
            else:
                dxi = enc.lookup_backward(c.x, ctx.ids, table, off, g, dtable, need_dx)
            if dxi is not None:
                dx[:, begin:begin + enc.n_input_dims] += dxi
        return dx, ((dtable,) if table is not None else ())

    def backward_backward(self, ctx, dy, ddx, *, need_ddy, need_dx, need_dtables):
        """Through autograd over the nested parts' own contracts (each with its second derivative)."""
        if self.params is not None:
            raise SecondOrderError("second-order gradients through a Composite with trainable nested tables are "
                                   "not supported; allowed: Composite of parameter-free encodings, or the grid alone")
        with torch.enable_grad():
            x = ctx.x.detach().requires_grad_(True)
            dy = dy.detach().requires_grad_(need_ddy)
            outs = [run(enc, self._slice(x, begin, enc), ctx.ids) for begin, enc in zip(self.begins, self.nested)]
            (dx,) = torch.autograd.grad(self._reduce(outs), x, grad_outputs=dy, create_graph=True)
            wanted = [t for t, want in ((dy, need_ddy), (x, need_dx)) if want]
            grads = torch.autograd.grad(dx, wanted, grad_outputs=ddx, allow_unused=True) if wanted else ()
        grads = iter(grads)
        d_dy = next(grads) if need_ddy else None
        d_x = next(grads) if need_dx else None
        return d_dy, (torch.zeros_like(ctx.x) if need_dx and d_x is None else d_x), ()

    def extra_repr(self) -> str:
        return super().extra_repr() + f", reduction={self.reduction}, begins={self.begins}"
