"""Reading a user's per-sample Taichi function before Taichi compiles it (tinn/autodiff.py).

Two jobs, both on the function's Python source:

- `check(...)`: the rules Taichi's reverse mode relies on but does not enforce, checked where the source
  shows them. Breaking the global data access rule (writing an input array, reading an output array)
  gives silently wrong gradients; a dynamic loop with more iterations per sample than the autodiff stack
  holds crashes the process (segfault on the CPU). Both become a ConfigError that names the array or
  the loop, its line and the fix. Quadrants' reverse mode refuses dynamic loops inside a kernel's
  parallel loop unless its experimental adstack is on, so there any dynamic loop is named the same way.
- Dynamic loops whose body calls exp or tanh (or a helper function tinn cannot read): Taichi 1.7.4's
  reverse mode takes those functions' derivatives from their stored result, and inside a dynamic loop it
  stores one result, the last iteration's, so every other iteration gets a wrong gradient without any
  error. `check(..., unroll=True)` rewrites such loops (bounded, as every accepted dynamic loop is) as
  `ti.static` loops and `compile_function` builds the rewritten function; where a loop cannot be unrolled
  (break/continue) or the caller cannot take rewritten source, ConfigError names the loop and the cause.
- `tangent_source(...)`: the function's forward-mode derivative, as new Taichi source (dual numbers by
  source transformation). Taichi 1.7.4 has no forward mode on ndarrays (it fails an IR assertion) and
  cannot nest its modes, so second derivatives come from Taichi's *reverse* mode applied to this tangent
  function: <dy, J(x, p) ddx> differentiated in x and p is exactly the second-order term of the contract.
"""
from __future__ import annotations

import ast
import copy
import inspect
import itertools
import linecache
import math
import numbers
import textwrap
from dataclasses import dataclass, field

from ..errors import ConfigError

#: Taichi functions whose reverse mode (Taichi 1.7.4) multiplies the adjoint by the function's own stored
#: result (d exp(u) = exp(u) du, d tanh(u) = (1 - tanh(u)^2) du). In a dynamic loop that result is kept once,
#: not per iteration, so every iteration but the last gets a wrong derivative (docs/design-notes.md).
RESULT_DERIVATIVE_FUNCS = frozenset({"exp", "tanh"})
#: Calls whose reverse mode recomputes from the operands (per iteration correct in dynamic loops), or that
#: have no derivative. Any other call (a helper @ti.func, a ti.math function) may hide one of the above.
OPERAND_DERIVATIVE_FUNCS = frozenset({
    "sin", "cos", "sqrt", "rsqrt", "log", "abs", "asin", "acos", "atan2", "pow", "max", "min", "select",
    "floor", "ceil", "round", "cast", "i32", "i64", "f32", "f64", "float", "int", "range", "static", "sign",
    "bit_cast", "ndrange", "len"})
#: The name the rewritten source calls `ti.static` through (bound in the function's scope when compiled).
STATIC_MODULE = "_tinn_taichi"


@dataclass
class Checked:
    """What `check` found: argument names, the (possibly rewritten) function AST, the loops it unrolled and
    the dynamic loops and helper calls that remain (where only a finite-difference check can vouch)."""
    names: list[str]
    node: ast.FunctionDef
    path: str
    first: int
    unrolled: list[str] = field(default_factory=list)
    dynamic_loops: list[str] = field(default_factory=list)
    helper_calls: list[str] = field(default_factory=list)


class Unsupported(Exception):
    """The function uses a construct the tangent transformation does not know (second order only)."""


def parse(func, kind: str):
    """(ast.FunctionDef, source file, first line) of a Python or @ti.func function."""
    py = inspect.unwrap(func)
    try:
        lines, first = inspect.getsourcelines(py)
    except (OSError, TypeError) as exc:
        raise ConfigError(f"{kind}: the source of {getattr(func, '__name__', func)!r} cannot be read ({exc}); "
                          "define the function in a file (not in an interactive session or with exec)") from exc
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise ConfigError(f"{kind}: {getattr(func, '__name__', func)!r} must be a function defined with def")
    return node, inspect.getsourcefile(py) or "?", first


def arguments(node: ast.FunctionDef, expected: tuple[str, ...], kind: str, name: str) -> list[str]:
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg or a.kwarg or a.kwonlyargs or len(names) != len(expected):
        raise ConfigError(f"{kind}: {name!r} must take exactly ({', '.join(expected)}) in this order, "
                          f"got ({', '.join(names)}{', ...' if a.vararg or a.kwarg or a.kwonlyargs else ''})")
    return names


def _closure_values(func) -> dict:
    py = inspect.unwrap(func)
    values = dict(py.__globals__)
    if py.__closure__:
        for var, cell in zip(py.__code__.co_freevars, py.__closure__):
            try:
                values[var] = cell.cell_contents
            except ValueError:
                pass
    return values


def _is_static_iter(it: ast.expr) -> bool:
    """`ti.static(...)` (any module alias): unrolled at compile time, so not a loop of the compiled code."""
    return isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "static"


def _static_count(it: ast.expr, ev) -> int | None:
    """Iterations of a `ti.static(range(...))` / `ti.static(ti.ndrange(...))` loop, if known."""
    inner = it.args[0] if isinstance(it, ast.Call) and it.args else None
    if isinstance(inner, ast.Call):
        fname = inner.func.attr if isinstance(inner.func, ast.Attribute) else getattr(inner.func, "id", "")
        if fname == "range":
            return _range_count(inner, ev)
        if fname == "ndrange":
            total = 1
            for arg in inner.args:
                n = ev(arg)
                if n is None:
                    return None
                total *= int(n)
            return total
    return None


def _range_count(call: ast.Call, ev) -> int | None:
    vals = [ev(a) for a in call.args]
    if not vals or any(v is None for v in vals):
        return None
    start, stop, step = (0, vals[0], 1) if len(vals) == 1 else (vals[0], vals[1], vals[2] if len(vals) > 2 else 1)
    if step == 0:
        return None
    return max(0, math.ceil((stop - start) / step))


class _Evaluator:
    """Integer value of a loop bound, where the source fixes it: literals, Python ints of the function's
    scope, `<array>.shape[k]` of an array whose extent is known, arithmetic, min/max."""

    def __init__(self, scope: dict, shapes: dict[str, dict[int, int]]):
        self.scope, self.shapes = scope, shapes

    def __call__(self, node):
        try:
            value = self._eval(node)
        except (ZeroDivisionError, TypeError, ValueError):
            return None
        return int(value) if isinstance(value, numbers.Integral) else None

    def _eval(self, node):
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, numbers.Integral) else None
        if isinstance(node, ast.Name):
            v = self.scope.get(node.id)
            return v if isinstance(v, numbers.Integral) and not isinstance(v, bool) else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "shape" and isinstance(node.value.value, ast.Name):
            k = self._eval(node.slice)
            return self.shapes.get(node.value.value.id, {}).get(k) if k is not None else None
        if isinstance(node, ast.BinOp):
            a, b = self._eval(node.left), self._eval(node.right)
            if a is None or b is None:
                return None
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
            f = ops.get(type(node.op))
            return f() if f else None
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            fname = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if fname in ("min", "max"):
                vals = [self._eval(a) for a in node.args]
                if vals and all(v is not None for v in vals):
                    return min(vals) if fname == "min" else max(vals)
        return None


def check(func, *, kind: str, expected: tuple[str, ...], inputs: tuple[str, ...], outputs: tuple[str, ...],
          shapes: dict[str, dict[int, int]], ad_stack_size: int, static_loops_only: bool, backend: str,
          check_loops: bool = True, unroll: bool = False) -> Checked:
    """Check the function's source (see the module docstring).

    `expected` names the arguments by role; `inputs` and `outputs` are roles among them; `shapes` gives
    the known extents per role (`{"x": {1: n_in}}`) for loop bounds that read `.shape`. With `unroll`,
    dynamic loops Taichi's reverse mode gets wrong are rewritten as static loops in the returned AST
    (build it with `compile_function`); without, they are refused.
    """
    name = getattr(func, "__name__", repr(func))
    node, path, first = parse(func, kind)
    names = arguments(node, expected, kind, name)
    role = dict(zip(names, expected))
    ins = {n for n, r in role.items() if r in inputs}
    outs = {n for n, r in role.items() if r in outputs}
    arrays = ins | outs
    ev = _Evaluator(_closure_values(func), {n: shapes.get(role[n], {}) for n in names})

    def label(n: str) -> str:
        return repr(n) if n == role[n] else f"{n!r} ({role[n]})"

    def where(n) -> str:
        return f"{path}:{first + n.lineno - 1}"

    def fail(n, what: str):
        raise ConfigError(f"{kind} {name!r} {what} (line {where(n)})")

    def target_names(t):
        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
            return t.value.id, t
        return None, t

    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name) and sub.id in arrays and isinstance(sub.ctx, ast.Store):
                        fail(sub, f"rebinds its array argument {label(sub.id)}; give the value "
                                  "another name")
                array, _ = target_names(t)
                if array in ins:
                    fail(n, f"writes its input array {label(array)}: inputs are read-only, since "
                            "Taichi's reverse mode needs every value it read unchanged (global data access rule)")
                if array in outs and isinstance(n, ast.AugAssign):
                    fail(n, f"updates its output {label(array)} in place ({array}[...] "
                            f"{type(n.op).__name__} ...): that reads it back, which breaks Taichi's global data "
                            "access rule and gives wrong gradients; accumulate in a local variable and write "
                            "each output element once")
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name) \
                and n.value.id in outs:
            fail(n, f"reads its output {label(n.value.id)}: an output may only be written, once "
                    "per element (Taichi's global data access rule; reading it gives wrong gradients); keep the "
                    "value in a local variable")

    result = Checked(names, node, path, first)
    result.helper_calls = sorted({f"{_call_name(c)}() (line {where(c)})" for c in _calls(node.body)
                                  if _call_name(c) not in OPERAND_DERIVATIVE_FUNCS | RESULT_DERIVATIVE_FUNCS})

    def unroll_or_refuse(s: ast.For):
        """A dynamic loop whose body calls exp/tanh or a helper: rewrite it as a static loop, or refuse."""
        suspects = sorted({_call_name(c) for c in _calls(s.body)} - OPERAND_DERIVATIVE_FUNCS)
        if not suspects:
            return
        what = ", ".join(f"{n}()" for n in suspects)
        cause = (f"has a dynamic loop ({ast.unparse(s.iter)}) whose body calls {what}: Taichi's reverse mode of "
                 "a dynamic loop takes the derivative of a non-linear op such as exp or tanh from one stored "
                 "result, the last iteration's, and returns wrong gradients without an error")
        bounds = _range_bounds(s.iter, ev)
        if bounds is None:
            return  # the loop check below refuses an unbounded loop
        if not unroll:
            if set(suspects) & RESULT_DERIVATIVE_FUNCS:
                fail(s, f"{cause}; write it as ti.static(range(...))")
            return
        if not isinstance(s.target, ast.Name) or any(isinstance(n, (ast.Break, ast.Continue))
                                                          for n in ast.walk(s)):
            fail(s, f"{cause}; tinn unrolls such loops (ti.static) but cannot unroll one with break, continue "
                    "or a tuple target: remove them or write the loop as ti.static(range(...)) yourself")
        start, stop, step = bounds
        s.iter = ast.parse(f"{STATIC_MODULE}.static(range({start}, {stop}, {step}))", mode="eval").body
        ast.copy_location(s.iter, s)
        result.unrolled.append(where(s))

    def loops(stmts, depth_iters: int, dynamic_lines: list):
        for s in stmts:
            if isinstance(s, ast.For) and not _is_static_iter(s.iter):
                unroll_or_refuse(s)
            if isinstance(s, ast.For):
                if _is_static_iter(s.iter):
                    count = _static_count(s.iter, ev)
                    loops(s.body, depth_iters * (count or 1), dynamic_lines)
                else:
                    if static_loops_only:
                        fail(s, f"has a dynamic loop ({ast.unparse(s.iter)}): {backend}'s reverse mode takes "
                                "non static range loops inside a kernel's parallel loop only with its "
                                "experimental autodiff stack; write it as ti.static(range(...))")
                    it = s.iter
                    count = None
                    if isinstance(it, ast.Call) and getattr(it.func, "id", None) == "range":
                        count = _range_count(it, ev)
                    if count is None:
                        fail(s, f"has a dynamic loop over {ast.unparse(it)} whose trip count tinn cannot bound; "
                                "Taichi's reverse mode keeps one autodiff-stack entry per iteration and crashes "
                                "the process past the stack's size, so give range() a bound that is a literal, "
                                "a Python int of the function's scope or an array's .shape[1], or unroll it with "
                                "ti.static(range(...))")
                    total = depth_iters * count
                    lines = dynamic_lines + [where(s)]
                    result.dynamic_loops.append(where(s))
                    if total > ad_stack_size:
                        fail(s, f"runs its dynamic loop {total} times per sample (loops at {', '.join(lines)}), "
                                f"more than the autodiff stack holds (ad_stack_size={ad_stack_size}); past it "
                                "Taichi's reverse mode crashes the process. Use ti.static(range(...)) for short "
                                f"loops, or start tinn with tinn.init(ad_stack_size={1 << (total - 1).bit_length()})")
                    loops(s.body, total, lines)
                loops(s.orelse, depth_iters, dynamic_lines)
            elif isinstance(s, ast.While):
                fail(s, "has a while loop: Taichi's reverse mode cannot bound it; use a for loop over a range "
                        "with a known bound")
            elif isinstance(s, (ast.If, ast.With)):
                loops(s.body, depth_iters, dynamic_lines)
                loops(getattr(s, "orelse", []), depth_iters, dynamic_lines)

    if check_loops:
        loops(node.body, 1, [])
    return result


def _calls(stmts) -> list[ast.Call]:
    return [n for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call)]


def _call_name(c: ast.Call) -> str:
    f = c.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ast.unparse(f))


def _range_bounds(it: ast.expr, ev) -> tuple[int, int, int] | None:
    """(start, stop, step) of a `range(...)` loop whose arguments the source fixes, else None."""
    if not (isinstance(it, ast.Call) and getattr(it.func, "id", None) == "range"):
        return None
    vals = [ev(a) for a in it.args]
    if not vals or any(v is None for v in vals):
        return None
    start, stop, step = (0, vals[0], 1) if len(vals) == 1 else (vals[0], vals[1], vals[2] if len(vals) > 2 else 1)
    return None if step == 0 else (start, stop, step)


def compile_function(func, checked: Checked, ti_module):
    """The function `checked.node` describes (rewritten by `check(..., unroll=True)`) as a new Taichi
    function in `func`'s scope."""
    node = checked.node
    fname = f"{node.name}__unrolled"
    bare = copy.copy(node)
    bare.name, bare.decorator_list = fname, []
    src = ast.unparse(bare) + "\n"
    filename = f"<tinn unrolled {node.name} ({checked.path}:{checked.first})>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    scope = _closure_values(func)
    scope[STATIC_MODULE] = ti_module
    exec(compile(src, filename, "exec", dont_inherit=True), scope)  # noqa: S102 - the user's function, loops unrolled
    return ti_module.func(scope[fname])


# ---- forward mode by source transformation ---------------------------------------------------------------
_FUNCS = {  # d f(u) / du as source with {u} the argument; ti.<name> and ti.math.<name>
    "sin": "ti.cos({u})", "cos": "-ti.sin({u})", "tan": "1.0 / (ti.cos({u}) * ti.cos({u}))",
    "exp": "ti.exp({u})", "log": "1.0 / ({u})", "sqrt": "0.5 / ti.sqrt({u})", "rsqrt": "-0.5 * ti.rsqrt({u}) / ({u})",
    "tanh": "1.0 - ti.tanh({u}) * ti.tanh({u})", "abs": "ti.select({u} >= 0, 1.0, -1.0)",
    "asin": "1.0 / ti.sqrt(1.0 - ({u}) * ({u}))", "acos": "-1.0 / ti.sqrt(1.0 - ({u}) * ({u}))",
    "atan": "1.0 / (1.0 + ({u}) * ({u}))",
}
_ZERO_DERIVATIVE = {"floor", "ceil", "round", "cast", "i32", "i64", "sign", "static", "bit_cast"}


class _Tangents:
    """Builds `<name>__tangent(x, xt, p, b, net, yt)`: writes yt[b, k] = d y[b, k] along xt, p fixed."""

    def __init__(self, names: list[str]):
        self.x, self.p, self.b, self.net, self.y = names
        self.floats: set[str] = set()     # local variables with a tangent
        self.ints = {self.b, self.net}    # names known to be integral (indices)
        self.fresh = itertools.count()

    def t(self, name: str) -> str:
        return f"{name}__t"

    def expr(self, e: ast.expr) -> str | None:
        """Tangent of `e` as source, None where it is zero."""
        if isinstance(e, ast.Constant):
            return None
        if isinstance(e, ast.Name):
            return self.t(e.id) if e.id in self.floats else None
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name):
            if e.value.id == self.x:
                return f"{self.x}__t[{ast.unparse(e.slice)}]"
            if e.value.id == self.p:
                return None  # the direction moves x only
            raise Unsupported(f"reads array {e.value.id!r}")
        if isinstance(e, ast.Attribute):  # x.shape etc.
            return None
        if isinstance(e, ast.UnaryOp):
            a = self.expr(e.operand)
            if isinstance(e.op, ast.USub):
                return None if a is None else f"(-({a}))"
            if isinstance(e.op, ast.UAdd):
                return a
            return None  # not / invert: integral
        if isinstance(e, ast.BinOp):
            return self.binop(e)
        if isinstance(e, (ast.Compare, ast.BoolOp)):
            return None
        if isinstance(e, ast.IfExp):
            a, b = self.expr(e.body), self.expr(e.orelse)
            if a is None and b is None:
                return None
            return f"({a or '0.0'} if {ast.unparse(e.test)} else {b or '0.0'})"
        if isinstance(e, ast.Call):
            return self.call(e)
        raise Unsupported(f"expression {ast.unparse(e)!r}")

    def binop(self, e: ast.BinOp) -> str | None:
        u, v = ast.unparse(e.left), ast.unparse(e.right)
        du, dv = self.expr(e.left), self.expr(e.right)
        op = type(e.op)
        if du is None and dv is None:
            return None
        if op in (ast.Add, ast.Sub):
            sign = "+" if op is ast.Add else "-"
            return f"({du or '0.0'} {sign} {dv or '0.0'})"
        if op is ast.Mult:
            terms = ([f"({du}) * ({v})"] if du else []) + ([f"({u}) * ({dv})"] if dv else [])
            return "(" + " + ".join(terms) + ")"
        if op is ast.Div:  # (u / v)' = u' / v - u v' / v^2
            if du and dv:
                return f"(({du}) / ({v}) - ({u}) * ({dv}) / (({v}) * ({v})))"
            return f"(({du}) / ({v}))" if du else f"(-({u}) * ({dv}) / (({v}) * ({v})))"
        if op is ast.Pow:
            terms = []
            if du:
                terms.append(f"({v}) * ({u}) ** (({v}) - 1) * ({du})")
            if dv:
                terms.append(f"({u}) ** ({v}) * ti.log({u}) * ({dv})")
            return "(" + " + ".join(terms) + ")"
        if op in (ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift):
            return None
        raise Unsupported(f"operator {type(e.op).__name__}")

    def call(self, e: ast.Call) -> str | None:
        f = e.func
        fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if fname in _ZERO_DERIVATIVE or fname in ("int",):
            return None
        if fname == "float":
            return self.expr(e.args[0])
        if fname in _FUNCS and len(e.args) == 1:
            du = self.expr(e.args[0])
            if du is None:
                return None
            return f"({_FUNCS[fname].format(u=ast.unparse(e.args[0]))}) * ({du})"
        if fname in ("max", "min") and len(e.args) == 2:
            a, b = e.args
            da, db = self.expr(a), self.expr(b)
            if da is None and db is None:
                return None
            cmp = ">=" if fname == "max" else "<="
            return f"ti.select(({ast.unparse(a)}) {cmp} ({ast.unparse(b)}), {da or '0.0'}, {db or '0.0'})"
        if fname == "select" and len(e.args) == 3:
            da, db = self.expr(e.args[1]), self.expr(e.args[2])
            if da is None and db is None:
                return None
            return f"ti.select({ast.unparse(e.args[0])}, {da or '0.0'}, {db or '0.0'})"
        if fname == "atan2" and len(e.args) == 2:
            a, b = (ast.unparse(z) for z in e.args)
            da, db = self.expr(e.args[0]), self.expr(e.args[1])
            if da is None and db is None:
                return None
            return f"((({b}) * ({da or '0.0'}) - ({a}) * ({db or '0.0'})) / (({a}) * ({a}) + ({b}) * ({b})))"
        if all(self.expr(a) is None for a in e.args):
            return None
        raise Unsupported(f"call {ast.unparse(e.func)}()")

    def stmts(self, body: list[ast.stmt], indent: str) -> list[str]:
        out = []
        for s in body:
            out += self.stmt(s, indent)
        return out or [indent + "pass"]

    def stmt(self, s: ast.stmt, ind: str) -> list[str]:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            return []  # docstring
        if isinstance(s, ast.Pass):
            return [ind + "pass"]
        if isinstance(s, (ast.Assign, ast.AnnAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            value = s.value
            if len(targets) != 1 or value is None:
                raise Unsupported("multiple assignment")
            t = targets[0]
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == self.y:
                d = self.expr(value)
                return [f"{ind}{self.y}__t[{ast.unparse(t.slice)}] = {d or '0.0'}"]
            if not isinstance(t, ast.Name):
                raise Unsupported(f"assignment to {ast.unparse(t)}")
            d = self.expr(value)
            lines = []
            integral = _looks_integral(value, self.ints)
            if integral and t.id not in self.floats:
                self.ints.add(t.id)
            else:
                self.floats.add(t.id)
                self.ints.discard(t.id)
                lines.append(f"{ind}{self.t(t.id)} = {d or '0.0'}")
            return lines + [ind + ast.unparse(s)]
        if isinstance(s, ast.AugAssign):
            t = s.target
            if not isinstance(t, ast.Name):
                raise Unsupported(f"update of {ast.unparse(t)}")
            if t.id in self.ints:
                return [ind + ast.unparse(s)]
            whole = ast.BinOp(left=ast.Name(id=t.id, ctx=ast.Load()), op=s.op, right=s.value)
            d = self.expr(whole)
            return [f"{ind}{self.t(t.id)} = {d or '0.0'}", ind + ast.unparse(s)]
        if isinstance(s, ast.For):
            if isinstance(s.target, ast.Name):
                self.ints.add(s.target.id)
            elif isinstance(s.target, ast.Tuple):
                self.ints.update(n.id for n in s.target.elts if isinstance(n, ast.Name))
            head = f"{ind}for {ast.unparse(s.target)} in {ast.unparse(s.iter)}:"
            return [head] + self.stmts(s.body, ind + "    ")
        if isinstance(s, ast.If):
            lines = [f"{ind}if {ast.unparse(s.test)}:"] + self.stmts(s.body, ind + "    ")
            if s.orelse:
                lines += [f"{ind}else:"] + self.stmts(s.orelse, ind + "    ")
            return lines
        if isinstance(s, (ast.Break, ast.Continue)):
            return [ind + ast.unparse(s)]
        raise Unsupported(f"statement {type(s).__name__}")


def _looks_integral(e: ast.expr, ints: set[str]) -> bool:
    """An index expression (ints, int names, shapes): gets no tangent."""
    if isinstance(e, ast.Constant):
        return isinstance(e.value, int) and not isinstance(e.value, bool)
    if isinstance(e, ast.Name):
        return e.id in ints
    if isinstance(e, ast.BinOp) and not isinstance(e.op, (ast.Div, ast.Pow)):
        return _looks_integral(e.left, ints) and _looks_integral(e.right, ints)
    if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute) and e.value.attr == "shape":
        return True
    return False


def tangent_function(func, ti_module, checked: Checked | None = None):
    """`func(x, p, b, net, y)`'s forward-mode derivative as a new Taichi function
    `tangent(x, xt, p, b, net, yt)` writing yt[b, k] = sum_i dy[b, k]/dx[b, i] * xt[b, i] (p held fixed).
    With `checked` the derivative is taken of its (loop-unrolled) AST. Raises Unsupported for constructs
    it does not know."""
    node, path, first = (checked.node, checked.path, checked.first) if checked else parse(func, "AutodiffPart")
    names = [a.arg for a in node.args.posonlyargs + node.args.args]
    if len(names) != 5:
        raise Unsupported("the function must take (x, p, b, net, y)")
    x, p, b, net, y = names
    builder = _Tangents(names)
    body = builder.stmts(node.body, "    ")
    fname = f"{node.name}__tangent"
    src = "\n".join([f"def {fname}({x}: ti.template(), {x}__t: ti.template(), {p}: ti.template(), {b}, {net}, "
                     f"{y}__t: ti.template()):"] + body) + "\n"
    # Taichi reads a function's source through linecache: register the generated text under its own name.
    filename = f"<tinn tangent of {node.name} ({path}:{first})>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    scope = _closure_values(func)
    scope["ti"] = ti_module
    scope[STATIC_MODULE] = ti_module
    exec(compile(src, filename, "exec", dont_inherit=True), scope)  # noqa: S102 - source generated above from the user's function
    return ti_module.func(scope[fname]), src
