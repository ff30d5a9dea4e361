"""tiny-cuda-nn's flat parameter layout: import and export, so tcnn parameters and state_dicts load into
tinn and tinn's go back out.

tcnn keeps a model's parameters in one 1-D buffer: the network first, then the encoding. The network's
matrices follow each other, each row-major (fan_out, fan_in), with the input padded as tcnn pads it
(tinn models built with tcnn's padding have the same first matrix) and the last matrix's rows padded to a
multiple of 16 (tcnn slices those outputs off; tinn's tcnn names store them too, other tinn models export
them as zeros and drop them on import). A grid's
table is its levels in order, entries x features with the feature fastest, as tinn stores it; a Composite
concatenates its nested tables. Arrays (n_networks > 1) extend this per network: row k of an
(n_networks, n_params) tensor is network k's flat vector.
"""
from __future__ import annotations

import torch

from .errors import InputError

OUTPUT_ALIGNMENT = 16


def _parts(model):
    """(network, encoding or None) of a tinn model in tcnn's order."""
    network = getattr(model, "network", model)
    encoding = getattr(model, "encoding", None)
    if not hasattr(network, "layer_shapes"):
        raise InputError(f"{type(model).__name__} has no tcnn parameter layout; allowed: a network array or an "
                         "encoding + network model")
    if encoding is not None and encoding.params is not None and encoding.n_networks != network.n_networks:
        raise InputError("a shared encoding table under an array of networks has no per-network tcnn layout; "
                         "export the encoding's params on their own")
    return network, encoding


def _padded_shapes(network):
    shapes = network.layer_shapes()
    out, fan_in = shapes[-1]
    return shapes[:-1] + [(-(-out // OUTPUT_ALIGNMENT) * OUTPUT_ALIGNMENT, fan_in)]


def n_params(model) -> int:
    """Parameters per network in tcnn's layout (padded output rows counted, as tcnn counts them)."""
    network, encoding = _parts(model)
    enc = 0 if encoding is None or encoding.params is None else encoding.params.shape[1]
    return sum(o * i for o, i in _padded_shapes(network)) + enc


@torch.no_grad()
def export_params(model) -> torch.Tensor:
    """The model's parameters in tcnn's layout: (P,) for a single network, (n_networks, P) for an array."""
    network, encoding = _parts(model)
    rows = network.params.shape[0]
    pieces, off = [], 0
    for (o, i), (po, _) in zip(network.layer_shapes(), _padded_shapes(network)):
        w = network.params[:, off:off + o * i].reshape(rows, o, i)
        if po > o:
            w = torch.cat([w, w.new_zeros(rows, po - o, i)], dim=1)
        pieces.append(w.reshape(rows, -1))
        off += o * i
    if encoding is not None and encoding.params is not None:
        pieces.append(encoding.params)
    flat = torch.cat(pieces, dim=1)
    return flat[0] if rows == 1 else flat


@torch.no_grad()
def import_params(model, flat: torch.Tensor) -> None:
    """Load tcnn-layout parameters (any float dtype, any device) into the model, in place."""
    network, encoding = _parts(model)
    rows = network.params.shape[0]
    if not isinstance(flat, torch.Tensor) or not flat.is_floating_point():
        raise InputError(f"params must be a floating-point torch.Tensor, got "
                         f"{getattr(flat, 'dtype', type(flat).__name__)}")
    want = n_params(model)
    expected = (want,) if rows == 1 else (rows, want)
    if flat.dim() == 1 and rows == 1:
        flat = flat[None]
    if tuple(flat.shape) != (rows, want):
        raise InputError(f"params has shape {tuple(flat.shape)}; this model's tcnn layout is {expected}")
    flat = flat.to(device=network.params.device, dtype=torch.float32)
    off_src = off_dst = 0
    for (o, i), (po, _) in zip(network.layer_shapes(), _padded_shapes(network)):
        w = flat[:, off_src:off_src + po * i].reshape(rows, po, i)[:, :o]
        network.params[:, off_dst:off_dst + o * i].copy_(w.reshape(rows, -1))
        off_src += po * i
        off_dst += o * i
    if encoding is not None and encoding.params is not None:
        encoding.params.copy_(flat[:, off_src:])


def is_tcnn_state_dict(state_dict) -> bool:
    """tcnn's torch modules save one flat parameter: {"params": (P,)}."""
    return set(state_dict) == {"params"} and isinstance(state_dict["params"], torch.Tensor) and \
        state_dict["params"].dim() == 1


def bind_flat(model) -> torch.Tensor | None:
    """Rebind a single-network model's tables as views of one flat storage in tcnn's order (network, then
    encoding), so `model.params` can be that flat vector, as in tcnn; returns it (None for arrays, whose
    per-network rows cannot be contiguous views of both tables at once, and for tables of different dtypes)."""
    if getattr(model, "network", model).n_networks != 1:
        return None
    network, encoding = _parts(model)
    tables = [network] + ([encoding] if encoding is not None and encoding.params is not None else [])
    if len({t.params.dtype for t in tables}) > 1:  # a compact (bfloat16) grid table cannot share float32 storage
        return None
    flat = torch.cat([t.params.detach().reshape(-1) for t in tables])
    off = 0
    for part in tables:
        old = part.params
        n = old.numel()
        new = torch.nn.Parameter(flat[off:off + n].view(old.shape), requires_grad=old.requires_grad)
        new.__dict__.update(old.__dict__)  # e.g. the layer shapes matrix-aware optimizers read
        part.params = new
        off += n
    return flat


def flat_view(model, flat: torch.Tensor | None) -> torch.Tensor | None:
    """`flat` when the model's tables still are views of it (a table replaced since, by load_state_dict
    with assign=True or a device move, breaks the binding), else None."""
    if flat is None:
        return None
    network, encoding = _parts(model)
    lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    for part in [network] + ([encoding] if encoding is not None and encoding.params is not None else []):
        p = part.params
        if not (p.device == flat.device and lo <= p.data_ptr() < hi):
            return None
    return flat
