import os

import pytest

os.environ.setdefault("TINN_ARCH", "cpu")
if os.environ["TINN_ARCH"] == "cpu":
    # Without a GPU, Triton's kernels (the tensor-core MLP path) run in its interpreter, at toy sizes; it reads
    # this when a kernel is defined, so before anything imports them.
    os.environ.setdefault("TRITON_INTERPRET", "1")

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


@pytest.fixture
def tuned():
    """`tuned(name=value, ...)` installs settings changed from the process's own for the rest of one test
    (what `TINN_SETTINGS` does for a whole process); restored afterwards."""
    from tinn import settings
    original = settings.current()

    def install(**changes):
        settings.install(original.replace(**changes))

    yield install
    settings.install(original)
