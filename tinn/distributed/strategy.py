"""Shard or replicate: which multi-GPU strategy moves fewer bytes for an array (docs/guides/sharding.md).

    td.choose_strategy(n_params=29_360_128, n_input_dims=32, n_output_dims=16, samples_per_rank=1 << 21)
    # -> "replicated": 2^21 samples x 260 B per step outweigh the all-reduce of 2 x 117 MB

Sharded (`ShardedPart`): every sample travels to the rank owning its network and its outputs come back (in the
Trainer's step its target travels with it instead, and nothing comes back);
per rank and step the link carries about (w - 1) / w x S x b bytes, S samples per rank and b bytes per
sample (`exchange_bytes_per_sample`). Replicated (`Replicated`): samples stay, and a ring all-reduce sends
2 (w - 1) / w x P x r bytes per rank, P parameters in the reduce dtype's r bytes. The (w - 1) / w cancels:
replicate when 2 P r <= S b (P (r + 4) with the optimizer split over the ranks, whose all-gather of
parameters is float32) and the training state (P x state bytes per parameter: parameters, gradients and
Adam's two moments in float32 are 16 B) fits on one GPU; otherwise shard.
"""
from __future__ import annotations

from ..config import count
from ..errors import ConfigError

#: Bytes per gradient element on the link, per `Replicated(reduce_dtype=...)`.
REDUCE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: Bytes per (input or output, gradient) value on the link, per `ShardedPart(exchange_dtype=...)`: float16
#: sends values in float16 and gradients in bfloat16.
EXCHANGE_BYTES = {"float32": (4, 4), "float16": (2, 2), "bfloat16": (2, 2)}
STRATEGIES = ("sharded", "replicated")


def exchange_bytes_per_sample(n_input_dims: int, n_output_dims: int, need_dx: bool = False,
                              exchange_dtype: str = "float32", loss_at_owners: bool = False) -> int:
    """Bytes a training sample moves over the link in a sharded step: its inputs and local id (int32) to
    the owner and the outputs back in the forward, dy to the owner in the backward, and dx back when the
    caller wants input gradients, in the exchange dtype's widths (a 16-bit row pads odd input counts).
    loss_at_owners: the Trainer's step, which takes `ShardedPart.gradients_from_loss` where it can (a float32
    exchange, no dx): inputs, targets and the id to the owner, nothing back."""
    d, o = count("n_input_dims", n_input_dims), count("n_output_dims", n_output_dims)
    if exchange_dtype not in EXCHANGE_BYTES:
        raise ConfigError(f"exchange_dtype={exchange_dtype!r} is not supported; allowed: {list(EXCHANGE_BYTES)}")
    if loss_at_owners and exchange_dtype == "float32" and not need_dx:
        return 4 * (d + o + 1)
    value, grad = EXCHANGE_BYTES[exchange_dtype]
    inputs = 4 * (d + 1) if value == 4 else value * (d + d % 2) + 4
    return inputs + value * o + grad * o + (grad * d if need_dx else 0)


def choose_strategy(n_params: int, n_input_dims: int, n_output_dims: int, samples_per_rank: int, *,
                    need_dx: bool = False, reduce_dtype: str = "float32", gpu_memory_bytes: int | None = None,
                    state_bytes_per_param: int = 16, exchange_dtype: str = "float32",
                    optimizer_split: bool = False, loss_at_owners: bool = False) -> str:
    """"sharded" or "replicated" for an array of `n_params` parameters (all networks together) trained with
    `samples_per_rank` samples per rank and step.

    "sharded" when the training state (`n_params` x `state_bytes_per_param`) exceeds `gpu_memory_bytes`
    (None: not checked; pass what one GPU can give the state, after activations and the rest), or when the
    samples' exchange moves fewer bytes than the gradients' all-reduce:
    `samples_per_rank x exchange_bytes_per_sample(...) < 2 x n_params x bytes of reduce_dtype`; with
    `optimizer_split` (a Replicated part's split optimizer: a reduce-scatter in the reduce dtype, an all-gather
    in float32) the right side is `n_params x (bytes of reduce_dtype + 4)`; with `loss_at_owners` the exchange
    is the Trainer's step's (`exchange_bytes_per_sample`).
    "replicated" otherwise. Bytes only: the exchange's per-sample packing passes favour replication a bit
    more, the optimizer step that every replica takes over all parameters (unless split) favours sharding."""
    n_params = count("n_params", n_params)
    samples = count("samples_per_rank", samples_per_rank, lo=0)
    state = count("state_bytes_per_param", state_bytes_per_param)
    if reduce_dtype not in REDUCE_BYTES:
        raise ConfigError(f"reduce_dtype={reduce_dtype!r} is not supported; allowed: {list(REDUCE_BYTES)}")
    if gpu_memory_bytes is not None and n_params * state > count("gpu_memory_bytes", gpu_memory_bytes):
        return "sharded"
    exchange = samples * exchange_bytes_per_sample(n_input_dims, n_output_dims, need_dx, exchange_dtype,
                                                   loss_at_owners)
    r = REDUCE_BYTES[reduce_dtype]
    all_reduce = n_params * (r + 4) if optimizer_split else 2 * n_params * r
    return "sharded" if exchange < all_reduce else "replicated"
