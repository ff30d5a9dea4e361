"""The one module that imports the kernel language: Taichi 1.7.4 or Quadrants, Genesis' maintained fork.

Everything else in tinn writes `from tinn.backend import ti` and uses the module as Taichi: both spell
the kernel language the same way (`ti.kernel`, `ti.types.ndarray`, `ti.simt.block`, ...).

Which one: `tinn.init(backend="taichi" | "quadrants" | "auto")`, else the environment default
`TINN_BACKEND`, else "auto": Taichi where it is installed and the Python version has Taichi wheels
(below 3.14), else Quadrants. Taichi stays the default because its numbers are the measured ones and
it has GGUI; Quadrants is what runs on Python 3.14 and later.

The module is imported on first use, not at `import tinn`: kernels are defined when tinn's kernel
modules are imported (`@ti.kernel`), and that binds them to one backend for the life of the process.
So `tinn.init(backend=...)` must come before the first model, trainer or kernel module is created or
imported; asking for another backend after that is a ConfigError that says so.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys

from .errors import ConfigError

ENV = "TINN_BACKEND"
NAMES = ("taichi", "quadrants")
CHOICES = NAMES + ("auto",)
# Taichi 1.7.4 (its last release) ships wheels for CPython 3.10-3.13 only.
TAICHI_LAST_PYTHON = (3, 13)
_INSTALL = {"taichi": "pip install 'tinn[taichi]' (Python 3.10-3.13)",
            "quadrants": "pip install 'tinn[quadrants]'"}

_state: dict = {"name": None, "module": None, "why": None}


def installed(name: str) -> bool:
    """Whether the package is importable, without importing it (importing Taichi takes a second)."""
    return importlib.util.find_spec(name) is not None


def resolve(requested: str | None = None, env: str | None = None, available=installed,
            python: tuple[int, int] | None = None) -> tuple[str, str]:
    """(backend name, why it was chosen) for a request, the environment default and what is installed.

    Pure apart from `available` (a predicate on a name), so the rules are testable without importing
    either backend.
    """
    python = python or sys.version_info[:2]
    if requested is not None:
        source, value = "tinn.init(backend=...)", requested
    elif env:
        source, value = ENV, env
    else:
        source, value = "default", "auto"
    key = str(value).strip().lower()
    if key not in CHOICES:
        raise ConfigError(f"backend={value!r} (from {source}) is not supported; allowed: {list(CHOICES)}")
    if key != "auto":
        if not available(key):
            raise ConfigError(f"backend {key!r} was asked for ({source}) but is not installed; {_INSTALL[key]}")
        return key, f"asked for by {source}"
    have = [n for n in NAMES if available(n)]
    if not have:
        raise ConfigError("no kernel backend installed: tinn needs Taichi or Quadrants; "
                          f"{_INSTALL['taichi']} or {_INSTALL['quadrants']}")
    if len(have) == 1:
        return have[0], f"auto: only {have[0]} is installed"
    if python <= TAICHI_LAST_PYTHON:
        return "taichi", "auto: both installed, taichi is the default on this Python"
    return "quadrants", f"auto: Python {python[0]}.{python[1]} is past taichi's last supported version"


def load(requested: str | None = None):
    """Import the chosen backend once and return its module; later calls return the same module.

    A request for the other backend after one was imported is a ConfigError: kernels already defined
    belong to the first one and cannot move.
    """
    if _state["module"] is not None:
        if requested is not None:
            want = str(requested).strip().lower()
            if want not in CHOICES:
                raise ConfigError(f"backend={requested!r} is not supported; allowed: {list(CHOICES)}")
            if want not in ("auto", _state["name"]):
                raise ConfigError(
                    f"backend={want!r} was asked for, but tinn's kernels are already defined with "
                    f"{_state['name']!r} ({_state['why']}); a process uses one backend. Call "
                    f"tinn.init(backend={want!r}) before creating or importing any tinn model, trainer or "
                    f"kernel module, or set {ENV}={want} in the environment")
        return _state["module"]
    name, why = resolve(requested, os.environ.get(ENV))
    module = importlib.import_module(name)
    if name == "taichi":
        _quick_class_check(module)
        _remembered_positions(module)
        _remembered_sources(module)
    _state.update(name=name, module=module, why=why)
    globals()["ti"] = module  # later `from tinn.backend import ti` finds the attribute directly
    return module


def _quick_class_check(module) -> None:
    """Make Taichi 1.7.4's per-decorator "is this inside a class body?" test cheap.

    Every `@ti.kernel` and `@ti.func` asks it, through `inspect.getframeinfo`, which maps the frame to
    its module by scanning `sys.modules` (thousands of entries once torch is imported): that made
    importing tinn's kernel modules a visible part of start-up. The replacement reads the same source
    line (the frame's current line, through linecache with the frame's globals, as `inspect.findsource`
    does) and applies Taichi's own patterns, so every decorator gets the answer it got before. Taichi
    is frozen at 1.7.4; if its internals are not the expected ones, nothing is replaced.
    """
    impl = getattr(getattr(module, "lang", None), "kernel_impl", None)
    patterns = getattr(impl, "_KERNEL_CLASS_STACKFRAME_STMT_RES", None)
    original = getattr(impl, "_inside_class", None)
    if patterns is None or original is None or getattr(original, "__code__", None) is None or \
            original.__code__.co_varnames[:1] != ("level_of_class_stackframe",):
        return
    import linecache

    def _inside_class(level_of_class_stackframe):
        try:
            frame = sys._getframe(level_of_class_stackframe)
            lines = linecache.getlines(frame.f_code.co_filename, frame.f_globals)
            if not lines:
                return False
            statement = lines[max(0, min(frame.f_lineno - 1, len(lines) - 1))].strip()  # inspect's clamp
            return any(pat.match(statement) for pat in patterns)
        except Exception:  # no source (interactive input, sourceless modules): what Taichi answers
            return False

    _inside_class.original = original
    impl._inside_class = _inside_class


def _remembered_positions(module) -> None:
    """Remember the source-position text that Taichi 1.7.4 attaches to every IR statement it builds.

    Building a kernel's IR (at its first launch in each process, even when the compiled kernel then comes
    from the offline cache) formats a "File ..., line ..." message with carets for every statement, through
    `textwrap`, and `ti.static` loops and inlined `ti.func`s visit the same source nodes many times: that
    formatting was most of the IR-building time of tinn's kernels. The text is a function of the context's
    file, function name, line offset and indent and of the node's kind, position and source lines, which
    together make the key: a repeat gets the same string, a new node goes to Taichi's own code.
    """
    utils = getattr(getattr(getattr(module, "lang", None), "ast", None), "ast_transformer_utils", None)
    context = getattr(utils, "ASTTransformerContext", None)
    original = getattr(context, "get_pos_info", None)
    if original is None or getattr(original, "__code__", None) is None or \
            original.__code__.co_varnames[:2] != ("self", "node"):
        return
    remembered: dict = {}

    def get_pos_info(self, node):
        try:
            first, last = node.lineno, node.end_lineno
            body = getattr(node, "body", None)
            key = (self.file, self.func.func.__name__, self.lineno_offset, self.indent, type(node).__name__,
                   first, last, node.col_offset, node.end_col_offset,
                   body[0].lineno if isinstance(body, list) and body else None, tuple(self.src[first - 1:last]))
        except Exception:  # anything unexpected: Taichi's own answer, not remembered
            return original(self, node)
        text = remembered.get(key)
        if text is None:
            if len(remembered) >= 1 << 16:
                remembered.clear()
            text = remembered[key] = original(self, node)
        return text

    get_pos_info.original = original
    context.get_pos_info = get_pos_info


class _RememberedText:
    """`textwrap` as Taichi's IR builder uses it, with `fill` and `dedent` remembered (pure functions of
    their arguments); everything else is the module's own."""

    def __init__(self, wrapped):
        self._wrapped = wrapped
        self.fill = functools.cache(wrapped.fill)
        self.dedent = functools.cache(wrapped.dedent)

    def __getattr__(self, attr):
        return getattr(self._wrapped, attr)


def _remembered_sources(module) -> None:
    """Remember each function's source text as Taichi 1.7.4 reads it to build IR.

    Every call of a `ti.func` inside a kernel being built reads the function's source again: `inspect`
    finds the file and tokenizes it to find the function's block, and each line then goes through
    `textwrap.fill` (tab expansion) before the text is parsed. Kernels that call the same funcs in unrolled
    loops repeat this dozens of times per instance. A function object's source does not change within a
    process, so the file name and lines are kept per function and the text functions' results per argument;
    Taichi still parses a fresh tree for every call, as before.
    """
    kernel_impl = getattr(getattr(module, "lang", None), "kernel_impl", None)
    lines_of = getattr(kernel_impl, "getsourcelines", None)
    file_of = getattr(kernel_impl, "getsourcefile", None)
    text = getattr(kernel_impl, "textwrap", None)
    if lines_of is None or file_of is None or getattr(text, "fill", None) is None or \
            getattr(lines_of, "original", None) is not None:
        return

    @functools.cache
    def kept_lines(obj):
        found, first = lines_of(obj)
        return tuple(found), first

    def getsourcelines(obj):  # a fresh list per call, as inspect gives
        found, first = kept_lines(obj)
        return list(found), first

    getsourcefile = functools.cache(file_of)
    getsourcelines.original, getsourcefile.original = lines_of, file_of
    kernel_impl.getsourcelines, kernel_impl.getsourcefile = getsourcelines, getsourcefile
    kernel_impl.textwrap = _RememberedText(text)


def name() -> str:
    """'taichi' or 'quadrants'; loads the default backend if none was chosen yet."""
    load()
    return _state["name"]


def why() -> str:
    """Why the backend in use was chosen (a request, the environment default or the auto rule)."""
    load()
    return _state["why"]


def version() -> str:
    v = getattr(load(), "__version__", "?")
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def compile_errors() -> tuple[type, ...]:
    """The backend's exception classes for a kernel that does not compile (syntax, types, unsupported)."""
    prefix = "Quadrants" if name() == "quadrants" else "Taichi"
    exceptions = load().lang.exception
    return tuple(getattr(exceptions, prefix + kind) for kind in ("CompilationError", "SyntaxError", "TypeError"))


def is_loaded() -> bool:
    return _state["module"] is not None


def __getattr__(attr: str):
    # `from tinn.backend import ti` imports the backend on first use (PEP 562), so a
    # tinn.init(backend=...) that runs before any kernel module is imported still decides.
    if attr == "ti":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
