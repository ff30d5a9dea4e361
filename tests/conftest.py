import os

import pytest

os.environ.setdefault("TINN_ARCH", "cpu")

import torch  # noqa: E402

import tinn  # noqa: E402

tinn.init()
if tinn.runtime.arch() == "cpu":
    # Taichi's CPU kernels bring their own thread pool; torch's OpenMP threads competing with it
    # for CI's two cores made small torch ops 10x slower.
    torch.set_num_threads(1)


@pytest.fixture
def device():
    return tinn.runtime.device()
