import os

import pytest

os.environ.setdefault("TINN_ARCH", "cpu")

import tinn  # noqa: E402

tinn.init()


@pytest.fixture
def device():
    return tinn.runtime.device()
