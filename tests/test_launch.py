"""The lean launch path (tinn.kernels.launch) gives the same results as Taichi's own launch, falls back to it
for anything it does not take, and keeps Taichi's error messages."""
import pytest
from tinn.backend import ti
import torch

import tinn
from tinn.kernels.launch import FastKernel, fast_kernel

F2 = ti.types.ndarray(dtype=ti.f32, ndim=2)
I1 = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def _mixed(a: F2, b: F2, rows: I1, s: ti.i32, v: ti.f32, n: ti.template(), flip: ti.template()):
    for i, j in a:
        w = b[rows[i], j] * v + s * n
        if ti.static(flip):
            w = -w
        a[i, j] += w


def _args(seed):
    dev = tinn.runtime.device()
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(5, 3, generator=gen).to(dev)
    b = torch.rand(7, 3, generator=gen).to(dev)
    rows = torch.randint(0, 7, (5,), generator=gen, dtype=torch.int32).to(dev)
    return a, b, rows


@pytest.mark.parametrize("template_values", [(3, False), (2, True)])
def test_fast_launch_matches_taichi_launch(template_values):
    fast = fast_kernel(_mixed)
    for call in range(3):  # first call compiles through Taichi, later ones take the lean path
        a, b, rows = _args(call)
        expected = a.clone()
        _mixed(expected, b, rows, 4, 0.25, *template_values)
        fast(a, b, rows, 4, 0.25, *template_values)
        assert torch.equal(a, expected)
        manual = _args(call)[0] + (b[rows.long()] * 0.25 + 4 * template_values[0]) * (-1 if template_values[1] else 1)
        assert torch.allclose(a, manual)
    assert fast.usable and len(fast.instances) == 1


def test_fast_launch_keeps_one_instance_per_template_and_dtype():
    fast = FastKernel(_mixed)
    a, b, rows = _args(0)
    fast(a, b, rows, 1, 1.0, 1, False)
    fast(a, b, rows, 1, 1.0, 2, False)
    fast(a, b, rows, 1, 1.0, 2, False)
    assert len(fast.instances) == 2


def test_fast_launch_falls_back_with_taichi_errors():
    fast = fast_kernel(_mixed)
    a, b, rows = _args(0)
    fast(a, b, rows, 1, 1.0, 1, False)
    with pytest.raises(ValueError, match="Non contiguous"):
        fast(torch.rand(3, 5, device=a.device).t(), b, rows, 1, 1.0, 1, False)
    with pytest.raises(Exception):
        fast(a, b, rows)  # missing arguments: Taichi's own message


def test_fast_launch_takes_taichi_ndarrays():
    @ti.kernel
    def add_table(a: F2, table: ti.types.ndarray(dtype=ti.i32, ndim=2)):
        for i, j in a:
            a[i, j] += table[0, j]

    table = ti.ndarray(dtype=ti.i32, shape=(1, 3))
    table.from_numpy(__import__("numpy").array([[1, 2, 3]], dtype="int32"))
    fast = fast_kernel(add_table)
    a = torch.zeros(4, 3, device=tinn.runtime.device())
    for _ in range(3):
        fast(a, table)
    assert torch.equal(a.cpu(), torch.tensor([[3.0, 6.0, 9.0]]).expand(4, 3))


def test_lean_path_checked_its_backend_internals():
    from tinn.kernels import launch
    adapter = launch.internals()
    assert adapter is not None, launch._internals["missing"]
    expected = launch._Quadrants if tinn.runtime.backend_name() == "quadrants" else launch._Taichi
    assert type(adapter) is expected


def test_missing_internals_fall_back_with_one_warning(monkeypatch):
    from tinn.kernels import launch
    real = launch._Quadrants if tinn.runtime.backend_name() == "quadrants" else launch._Taichi

    class Broken(real):
        def annotations(self, primal):
            raise LookupError("Kernel.arguments")

    monkeypatch.setattr(launch, real.__name__, Broken)
    monkeypatch.setattr(launch, "_internals", {"checked": False, "adapter": None, "missing": None})
    with pytest.warns(RuntimeWarning, match=r"fast kernel launch is off on (taichi|quadrants) .*missing Kernel.arguments"):
        assert launch.internals() is None
    fast = fast_kernel(_mixed)
    for call in range(2):
        a, b, rows = _args(call)
        expected = a.clone()
        _mixed(expected, b, rows, 4, 0.25, 3, False)
        fast(a, b, rows, 4, 0.25, 3, False)  # standard launch, no second warning
        assert torch.equal(a, expected)
    assert not fast.usable and not fast.instances


@ti.kernel
def _scaled(a: F2, b: F2, rows: I1, s: ti.i32, v: ti.f32, n: ti.template(), flip: ti.template()):
    # its own kernel: _mixed's instances are compiled by the tests above, under the process default
    for i, j in a:
        a[i, j] = b[rows[i], j] * v * n + s


def _compile_flag_spy(seen):
    from tinn.kernels.launch import ti as backend_ti

    def kernel(*args):
        seen.append(backend_ti.lang.impl.current_cfg().advanced_optimization)
    return kernel


@pytest.mark.parametrize("setting, declared, expected", [
    (None, False, False),   # auto: the kernel's own declaration
    (None, None, True),     # auto, undeclared: the process default (the passes run)
    (True, False, True),    # an explicit setting holds for every kernel
    (False, None, False),
])
def test_ir_passes_follow_the_kernel_declaration_under_auto(tuned, setting, declared, expected):
    from tinn.kernels.launch import ti as backend_ti
    tuned(ir_optimization=setting)
    config = backend_ti.lang.impl.current_cfg()
    before = config.advanced_optimization
    if setting is not None:  # what tinn.init sets for the process under an explicit setting
        config.advanced_optimization = setting
    try:
        seen = []
        fast = FastKernel(_compile_flag_spy(seen), ir_passes=declared)
        fast(1)
        fast(2)
        if setting is None and tinn.runtime.backend_name() != "taichi":
            expected = before  # declarations hold where they were measured (Taichi)
        assert seen == [expected, expected]
        assert config.advanced_optimization == (before if setting is None else setting)  # restored
    finally:
        config.advanced_optimization = before


def test_kernel_compiled_without_ir_passes_matches_taichi_launch(tuned):
    tuned(ir_optimization=None)
    fast = fast_kernel(ir_passes=False)(_scaled)
    for call in range(3):
        a, b, rows = _args(call)
        expected = b[rows.long()] * 0.5 * 3 + 2
        fast(a, b, rows, 2, 0.5, 3, False)
        assert torch.allclose(a, expected)
    assert fast.usable and len(fast.instances) == 1
