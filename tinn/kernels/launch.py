"""A leaner launch path for the hot Taichi kernels.

Taichi 1.7.4 spends tens of microseconds of Python per launch plus more per
torch-tensor argument: it re-derives the template instance key from every
argument and re-validates every tensor through generic code. A training step of
small batches launches several kernels with dozens of tensors, so that alone can
cost more host time than the GPU work (docs/design-notes.md).

`fast_kernel(k)` wraps a `@ti.kernel` so that after the first call for a given
instance (template values plus each tensor's dtype and rank) it keeps Taichi's
compiled kernel and fills the launch context directly: pointer, size and shape
per tensor, value per scalar. The first call for a new instance goes through
Taichi's own path, which compiles and validates. It relies on Taichi internals
(`Kernel.compiled_kernels`, launch contexts), pinned to 1.7.4, the last release;
anything unexpected switches a kernel back to the normal path, and the
setting `fast_launch=False` turns it off everywhere.

Tensors must be contiguous and on the backend's device (the wrapped kernels'
callers ensure it; it is checked here, cheaply, because a wrong pointer would
not fail loudly).
"""
from __future__ import annotations

import taichi as ti
import torch
from taichi.lang import impl
from taichi.lang._ndarray import Ndarray
from taichi.types import ndarray_type, primitive_types, template

from ..settings import current as tuning

TEMPLATE, TENSOR, INT, FLOAT = range(4)


class FastKernel:
    def __init__(self, kernel):
        self.kernel = kernel
        self.primal = getattr(kernel, "_primal", None)
        self.kinds: list[int] | None = None
        self.cuda = False  # backend of the tensors' pointers, fixed at the first call (Taichi inits once)
        self.instances: dict = {}
        self.slots: list = []
        self.usable = self.primal is not None
        self.__doc__ = kernel.__doc__
        self.__name__ = getattr(kernel, "__name__", "kernel")

    def _classify(self) -> list[int] | None:
        kinds = []
        for arg in self.primal.arguments:
            anno = arg.annotation
            if isinstance(anno, template):
                kinds.append(TEMPLATE)
            elif isinstance(anno, ndarray_type.NdarrayType) and (anno.dtype is None or id(anno.dtype)
                                                                  in primitive_types.type_ids):
                kinds.append(TENSOR)
            elif anno in (primitive_types.i32, primitive_types.i64):
                kinds.append(INT)
            elif id(anno) in primitive_types.real_type_ids:
                kinds.append(FLOAT)
            else:
                return None  # matrices, structs, textures...: Taichi's path only
        return kinds

    def _key(self, args):
        # Flat tuple: per template its value, per tensor its dtype and rank, per scalar its type.
        key = []
        cuda = self.cuda
        for kind, a in zip(self.kinds, args):
            if kind == TENSOR:
                if isinstance(a, torch.Tensor):
                    if a.is_cuda != cuda or not a.is_contiguous():
                        return None  # Taichi's path copies or raises with its own message
                    key += (a.dtype, a.dim())
                elif isinstance(a, Ndarray):
                    key += ("ndarray", id(a))
                else:
                    return None
            elif kind == TEMPLATE:
                key.append(a)
            else:
                key.append(type(a))
        return tuple(key)

    def __call__(self, *args):
        if not self.usable:
            return self.kernel(*args)
        if self.kinds is None:
            if not tuning().fast_launch:  # read at the first launch, after tinn.init fixed the settings
                self.usable = False
                return self.kernel(*args)
            self.kinds = self._classify()
            self.cuda = impl.current_cfg().arch == ti.cuda
            # (Taichi's argument slot, kind, position in args) of every non-template argument.
            self.slots = [((slot,), kind, i) for slot, (i, kind) in
                          enumerate((i, k) for i, k in enumerate(self.kinds or ()) if k != TEMPLATE)]
            if self.kinds is None or len(self.kinds) != len(args):
                self.usable = False
                return self.kernel(*args)
        key = self._key(args)
        try:
            entry = self.instances.get(key) if key is not None else None
        except TypeError:  # an unhashable template value
            key = None
        if key is None:
            return self.kernel(*args)
        if entry is None:
            result = self.kernel(*args)  # compiles, validates, launches
            if self.primal.return_type is None and not self.primal.has_print:
                prog = impl.get_runtime().prog
                t_kernel = self.primal.compiled_kernels[self.primal.ensure_compiled(*args)]
                self.instances[key] = (t_kernel, prog.compile_kernel(prog.config(), prog.get_device_caps(), t_kernel))
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
        impl.get_runtime().prog.launch_kernel(compiled, ctx)
        return None


def fast_kernel(kernel) -> FastKernel:
    return FastKernel(kernel)
