"""A leaner launch path for the hot kernels, on Taichi 1.7.4 and on Quadrants.

Taichi 1.7.4 spends tens of microseconds of Python per launch and more per torch-tensor
argument (docs/design-notes.md has the numbers): it re-derives the template instance key
from every argument and re-validates every tensor through generic code. The
image-learning step launches several kernels with dozens of tensors, so that alone
can cost more host time than the GPU work (docs/design-notes.md). Quadrants caches launch
contexts, but not for torch tensors, which is all tinn passes.

`fast_kernel(k)` wraps a `@ti.kernel` so that after the first call for a given
instance (template values plus each tensor's dtype and rank) it keeps the
backend's compiled kernel and fills the launch context directly: pointer, size
and shape per tensor, value per scalar. The first call for a new instance goes
through the backend's own path, which compiles and validates.

This relies on internals, which differ between the two backends (see `_Taichi` and
`_Quadrants`). Before the first lean launch, `internals()` checks that what it
needs is there and launches a tiny kernel both ways, comparing the results; if
anything is missing or differs, every kernel keeps the standard launch and one
warning names what was missing. The setting `fast_launch=False` turns the lean path off.

`fast_kernel(ir_passes=False)` also compiles a kernel's instances without the backend's own IR passes (see
`_ir_passes` and tuning.ir_optimization): the first call of an instance is where it compiles.

The backend compiles an instance from the arguments of its first call and keeps them referenced for the
life of the process (Taichi 1.7.4's compile context holds them in the AST generator the compiled kernel
keeps). A gradient buffer a backward kernel wrote on its first call would then stay referenced, and torch
autograd, which adopts a returned gradient as `.grad` only when nothing else holds it, copies it instead:
a third table-sized buffer on the first backward. So every new instance compiles from stand-ins (one
element per tensor, same dtype, rank and grad flag) before the real call: `compile_from_stand_ins`, also
used for kernels outside this wrapper (tinn/autodiff.py).

Tensors must be contiguous and on the backend's device (the wrapped kernels'
callers ensure it; it is checked here, cheaply, because a wrong pointer would
not fail loudly).
"""

import contextlib
import importlib
import warnings

import torch

from .. import backend
from ..backend import ti

from ..settings import current_tuning as tuning

TEMPLATE, TENSOR, INT, FLOAT = range(4)


class _Internals:
    """What both backends share: `lang.impl` (runtime, config), `lang._ndarray.Ndarray`, the annotation types."""

    def __init__(self):
        lang, types = _require(ti, "lang"), _require(ti, "types")
        self.impl = _require(lang, "impl")
        self.Ndarray = _require(_require(lang, "_ndarray"), "Ndarray")
        self.ndarray_type = _require(types, "ndarray_type")
        self.primitive_types = _require(types, "primitive_types")
        self.template = _require(types, "template")
        for owner, attr in ((self.impl, "get_runtime"), (self.impl, "current_cfg"), (self.ndarray_type, "NdarrayType"),
                            (self.primitive_types, "type_ids"), (self.primitive_types, "real_type_ids")):
            _require(owner, attr)


class _Taichi(_Internals):
    """Taichi 1.7.4: `Kernel.arguments`, tuple argument slots, `compiled_kernels[key]`, `prog.compile_kernel`."""

    def annotations(self, primal):
        return [arg.annotation for arg in _require(primal, "arguments")]

    def is_template(self, anno) -> bool:
        return isinstance(anno, self.template)

    def slot(self, index: int):
        return (index,)

    def compiled(self, primal, args):
        _require(primal, "compiled_kernels")
        prog = self.impl.get_runtime().prog
        t_kernel = primal.compiled_kernels[primal.ensure_compiled(*args)]
        return t_kernel, prog.compile_kernel(prog.config(), prog.get_device_caps(), t_kernel)

    def prepare(self, primal, ctx) -> None:
        pass


class _Quadrants(_Internals):
    """Quadrants: `Kernel.arg_metas`, integer argument slots, `materialized_kernels[key]` and
    `compiled_kernel_data_by_key[key]` (filled by the first standard call), graph kernels."""

    def __init__(self):
        super().__init__()
        # `<backend>.lang.kernel` the attribute is the decorator; the module holds the graph switch.
        module = importlib.import_module(f"{backend.name()}.lang.kernel")
        self.graph_enabled = bool(getattr(module, "_GRAPH_ENABLED", True))

    def annotations(self, primal):
        if getattr(primal, "use_checkpoints", False) or getattr(primal, "graph_do_while_levels", None):
            raise LookupError("checkpoint / graph_do_while kernels: standard launch only")
        return [meta.annotation for meta in _require(primal, "arg_metas")]

    def is_template(self, anno) -> bool:
        return anno is self.template or isinstance(anno, self.template)

    def slot(self, index: int):
        return index

    def compiled(self, primal, args):
        key = primal.ensure_compiled(*args)
        return _require(primal, "materialized_kernels")[key], _require(primal, "compiled_kernel_data_by_key")[key]

    def prepare(self, primal, ctx) -> None:
        # What the standard launch sets: a graph=True kernel replays its CUDA graph.
        ctx.use_graph = bool(getattr(primal, "use_graph", False)) and self.graph_enabled


def _require(owner, attr):
    if not hasattr(owner, attr):
        raise LookupError(f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}")
    return getattr(owner, attr)


_internals: dict = {"checked": False, "adapter": None, "missing": None}


def internals():
    """The backend adapter if the lean path works here, else None (after one warning)."""
    if _internals["checked"]:
        return _internals["adapter"]
    _internals["checked"] = True
    if not tuning().fast_launch:  # asked at the first launch, after tinn.init fixed the settings
        return None
    try:
        adapter = (_Quadrants if backend.name() == "quadrants" else _Taichi)()
        _self_test(adapter)
    except Exception as exc:  # anything at all: the standard launch always works
        what = f"{type(exc).__name__}: {exc}" if not isinstance(exc, LookupError) else f"missing {exc}"
        _internals["missing"] = what
        warnings.warn(f"tinn: fast kernel launch is off on {backend.name()} {backend.version()} ({what}); "
                      "kernels use the backend's standard launch, which is correct but slower per launch",
                      RuntimeWarning, stacklevel=3)
        return None
    _internals["adapter"] = adapter
    return adapter


_annotation_reader: dict = {}


def _reader():
    """The backend adapter used to read a kernel's annotations (no launch self-test needed for that)."""
    if "adapter" not in _annotation_reader:
        try:
            _annotation_reader["adapter"] = (_Quadrants if backend.name() == "quadrants" else _Taichi)()
        except LookupError:
            _annotation_reader["adapter"] = None
    return _annotation_reader["adapter"]


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    s = torch.zeros((1,) * t.dim(), dtype=t.dtype, device=t.device)
    return s.requires_grad_(True) if t.requires_grad else s


def compile_from_stand_ins(kernel, args) -> None:
    """Compile `kernel`'s instance for `args` (a `@ti.kernel`, its `.grad`, or a backend Kernel) from
    stand-in tensors, so that the compile context, which the backend keeps, references those and not the
    caller's buffers (see the module's notes). Does nothing where the annotations cannot be read; the
    later real call then compiles as before."""
    primal = getattr(kernel, "_primal", kernel)
    adapter = _reader()
    # Taichi keeps the first call's arguments in its compile context; Quadrants' ensure_compiled needs state its
    # own launch sets first (1.3: `raise_on_templated_floats`), so there the real call compiles, as before.
    if adapter is None or not hasattr(primal, "ensure_compiled") or backend.name() != "taichi":
        return
    try:
        annotations = adapter.annotations(primal)
    except LookupError:
        return
    if len(annotations) != len(args):
        return
    key, stand_ins = [], []
    for anno, a in zip(annotations, args):
        tensor = isinstance(anno, adapter.ndarray_type.NdarrayType) and isinstance(a, torch.Tensor)
        key.append((a.dtype, a.dim(), a.device, a.requires_grad) if tensor else
                   a if adapter.is_template(anno) else type(a))
        stand_ins.append(_stand_in(a) if tensor else a)
    seen = primal.__dict__.setdefault("_tinn_stand_in_keys", set())
    try:
        if tuple(key) in seen:
            return
    except TypeError:  # an unhashable template value: leave it to the real call
        return
    primal.ensure_compiled(*stand_ins)
    seen.add(tuple(key))


F2 = ti.types.ndarray(dtype=ti.f32, ndim=2)
I1 = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def _probe(a: F2, b: F2, rows: I1, s: ti.i32, v: ti.f32, n: ti.template()):
    for i, j in a:
        a[i, j] += b[rows[i], j] * v + s * n


def _self_test(adapter) -> None:
    """The lean path on a tiny kernel must write what the standard launch writes."""
    from .. import runtime
    dev = runtime.device()
    gen = torch.Generator().manual_seed(7)
    a = torch.rand(5, 3, generator=gen).to(dev)
    b = torch.rand(4, 3, generator=gen).to(dev)
    rows = torch.tensor([3, 0, 2, 1, 3], dtype=torch.int32, device=dev)
    fast = FastKernel(_probe, adapter)
    expected = a.clone()
    _probe(expected, b, rows, 2, 0.5, 3)
    fast(a.clone(), b, rows, 2, 0.5, 3)  # first call: the standard path, keeps the instance
    if not fast.instances:
        raise fast.failure or LookupError("a compiled instance after the first launch")
    lean = a.clone()
    fast(lean, b, rows, 2, 0.5, 3)
    runtime.sync()
    if not torch.equal(lean, expected):
        raise RuntimeError("self-test: the lean launch wrote other values than the standard launch")


@contextlib.contextmanager
def _ir_passes(wanted: bool | None):
    """The backend's own IR optimisation passes on or off while a kernel instance compiles (its config is
    read at compile time; instances compiled since keep what they were compiled with)."""
    # Declarations hold on Taichi 1.7.4, where they were measured; Quadrants (another LLVM) keeps its default
    # until measured there.
    if wanted is None or tuning().ir_optimization is not None or backend.name() != "taichi":
        yield
        return
    config = ti.lang.impl.current_cfg()
    before = config.advanced_optimization
    config.advanced_optimization = wanted
    try:
        yield
    finally:
        config.advanced_optimization = before


class FastKernel:
    def __init__(self, kernel, adapter=None, ir_passes: bool | None = None):
        self.kernel = kernel
        # False: compiled without the backend's IR passes where tuning.ir_optimization is None (auto); None:
        # the process default.
        self.ir_passes = ir_passes
        self.primal = getattr(kernel, "_primal", None)
        self.adapter = adapter  # None: asks `internals()` at the first call
        self.kinds: list[int] | None = None
        self.cuda = False  # backend of the tensors' pointers, fixed at the first call (the backend inits once)
        self.instances: dict = {}
        self.slots: list = []
        self.usable = self.primal is not None
        self.failure: Exception | None = None  # why this kernel went back to the standard path
        self.__doc__ = kernel.__doc__
        self.__name__ = getattr(kernel, "__name__", "kernel")

    def _classify(self) -> list[int] | None:
        a = self.adapter
        kinds = []
        for anno in a.annotations(self.primal):
            if a.is_template(anno):
                kinds.append(TEMPLATE)
            elif isinstance(anno, a.ndarray_type.NdarrayType) and (anno.dtype is None or id(anno.dtype)
                                                                    in a.primitive_types.type_ids):
                kinds.append(TENSOR)
            elif anno in (a.primitive_types.i32, a.primitive_types.i64):
                kinds.append(INT)
            elif id(anno) in a.primitive_types.real_type_ids:
                kinds.append(FLOAT)
            else:
                return None  # matrices, structs, textures...: the standard path only
        return kinds

    def _key(self, args):
        # Flat tuple: per template its value, per tensor its dtype and rank, per scalar its type.
        key = []
        cuda = self.cuda
        ndarray = self.adapter.Ndarray
        for kind, a in zip(self.kinds, args):
            if kind == TENSOR:
                if isinstance(a, torch.Tensor):
                    if a.is_cuda != cuda or not a.is_contiguous():
                        return None  # the standard path copies or raises with its own message
                    key += (a.dtype, a.dim())
                elif isinstance(a, ndarray):
                    key += ("ndarray", id(a))
                else:
                    return None
            elif kind == TEMPLATE:
                key.append(a)
            else:
                key.append(type(a))
        return tuple(key)

    def _setup(self, args) -> bool:
        if self.adapter is None:
            self.adapter = internals()
            if self.adapter is None:
                return False
        try:
            self.kinds = self._classify()
        except LookupError as exc:
            self.kinds, self.failure = None, exc
        if self.kinds is None or len(self.kinds) != len(args):
            return False
        self.cuda = self.adapter.impl.current_cfg().arch == ti.cuda
        # (argument slot, kind, position in args) of every non-template argument.
        self.slots = [(self.adapter.slot(slot), kind, i) for slot, (i, kind) in
                      enumerate((i, k) for i, k in enumerate(self.kinds) if k != TEMPLATE)]
        return True

    def _standard(self, *args):
        """The backend's own call: compiles a new instance (from stand-ins), validates, launches."""
        with _ir_passes(self.ir_passes):
            compile_from_stand_ins(self.kernel, args)
            return self.kernel(*args)

    def __call__(self, *args):
        if not self.usable:
            return self._standard(*args)
        if self.kinds is None and not self._setup(args):
            self.usable = False
            return self._standard(*args)
        key = self._key(args)
        try:
            entry = self.instances.get(key) if key is not None else None
        except TypeError:  # an unhashable template value
            key = None
        if key is None:
            return self._standard(*args)
        if entry is None:
            result = self._standard(*args)
            if self.primal.return_type is None and not self.primal.has_print:
                try:
                    with _ir_passes(self.ir_passes):
                        self.instances[key] = self.adapter.compiled(self.primal, args)
                except (LookupError, AttributeError) as exc:
                    self.failure, self.usable = exc, False
            else:
                self.usable = False
            return result
        t_kernel, compiled = entry
        ctx = t_kernel.make_launch_context()
        for slot, kind, i in self.slots:
            a = args[i]
            if kind == TENSOR:
                if isinstance(a, torch.Tensor):  # shape as torch.Size: pybind takes the tuple as it is
                    ctx.set_arg_external_array_with_shape(slot, a.data_ptr(), a.nbytes, a.shape, 0)
                else:
                    ctx.set_arg_ndarray(slot, a.arr)
            elif kind == INT:
                ctx.set_arg_int(slot, int(a))
            else:
                ctx.set_arg_float(slot, float(a))
        self.adapter.prepare(self.primal, ctx)
        self.adapter.impl.get_runtime().prog.launch_kernel(compiled, ctx)
        return None


def fast_kernel(kernel=None, *, ir_passes: bool | None = None):
    """`@fast_kernel` or `@fast_kernel(ir_passes=False)` over a `@ti.kernel`. ir_passes=False: a kernel
    measured as fast without the backend's own IR optimisation passes, which take most of its compile time
    (the unrolled MLP kernels; docs/design-notes.md), compiles without them unless tuning.ir_optimization
    says otherwise for every kernel."""
    if kernel is None:
        return lambda k: FastKernel(k, ir_passes=ir_passes)
    return FastKernel(kernel, ir_passes=ir_passes)
