"""Compile the grid encoding's Triton kernels (tinn/kernels/grid_triton.py) for a GPU target without a GPU.

    python -m benchmarks.tools.grid_compile [--arch 90]

Triton's CPU interpreter runs a kernel's Python line by line, so it accepts code the GPU compiler refuses (a
variable whose block shape differs between the branches of an `if`, for one). This compiles every kernel for each
input-dimension count, a spread of feature counts, interpolations and hashes, down to the GPU binary with Triton's
bundled ptxas, and prints warps and shared memory; a failure names the variant. Run it without
TRITON_INTERPRET (the tests start it in a process of its own).
"""
from __future__ import annotations

import argparse
import os
import sys

VARIANTS = [  # (D, F, interpolation code, hash combination)
    (2, 2, 1, 0), (3, 2, 1, 0), (4, 2, 1, 0), (3, 4, 2, 1), (2, 1, 0, 0), (3, 8, 1, 1), (2, 8, 2, 0)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("grid_compile compiles for the GPU: run it without TRITON_INTERPRET=1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tinn.kernels import grid_triton as g

    pointers = {"x_ptr": "*fp32", "ids_ptr": "*i32", "table_ptr": "*fp32", "meta_ptr": "*i32", "factors_ptr": "*i32",
                "out_ptr": "*fp32", "dy_ptr": "*fp32", "grad_ptr": "*fp32"}
    target = GPUTarget("cuda", args.arch, 32)
    failures = 0
    for d, f, interp, hashing in VARIANTS:
        compact = d == 3 and f == 2  # the lookup of a compact table (bfloat16 bits in int16) once
        for kernel, block in ((g._grid_forward, {"BLOCK": g.BLOCK, "BF16": compact}),
                              (g._grid_backward_table, {"BLOCK": g.BLOCK})):
            consts = dict(D=d, F=f, INTERP=interp, H=hashing, DENSE_LIMIT=g.MAX_DENSE_BASE[d], **block)
            types = dict(pointers, table_ptr="*i16" if compact else "*fp32")
            signature = {name: ("constexpr" if name in consts else types.get(name, "i64" if name == "row_stride"
                                                                               else "i32"))
                         for name in kernel.arg_names}
            label = f"{kernel.__name__} D={d} F={f} interpolation={interp} hash={hashing}"
            try:
                compiled = triton.compile(ASTSource(fn=kernel, signature=signature,
                                                    constexprs={(kernel.arg_names.index(k),): v
                                                                for k, v in consts.items()}), target=target)
            except Exception as error:  # the compiler's own message names the line
                failures += 1
                print(f"FAILED {label}: {type(error).__name__}: {error}")
                continue
            meta = compiled.metadata
            print(f"ok {label}: {meta.num_warps} warps, {meta.shared} B shared")
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
