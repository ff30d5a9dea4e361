"""The shard-or-replicate rule (tinn/distributed/strategy.py): byte counts and decisions on both sides of it."""
from __future__ import annotations

import pytest

import tinn.distributed as td
from tinn.errors import ConfigError

MLP_PARAMS = 4096 * (32 * 64 + 64 * 64 + 64 * 16)  # the MLP-only array of bench_sharded.py
GRID_PARAMS = 4096 * (73056 + 5376)  # its hash-grid array: 8-level grid + 64-wide MLP per network


def test_exchange_bytes_count_inputs_id_outputs_dy_and_optional_dx():
    assert td.exchange_bytes_per_sample(3, 4) == 4 * 4 + 4 * 4 + 4 * 4 == 48
    assert td.exchange_bytes_per_sample(32, 16) == 260
    assert td.exchange_bytes_per_sample(32, 16, need_dx=True) == 260 + 4 * 32


def test_the_trainers_step_sends_inputs_and_targets_one_way():
    """With the loss at the owners: inputs, targets and the id out, nothing back; dx or a 16-bit exchange take the
    forward and backward's exchanges."""
    assert td.exchange_bytes_per_sample(3, 4, loss_at_owners=True) == 4 * (3 + 4 + 1) == 32
    assert td.exchange_bytes_per_sample(32, 16, loss_at_owners=True) == 196
    assert td.exchange_bytes_per_sample(32, 16, need_dx=True, loss_at_owners=True) == 260 + 4 * 32
    assert td.exchange_bytes_per_sample(32, 16, exchange_dtype="float16", loss_at_owners=True) == 132
    crossover = 2 * MLP_PARAMS * 4 / 196
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) - 1, loss_at_owners=True) == "sharded"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) + 1, loss_at_owners=True) == "replicated"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) - 1) == "replicated"  # 260 B without it


def test_rule_compares_exchange_bytes_with_twice_the_reduced_parameters():
    # MLP array, 2^21 samples per rank: 545 MB exchanged against 2 x 117 MB reduced -> replicate.
    assert td.choose_strategy(MLP_PARAMS, 32, 16, 1 << 21) == "replicated"
    # The crossover: S x 260 = 2 x P x 4 at S = 903,388 (float32) and 451,694 (bfloat16) samples.
    crossover = 2 * MLP_PARAMS * 4 / 260
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) - 1) == "sharded"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) + 1) == "replicated"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) - 1, reduce_dtype="bfloat16") == "replicated"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover / 2) - 1, reduce_dtype="bfloat16") == "sharded"
    # The hash-grid array: 48 B per sample against 2.57 GB of gradients -> shard at any practical batch.
    assert td.choose_strategy(GRID_PARAMS, 3, 4, 1 << 24) == "sharded"
    assert td.choose_strategy(GRID_PARAMS, 3, 4, 1 << 26) == "replicated"
    # dx going back makes each sample dearer, so replication wins earlier.
    with_dx = int(crossover * 260 / 388) + 1
    assert td.choose_strategy(MLP_PARAMS, 32, 16, with_dx, need_dx=True) == "replicated"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, with_dx) == "sharded"


def test_state_larger_than_the_gpu_is_sharded_whatever_the_bytes():
    state = 16 * MLP_PARAMS
    assert td.choose_strategy(MLP_PARAMS, 32, 16, 1 << 24, gpu_memory_bytes=state) == "replicated"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, 1 << 24, gpu_memory_bytes=state - 1) == "sharded"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, 1 << 24, gpu_memory_bytes=state, state_bytes_per_param=17) \
        == "sharded"


@pytest.mark.parametrize("kwargs,field", [
    (dict(n_params=0), "n_params"), (dict(samples_per_rank=-1), "samples_per_rank"),
    (dict(reduce_dtype="int8"), "reduce_dtype"), (dict(gpu_memory_bytes=0), "gpu_memory_bytes"),
    (dict(n_input_dims=1.5), "n_input_dims"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    args = {"n_params": MLP_PARAMS, "n_input_dims": 32, "n_output_dims": 16, "samples_per_rank": 1 << 20, **kwargs}
    with pytest.raises(ConfigError, match=field):
        td.choose_strategy(**args)


def test_sixteen_bit_exchange_and_split_optimizer_bytes():
    # 16-bit rows: 32 inputs + the 4-byte id, 16 outputs back, 16 dy out (bfloat16 also for float16 values).
    assert td.exchange_bytes_per_sample(32, 16, exchange_dtype="float16") == 2 * 32 + 4 + 2 * 16 + 2 * 16 == 132
    assert td.exchange_bytes_per_sample(32, 16, exchange_dtype="bfloat16") == 132
    assert td.exchange_bytes_per_sample(32, 16, need_dx=True, exchange_dtype="float16") == 132 + 2 * 32
    assert td.exchange_bytes_per_sample(3, 4, exchange_dtype="bfloat16") == 2 * 4 + 4 + 8 + 8  # 3 inputs padded to 4
    with pytest.raises(ConfigError, match=r"exchange_dtype='int8'.*'float32', 'float16', 'bfloat16'"):
        td.exchange_bytes_per_sample(3, 4, exchange_dtype="int8")
    # Halving the exchange's bytes moves the crossover with the float32 all-reduce to twice the samples.
    crossover = 2 * MLP_PARAMS * 4 / 132
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) - 1, exchange_dtype="float16") == "sharded"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(crossover) + 1, exchange_dtype="float16") == "replicated"
    # The split optimizer's bytes: a bfloat16 reduce-scatter and a float32 all-gather, P x 6 against 2 P x 2.
    split = MLP_PARAMS * (2 + 4) / 260
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(split) - 1, reduce_dtype="bfloat16",
                              optimizer_split=True) == "sharded"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(split) + 1, reduce_dtype="bfloat16",
                              optimizer_split=True) == "replicated"
    assert td.choose_strategy(MLP_PARAMS, 32, 16, int(split) - 1, reduce_dtype="bfloat16") == "replicated"
