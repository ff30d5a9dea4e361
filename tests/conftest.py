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


# CI installs the system packages some tests read (Vulkan for the viewer, real meshes); there a missing one
# means its install failed and must fail the run. Local runs without them skip those tests.
REQUIRE_TEST_PACKAGES = os.environ.get("TINN_REQUIRE_TEST_PACKAGES") == "1"


def missing_package(reason: str):
    """Skip the calling test for a missing system package, or fail it where TINN_REQUIRE_TEST_PACKAGES=1."""
    if REQUIRE_TEST_PACKAGES:
        pytest.fail(f"{reason}; TINN_REQUIRE_TEST_PACKAGES=1 (CI) requires it", pytrace=False)
    pytest.skip(reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "default_precision: on CUDA, build networks in the default precision "
                                       "(float16 for arrays on the tensor cores) instead of the suite's float32")
    config.addinivalue_line("markers", "needs_package(available, reason): skip without a system package "
                                       "(fail where TINN_REQUIRE_TEST_PACKAGES=1)")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_package"):
        available, reason = mark.args
        if not available:
            missing_package(reason)


@pytest.fixture
def device():
    return tinn.runtime.device()


@pytest.fixture
def tuned():
    """`tuned(name=value, ...)` installs settings and tuning (fields of either record) changed from the
    process's own for the rest of one test (what `TINN_SETTINGS` does for a whole process); restored afterwards."""
    from tinn import settings
    original = settings.installed()

    def install(**changes):
        settings.install(original.replace(**changes))

    yield install
    settings.install(original)


@pytest.fixture(autouse=True)
def sync_checks_left_on():
    """The input checks' switch is process-wide: a test (or the tool it runs) that leaves it off would let every
    later test in the process skip the checks (out-of-range ids then reach the kernels). Fail that test, and
    switch the checks back on for the next."""
    yield
    if not tinn.checks.sync_checks_enabled():
        tinn.checks._enabled["sync_checks"] = True
        pytest.fail("the test left tinn's input checks disabled (a tinn.checks.disabled() block never closed)",
                    pytrace=False)


# On CUDA the default precision of an array the tensor cores take is float16 (tinn/networks/selection.py). The
# suite's comparisons with float64 references are written for float32's accuracy, so on CUDA every test builds its
# networks in float32 unless it is marked `default_precision` (the tests of the default itself: host syncs,
# gradient scaling) or sets a precision itself (`tuned`, `precision=`). TINN_TEST_NETWORK_PRECISION=default turns
# the pin off for a whole run (to see which comparisons float16 would fail).
PIN_FLOAT32 = tinn.runtime.arch() == "cuda" and os.environ.get("TINN_TEST_NETWORK_PRECISION") != "default"


@pytest.fixture(autouse=True)
def float32_networks_on_cuda(request):
    if not PIN_FLOAT32 or request.node.get_closest_marker("default_precision") is not None:
        yield
        return
    from tinn import settings
    original = settings.installed()
    if original.settings.precision != "auto":   # the process asked for a precision itself (TINN_SETTINGS)
        yield
        return
    settings.install(original.replace(precision="float32"))
    yield
    settings.install(original)


@pytest.fixture(params=["taichi", "triton"])
def grid_path(request, tuned):
    """The lookup's and table gradient's two launch paths (`tuning.triton_grid_kernels`): Taichi's kernels, and
    Triton's (the CUDA default; its interpreter on the CPU)."""
    if request.param == "triton":
        from tinn.kernels import triton_available
        if not triton_available():
            pytest.skip("Triton is not installed")
    tuned(triton_grid_kernels=request.param == "triton")
    return request.param


def record_launches(monkeypatch, module, names) -> list:
    """Wraps the launch functions `names` of a Triton kernel module so that each call appends its name to the
    returned list (a test on a Triton path asserts that its kernels actually ran)."""
    launches = []
    for name in names:
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k: (launches.append(_n), _f(*a, **k))[1])
    return launches


@pytest.fixture
def triton_grid_launches(monkeypatch):
    """Counts the Triton grid kernels' launches by name (skips where Triton is not installed)."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    from tinn.kernels import grid_triton
    return record_launches(monkeypatch, grid_triton, ("grid_forward", "grid_backward_table"))
