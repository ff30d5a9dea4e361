"""Which kernel backend tinn runs on (tinn.backend): the choice rules, the lazy import that lets
tinn.init(backend=...) decide, the error once kernels are bound, and that only tinn/backend.py imports one."""
import os
import re
import subprocess
import sys

import pytest
import torch

import tinn
from tinn import backend
from tinn.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def only(*names):
    return lambda name: name in names


@pytest.mark.parametrize("requested, env, have, python, expected", [
    ("quadrants", "taichi", ("taichi", "quadrants"), (3, 11), "quadrants"),  # the argument beats the environment
    (None, "quadrants", ("taichi", "quadrants"), (3, 11), "quadrants"),
    (None, " Taichi ", ("taichi",), (3, 12), "taichi"),
    (None, None, ("taichi", "quadrants"), (3, 13), "taichi"),   # both: taichi while it has wheels
    (None, None, ("taichi", "quadrants"), (3, 14), "quadrants"),
    (None, "auto", ("quadrants",), (3, 11), "quadrants"),      # auto with one installed: that one
    ("auto", None, ("taichi",), (3, 14), "taichi"),
])
def test_choice_rules(requested, env, have, python, expected):
    name, why = backend.resolve(requested, env, only(*have), python)
    assert name == expected and why


def test_bad_or_missing_backend_is_a_config_error():
    with pytest.raises(ConfigError, match=r"backend='cuda' \(from TINN_BACKEND\) is not supported; allowed: "
                                          r"\['taichi', 'quadrants', 'auto'\]"):
        backend.resolve(None, "cuda", only("taichi"), (3, 11))
    with pytest.raises(ConfigError, match=r"'quadrants' was asked for .* not installed; pip install 'tinn\[quadrants\]'"):
        backend.resolve("quadrants", None, only("taichi"), (3, 11))
    with pytest.raises(ConfigError, match="no kernel backend installed"):
        backend.resolve(None, None, only(), (3, 11))


def test_this_process_runs_on_the_chosen_backend():
    name = tinn.runtime.backend_name()
    assert name == backend.resolve(None, os.environ.get(backend.ENV))[0]
    assert backend.ti.__name__ == name and backend.version()[0].isdigit()


def test_init_chooses_before_kernels_and_refuses_to_switch_after():
    current = tinn.runtime.backend_name()
    other = "quadrants" if current == "taichi" else "taichi"
    script = f"""
import tinn
from tinn.errors import ConfigError
assert not tinn.backend.is_loaded(), "import tinn must not bind the kernels yet"
tinn.init(arch="cpu", backend={current!r})
from tinn.networks import NetworkArray   # defines kernels with {current}
assert tinn.runtime.backend_name() == {current!r}
tinn.init(backend={current!r})             # the same again: fine
tinn.init(backend="auto")
try:
    tinn.init(backend={other!r})
except ConfigError as e:
    print("ERROR:", e)
"""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(backend.ENV, None)
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stdout.splitlines() if x.startswith("ERROR:")]
    assert len(line) == 1
    assert f"backend={other!r} was asked for, but tinn's kernels are already defined with {current!r}" in line[0]
    assert "before creating or importing any tinn model" in line[0] and f"TINN_BACKEND={other}" in line[0]


def test_only_the_backend_module_imports_a_backend():
    pattern = re.compile(r"^\s*(import (taichi|quadrants)\b|from (taichi|quadrants)[\s.])", re.M)
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "tinn")):
        for f in files:
            path = os.path.join(folder, f)
            if f.endswith(".py") and os.path.relpath(path, ROOT) != os.path.join("tinn", "backend.py"):
                with open(path) as fh:
                    if pattern.search(fh.read()):
                        offenders.append(os.path.relpath(path, ROOT))
    assert offenders == []


def _class_checks(level):
    """(tinn's answer, Taichi's own) to "is the frame `level` up a class statement?", as the decorators ask."""
    impl = backend.ti.lang.kernel_impl
    return impl._inside_class(level + 1), impl._inside_class.original(level + 1)


def test_quick_class_check_answers_as_taichi():
    if backend.name() != "taichi" or not hasattr(backend.ti.lang.kernel_impl._inside_class, "original"):
        pytest.skip("the quick class check replaces a Taichi 1.7.4 internal only")
    assert _class_checks(1) == (False, False)   # this function's frame: an ordinary statement

    class Plain:
        answers = _class_checks(2)              # the frame running `class Plain:`

    assert Plain.answers == (True, True)
    ti = backend.ti

    @ti.data_oriented
    class Oriented:
        def __init__(self):
            self.out = torch.zeros(3, device=tinn.runtime.device())

        @ti.kernel
        def fill(self, out: ti.types.ndarray(), v: ti.f32):   # a class kernel: needs the True answer
            for i in out:
                out[i] = v

    o = Oriented()
    o.fill(o.out, 2.5)
    tinn.runtime.sync()
    assert o.out.tolist() == [2.5, 2.5, 2.5]


def test_remembered_positions_give_taichi_s_messages():
    utils = backend.ti.lang.ast.ast_transformer_utils
    if backend.name() != "taichi" or not hasattr(utils.ASTTransformerContext.get_pos_info, "original"):
        pytest.skip("remembered positions replace a Taichi 1.7.4 internal only")
    ti = backend.ti

    def message():
        @ti.kernel
        def bad(a: ti.types.ndarray()):
            for i in a:
                for j in ti.static(range(3)):
                    a[i] += j * 2.0
                    a[i] += (j +
                             undefined_name)  # noqa: F821  (the error the message reports)

        with pytest.raises(backend.compile_errors()) as info:
            bad(torch.zeros(4, device=tinn.runtime.device()))
        return str(info.value)

    remembered = [message(), message()]       # the second from what the first remembered
    context = utils.ASTTransformerContext
    patched = context.get_pos_info
    context.get_pos_info = patched.original
    try:
        taichi_own = message()
    finally:
        context.get_pos_info = patched
    assert "undefined_name" in taichi_own and "line" in taichi_own
    assert remembered == [taichi_own, taichi_own]


def test_remembered_sources_read_as_taichi_reads_them():
    kernel_impl = backend.ti.lang.kernel_impl
    if backend.name() != "taichi" or not hasattr(kernel_impl.getsourcelines, "original"):
        pytest.skip("remembered sources replace a Taichi 1.7.4 internal only")
    ti = backend.ti

    @ti.func
    def scaled(v, s):
        return v * s

    def run_and_message():
        @ti.kernel
        def good(a: ti.types.ndarray()):
            for i in a:
                for j in ti.static(range(3)):
                    a[i] += scaled(j + 1.0, 0.5)  # the func's source is read once per unrolled call

        @ti.kernel
        def bad(a: ti.types.ndarray()):
            for i in a:
                a[i] += scaled(1.0,
                               undefined_name)  # noqa: F821  (the error the message reports)

        a = torch.zeros(4, device=tinn.runtime.device())
        good(a)
        with pytest.raises(backend.compile_errors()) as info:
            bad(torch.zeros(4, device=tinn.runtime.device()))
        return a.cpu().tolist(), str(info.value)

    remembered = run_and_message()
    patched = (kernel_impl.getsourcelines, kernel_impl.getsourcefile, kernel_impl.textwrap)
    kernel_impl.getsourcelines, kernel_impl.getsourcefile = patched[0].original, patched[1].original
    kernel_impl.textwrap = patched[2]._wrapped
    try:
        taichi_own = run_and_message()
        lines, first = patched[0].original(scaled.func.func)
    finally:
        kernel_impl.getsourcelines, kernel_impl.getsourcefile, kernel_impl.textwrap = patched
    assert taichi_own[0] == [3.0] * 4 and "undefined_name" in taichi_own[1]
    assert remembered == taichi_own
    assert patched[0](scaled.func.func) == (lines, first) == patched[0](scaled.func.func)  # kept, and a fresh list
    assert patched[0](scaled.func.func)[0] is not patched[0](scaled.func.func)[0]
