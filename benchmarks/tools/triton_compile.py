"""Compile tinn's Triton kernels of the grid encoding (tinn/kernels/grid_triton.py), of a step's bookkeeping (Adam,
the gradient scaler) and of volume compositing (tinn/kernels/compositing_triton.py) for a GPU target without a GPU.

    python -m benchmarks.tools.triton_compile [--arch 90] [--families grid,adam,scaler,render]

Triton's CPU interpreter runs a kernel's Python line by line, so it accepts code the GPU compiler refuses (a
variable whose block shape differs between the branches of an `if`, for one). This compiles each kernel, the grid's
for each input-dimension count and a spread of feature counts, interpolations and hashes, down to the GPU binary
with Triton's bundled ptxas, and prints warps, shared memory, registers and local memory; a failure names the variant. Run it without
TRITON_INTERPRET (the tests start it in a process of its own). The tensor-core kernels have their own, slower
check (`benchmarks/tools/tensor_core_compile.py`).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

GRID_VARIANTS = [  # (D, F, interpolation code, hash combination)
    (2, 2, 1, 0), (3, 2, 1, 0), (4, 2, 1, 0), (3, 4, 2, 1), (2, 1, 0, 0), (3, 8, 1, 1), (2, 8, 2, 0)]
FAMILIES = ("grid", "adam", "scaler", "render", "image")


def grid_kernels():
    """(label, kernel, argument types, constexprs) of each grid kernel variant."""
    from tinn.kernels import grid_triton as g
    pointers = {"x_ptr": "*fp32", "ids_ptr": "*i32", "meta_ptr": "*i32", "factors_ptr": "*i32", "out_ptr": "*fp32",
                "dy_ptr": "*fp32", "grad_ptr": "*fp32", "row_stride": "i64",
                **{name: "i32" for name in ("n", "n_rows", "net_lo", "param_offset", "grid_type")}}
    for d, f, interp, hashing in GRID_VARIANTS:
        compact = d == 3 and f == 2  # the lookup of a compact table (bfloat16 bits in int16) once
        for kernel, block in ((g._grid_forward, {"BLOCK": g.BLOCK, "BF16": compact}),
                              (g._grid_backward_table, {"BLOCK": g.BLOCK})):
            consts = dict(D=d, F=f, INTERP=interp, H=hashing, DENSE_LIMIT=g.MAX_DENSE_BASE[d], **block)
            types = dict(pointers, table_ptr="*i16" if compact else "*fp32")
            yield (f"{kernel.__name__} D={d} F={f} interpolation={interp} hash={hashing}", kernel, types, consts)
        if f in (2, 4, 8):  # the vector reductions' variant of the table gradient
            types = dict(pointers, private_ptr="*fp32", n_private="i32", private_floats="i32", copies="i32")
            # two interpolated features: also the variant that adds corner pairs in four-word reductions
            for pairs in (False, True) if f == 2 and interp != 0 else (False,):
                consts = dict(D=d, F=f, INTERP=interp, H=hashing, DENSE_LIMIT=g.MAX_DENSE_BASE[d], BLOCK=g.BLOCK,
                              ASM=True, PAIRS=pairs)
                yield (f"_grid_backward_vector D={d} F={f} interpolation={interp} hash={hashing}"
                       f"{' pairs' if pairs else ''}", g._grid_backward_vector, types, consts)
    yield ("_sum_private", g._sum_private, {"private_ptr": "*fp32", "grad_ptr": "*fp32", "private_floats": "i32",
                                            "copies": "i32", "n_rows": "i32", "row_stride": "i64", "offset": "i32"},
           {"BLOCK": 64, "COPIES": 32})


def adam_kernels():
    from tinn.kernels import adam_triton as a
    types = {}
    for suffix in ("", "2"):
        types.update({f"{name}{suffix}_ptr": "*fp32" for name in ("w", "g", "m", "v", "lr_scale", "lr_factor")})
        types.update({f"{name}{suffix}_ptr": "*i32" for name in ("steps", "pending", "skip")})
        types.update({f"{name}{suffix}": "i32" for name in ("n", "cols", "skip_zero", "step_now")})
        types.update({f"{name}{suffix}": "fp32" for name in ("lr", "l2_reg")})
    types.update({name: "fp32" for name in ("beta1", "beta2", "epsilon", "rel_decay", "abs_decay", "clip",
                                            "grad_clip", "lower", "upper")}, programs="i32",
                 corrections_ptr="*fp32", n_corrections="i32")
    yield "adam_kernel", a.adam_kernel, types, {"BLOCK": a.BLOCK}


def render_kernels():
    from tinn.kernels import compositing_triton as c
    f32 = {f"{name}_ptr": "*fp32" for name in ("sigma", "rgb", "deltas", "t", "bg", "out_rgb", "out_opacity",
                                               "out_depth", "out_t_end", "trans_after", "t_end", "g_rgb_ray",
                                               "g_opacity", "g_depth", "g_sigma", "g_rgb", "g_deltas", "g_t")}
    types = dict(f32, offsets_ptr="*i32", n_bg_rows="i32")
    for has_t in (False, True):
        for kernel in (c._forward, c._backward):
            yield f"{kernel.__name__} HAS_T={has_t}", kernel, types, {"HAS_T": has_t, "BLOCK": c.BLOCK}


def scaler_kernels():
    from tinn.kernels import scaler_triton as s
    yield ("record_kernel", s.record_kernel, {"values_ptr": "*fp32", "found_ptr": "*fp32", "n": "i32"},
           {"BLOCK": s.BLOCK, "EXPONENT": s.EXPONENT})
    yield ("update_kernel", s.update_kernel,
           {"found_ptr": "*fp32", "scale_ptr": "*fp32", "inverse_ptr": "*fp32", "tracker_ptr": "*i32",
            "skip_ptr": "*i32", "skipped_ptr": "*i32", "growth": "fp32", "backoff": "fp32", "interval": "i32"},
           {"EXPONENT": s.EXPONENT})


def image_kernels():
    from tinn.kernels import image_sampling_triton as i
    types = {"image_ptr": "*fp32", "local_ptr": "*fp32", "target_ptr": "*fp32", "ids_ptr": "*i32", "xy_ptr": "*fp32",
             **{name: "i32" for name in ("seed", "step", "n", "height", "width", "channels", "tiles")}}
    for write_xy in (False, True):
        yield f"_sample_kernel WRITE_XY={write_xy}", i._sample_kernel, types, {"WRITE_XY": write_xy, "BLOCK": i.BLOCK}


def resource_usage(compiled) -> str:
    """Registers and local memory (spills) per thread of a compiled kernel, read from its cubin with Triton's
    bundled cuobjdump (its bundled ptxas may be older than the PTX version the compiler emits)."""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    cubin = compiled.asm.get("cubin")
    if not cubin or not os.path.exists(tool):
        return "regs ? local ?"
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    regs, local = re.search(r"REG:(\d+)", out), re.search(r"LOCAL:(\d+)", out)
    return f"regs {regs.group(1) if regs else '?':>3s} local {local.group(1) if local else '?':>4s} B"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("triton_compile compiles for the GPU: run it without TRITON_INTERPRET=1")
    families = args.families.split(",")
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        sys.exit(f"--families: {unknown} unknown; allowed: {list(FAMILIES)}")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sources = {"grid": grid_kernels, "adam": adam_kernels, "scaler": scaler_kernels, "render": render_kernels,
               "image": image_kernels}
    target = GPUTarget("cuda", args.arch, 32)
    failures = 0
    for family in families:
        for label, kernel, types, consts in sources[family]():
            missing = [name for name in kernel.arg_names if name not in consts and name not in types]
            if missing:
                failures += 1
                print(f"FAILED {label}: no type given for {missing}")
                continue
            signature = {name: "constexpr" if name in consts else types[name] for name in kernel.arg_names}
            try:
                compiled = triton.compile(ASTSource(fn=kernel, signature=signature,
                                                    constexprs={(kernel.arg_names.index(k),): v
                                                                for k, v in consts.items()}), target=target)
            except Exception as error:  # the compiler's own message names the line
                failures += 1
                print(f"FAILED {label}: {type(error).__name__}: {error}")
                continue
            meta = compiled.metadata
            vectors = ""
            if "ASM" in consts:  # kernels with inline vector reductions: how many the PTX holds
                vectors = f", vector reductions {len(re.findall(r'red[.a-z]*[.]v[24][.]f32', compiled.asm['ptx']))}"
            print(f"ok {family} {label}: {meta.num_warps} warps, {meta.shared} B shared, {resource_usage(compiled)}"
                  f"{vectors}")
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
