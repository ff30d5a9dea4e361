"""Sharded parts exchanging samples in 16 bits (`ShardedPart(exchange_dtype=...)`) over 2 CPU processes with
gloo: against the float32 exchange on the same batch and on the batch rounded as the link rounds it."""
from __future__ import annotations

import pytest
import torch

import tinn

import distributed_worker as W  # noqa: E402  (tests/ is on sys.path under pytest)
from test_distributed import cpu_reference, run_ranks  # noqa: E402


@pytest.fixture(scope="module")
def exchange_dtype_run(tmp_path_factory):
    # The Triton cases run the packing kernels in Triton's interpreter on the ranks' CPUs.
    return run_ranks("exchange_dtype", tmp_path_factory.mktemp("exchange_dtype"), TRITON_INTERPRET=1)


two_gpus = pytest.mark.skipif(tinn.runtime.arch() != "cuda" or torch.cuda.device_count() < 2
                              or not torch.distributed.is_nccl_available(),
                              reason="needs tinn on CUDA, two GPUs and NCCL")


@two_gpus
def test_sixteen_bit_exchange_over_nccl(tmp_path):
    """The same scenario over NCCL, one GPU per rank: the Triton kernels compiled for the GPU (their bfloat16
    rounding on the bits included) and the torch ops."""
    runs = run_ranks("exchange_dtype", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0)
    _check_exchange_dtype(runs, grad_atol=1e-6)


@cpu_reference
def test_sixteen_bit_exchange_rounds_what_crosses_the_link(exchange_dtype_run):
    """A 16-bit exchange computes what the float32 exchange computes from inputs rounded to the values' dtype
    and dy rounded to the gradients' (bfloat16 for both float16 and bfloat16), and rounds the outputs and dx it
    returns once: outputs and dx equal those of the float32 exchange on the rounded batch, rounded; table
    gradients equal theirs. Against the float32 exchange on the batch itself they differ by the dtype's
    rounding of the inputs carried through the networks."""
    _check_exchange_dtype(exchange_dtype_run)


def _check_exchange_dtype(exchange_dtype_run, grad_atol: float = 1e-7):
    from tinn.distributed.buckets import EXCHANGE_DTYPES

    for r, res in enumerate(exchange_dtype_run):
        for kernels in ("torch", "triton"):
            for owned in ("sharded", "shared"):
                tag = f"{kernels}/{owned}"
                plain = res[f"{tag}/float32"]
                for name, (values, grads) in W.EXCHANGE_DTYPES.items():
                    got, want = res[f"{tag}/{name}"], res[f"{tag}/{name}/rounded"]
                    what = f"rank {r} {tag} {name}"
                    assert got["y"].dtype == got["dx"].dtype == torch.float32, what
                    assert torch.equal(got["y"], want["y"].to(values).float()), what
                    assert torch.equal(got["dx"], want["dx"].to(grads).float()), what
                    for n, g in want["grads"].items():
                        torch.testing.assert_close(got["grads"][n], g, rtol=1e-5, atol=grad_atol, msg=f"{what} {n}")
                    # Against the unrounded batch: the inputs' and dy's rounding, carried through the networks.
                    u = 2.0 ** -8 if values == torch.bfloat16 else 2.0 ** -11
                    scale = plain["y"].abs().max()
                    assert float((got["y"] - plain["y"]).abs().max()) <= 20 * u * float(scale), what
                    assert not torch.equal(got["y"], plain["y"]), what  # the rounding is real
                    for n, g in plain["grads"].items():
                        err = float((got["grads"][n] - g).abs().max())
                        assert err <= 20 * 2.0 ** -8 * float(g.abs().max()) + 1e-7, (what, n, err)
        assert "exchange_dtype='int8' is not supported; allowed: ['float32', 'float16', 'bfloat16']" in res["bad"]
        assert res["disagree"].startswith(f"rank {r}: ranks [{1 - r}] built a different sharded model"), res["disagree"]
        assert "exchange_dtype" in res["disagree"]
    assert list(EXCHANGE_DTYPES) == ["float32", "float16", "bfloat16"]
