"""The one rule that decides how an MLP array's matrix products run, and in which precision.

Paths:
- "tensor_cores": Triton kernels on CUDA (`tinn/kernels/tensor_cores/`), float16/bfloat16/TF32 operands with
  float32 accumulation; an array's forward, backward and weight gradients on the GPU's tensor cores.
- "fused": Taichi's fused CUDA kernels (one launch for all layers, float32 SIMT).
- "unfused": Taichi's per-layer kernels, any arch (the CPU's path for arrays; deterministic mode's).
- "dense": a single network as vendor GEMMs (the CPU's BLAS, cuBLAS; `tinn/dense_mlp.py`).
- "batched_gemm": an array as torch batched GEMMs over samples grouped and padded per network, the networks
  bucketed by sample count so that padding stays under twice the real rows (the CPU's BLAS; `batched_gemm.py`).

The rule follows measurements (docs/design-notes.md). The default precision ("auto", `default_precision`) is
tcnn's float16 for an array of networks on CUDA whose shape the tensor-core kernels take (hidden width 16 to 128,
at most 128 inputs and outputs, any activation), outside deterministic mode: there the tensor cores were
measured faster, and for one network shared by an array's ids (its decoder); float32 everywhere else (the CPU, a
single network, other shapes, deterministic mode). On CUDA
an array runs on the tensor cores in every reduced precision (float16, bfloat16, TF32) and in the fused kernels
in float32; a single network takes the dense path where that was measured faster and in half precision (with
`tuning.step_graphs` or as an array's shared decoder, the tensor cores where they take its shape); on the
CPU the dense path for one network, batched GEMMs for arrays. An explicit `kernels=` (or
`settings.kernels`) forces a path and is refused where it cannot run.
"""
from __future__ import annotations

from typing import NamedTuple

from ..errors import ConfigError
from ..settings import NETWORK_KERNELS, NETWORK_PRECISIONS

PATHS = ("tensor_cores", "fused", "unfused", "dense", "batched_gemm")
# `kernels=` values: a path, or "auto" for the rule below; `precision=` values ("auto": `default_precision`, or
# float16 where the tensor cores were asked for by name). The settings' fields take the same values.
KERNEL_CHOICES = NETWORK_KERNELS
PRECISIONS = NETWORK_PRECISIONS


class Choice(NamedTuple):
    path: str
    precision: str   # "float32", "tf32", "float16" or "bfloat16": what the path computes its products in


class Candidate(NamedTuple):
    """What the rule needs to know of an array and its machine."""
    arch: str                 # "cuda" or "cpu"
    n_networks: int
    width: int
    fusable: bool             # Taichi's fused kernels take this shape and these activations
    tensor_cores: str | None  # None where the tensor-core kernels take it, else why not
    deterministic: bool
    dense_setting: bool | None    # tuning.dense_single_network
    vendor_faster: bool       # dense_mlp.faster_than_kernels for this arch and shape
    step_graphs: bool = False  # tuning.step_graphs: a Trainer's steps replayed from CUDA graphs
    served_ids: int = 1       # ids one network serves: an array's shared decoder (share_network) serves all of them


class PrecisionUnavailable(ConfigError):
    """A precision the chosen path cannot compute in."""


# The narrowest hidden layer the tensor cores take by default: their products work on blocks of at least 16
# features, so a narrower layer is padded with zeros and gains nothing.
MIN_DEFAULT_TENSOR_CORE_WIDTH = 16


def default_precision(c: Candidate) -> str:
    """What `precision="auto"` computes in with `kernels="auto"`: float16 on the tensor cores for an array of
    several networks on CUDA whose shape their kernels take (`c.tensor_cores` is None), hidden width at least
    `MIN_DEFAULT_TENSOR_CORE_WIDTH`, outside deterministic mode (the kernels' atomic sums have no fixed order);
    float32 otherwise. A pure function of the candidate: the same answer on any machine."""
    if (c.arch == "cuda" and _serves_an_array(c) and c.tensor_cores is None and not c.deterministic
            and c.width >= MIN_DEFAULT_TENSOR_CORE_WIDTH):
        return "float16"
    return "float32"


def _serves_an_array(c: Candidate) -> bool:
    """An array of networks, or one network that decodes an array's ids (a shared decoder): it sees the array's
    batches and computes as the array's own networks would."""
    return c.n_networks > 1 or c.served_ids > 1


def choose_path(c: Candidate, kernels: str, precision: str, precision_from_settings: bool = False) -> Choice:
    """The path and precision of an array (see the module docstring); a ConfigError for a forced path or
    precision that cannot run here, naming what is allowed. A precision that comes from the process's settings
    (not the array's own argument) applies where it can: elsewhere the array computes in float32, and its
    `precision` attribute says so."""
    try:
        return _choose(c, kernels, precision)
    except PrecisionUnavailable:
        if not precision_from_settings:
            raise
        return _choose(c, kernels, "float32")


def _choose(c: Candidate, kernels: str, precision: str) -> Choice:
    if kernels not in KERNEL_CHOICES:
        raise ConfigError(f"kernels={kernels!r} is not supported; allowed: {list(KERNEL_CHOICES)}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r} is not supported; allowed: {list(PRECISIONS)}")
    reduced = precision not in ("auto", "float32")
    if c.deterministic:
        # Every path but the unfused kernels (and one network's BLAS) adds partial sums in no fixed order.
        if kernels not in ("auto", "unfused"):
            raise ConfigError(f"kernels={kernels!r} sums weight gradients in no fixed order; with "
                              "settings.deterministic allowed: 'unfused' or 'auto'")
        if reduced:
            raise PrecisionUnavailable(f"precision={precision!r} runs on tensor cores or vendor GEMMs, whose sums "
                                       "have no fixed order; with settings.deterministic allowed: 'float32' or 'auto'")
        return Choice("unfused", "float32")
    if kernels == "tensor_cores":
        if c.tensor_cores is not None:
            raise ConfigError(f"kernels='tensor_cores' cannot run here: {c.tensor_cores}; allowed here: "
                              "'fused' (CUDA), 'unfused' or 'auto'")
        return Choice("tensor_cores", "float16" if precision == "auto" else precision)
    if kernels == "fused":
        if not c.fusable:
            raise ConfigError("kernels='fused' needs the CUDA arch, no Sine or SiLU activation and at most 128 "
                              "features; allowed here: 'unfused' or 'auto'")
        _float32_only("fused", precision)
        return Choice("fused", "float32")
    if kernels in ("unfused", "batched_gemm"):
        _float32_only(kernels, precision)
        return Choice(kernels, "float32")
    # "auto": `default_precision` (float16 for CUDA arrays the tensor cores take, else float32); in float16,
    # bfloat16 or TF32 an array takes the tensor cores, a single network its dense GEMMs where they run that
    # precision.
    if precision == "auto":
        precision = default_precision(c)
    if c.n_networks == 1:
        # With a Trainer's steps replayed from CUDA graphs (tinn/step_graphs.py), float16 and bfloat16 take the
        # tensor cores where their kernels take the shape: less GPU work than cuBLAS's GEMMs, and a step of Triton
        # launches alone, which one graph holds. Issued op by op, the two measured alike. A shared decoder takes
        # them too: it runs on an array's batches, where one fused kernel keeps every layer's activations on chip
        # and cuBLAS writes each layer out.
        tensor_cores_half = ((c.step_graphs or c.served_ids > 1) and c.arch == "cuda" and c.tensor_cores is None
                             and precision in ("float16", "bfloat16"))
        wants_dense = (c.dense_setting if c.dense_setting is not None
                       else c.vendor_faster or (reduced and not tensor_cores_half))
        if wants_dense and precision != "tf32":
            return Choice("dense", precision)
    if c.arch == "cuda" and c.tensor_cores is None and precision != "float32":
        return Choice("tensor_cores", precision)
    if precision not in ("auto", "float32"):
        raise PrecisionUnavailable(f"precision={precision!r} needs the tensor-core kernels (CUDA with Triton) or, "
                                   f"for a single network, the dense path; here: {c.tensor_cores or 'not a CUDA arch'}"
                                   "; allowed here: 'float32' or 'auto'")
    if c.arch == "cpu" and c.n_networks > 1:
        return Choice("batched_gemm", "float32")
    return Choice("fused" if c.fusable else "unfused", "float32")


def _float32_only(path: str, precision: str) -> None:
    if precision not in ("auto", "float32"):
        raise PrecisionUnavailable(f"kernels={path!r} computes in float32; precision={precision!r} needs "
                                   "kernels='tensor_cores' or 'auto'; allowed with this path: 'float32' or 'auto'")
