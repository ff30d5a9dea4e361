"""Compile the tensor-core MLP kernels for a GPU target without a GPU: catches Triton compile errors and
shared memory beyond a block's limit before a run on the device.

    python -m benchmarks.tools.tensor_core_compile [--arch 90] [--quick]

For each shape and precision it compiles the forward (training and inference), the backward (dx and
dparams) and the backward that recomputes the forward with the loss inside (dparams) with the launchers'
options (tinn/kernels/tensor_cores/launch.py) and prints shared memory per block against the limit (227 KiB
on sm_90), and the registers and local memory (spills) per thread of the compiled binary.
Compiling takes seconds to tens of seconds per kernel. --narrow-output: the last layer's block not padded to
the hidden one (pack_weights(pad_output_to_hidden=False)).
"""
import argparse
import sys
import time


import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from benchmarks.tools.triton_compile import resource_usage  # noqa: E402
from tinn.kernels.mlp_array import MLPShape  # noqa: E402
from tinn.kernels.tensor_cores import Geometry, launch, mlp  # noqa: E402

SHARED_LIMIT = {90: 232448, 80: 166912, 89: 101376}
POINTER = {"float32": "*fp32", "tf32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16"}
# Pointer arguments in the compute dtype (the others are float32, or int32 routing arrays).
COMPUTE_POINTERS = {"w_ptr", "pre_ptr", "delta_ptr"}
INT_POINTERS = {"order_ptr", "tile_net_ptr", "tile_start_ptr", "tile_count_ptr"}
FLOATS = {"pad_value", "scale", "inv_scale", "inv_n", "lift"}


def compile_kernel(fn, constants: dict, precision: str, arch: int):
    options = {k: constants.pop(k) for k in ("num_warps", "num_stages")}
    signature = {}
    for name in fn.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in COMPUTE_POINTERS:
            signature[name] = POINTER[precision]
        elif name in INT_POINTERS:
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32"
        elif name in FLOATS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return triton.compile(ASTSource(fn, signature, constexprs=constants), target=GPUTarget("cuda", arch, 32),
                          options=options)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--quick", action="store_true", help="the benchmark's shape in every precision only")
    parser.add_argument("--narrow-output", action="store_true", help="the last layer's block not padded to the hidden")
    args = parser.parse_args()
    limit = SHARED_LIMIT.get(args.arch, 232448)
    shapes = [MLPShape(32, 64, 16, 3, 1, 0)]
    if not args.quick:
        shapes += [MLPShape(32, 128, 16, 3, 1, 0), MLPShape(3, 16, 1, 1, 0, 0), MLPShape(64, 128, 64, 4, 9, 4),
                   MLPShape(128, 128, 128, 2, 8, 5), MLPShape(128, 128, 128, 1, 0, 0)]
    failures = 0
    for shape in shapes:
        g = Geometry.of(shape, pad_output_to_hidden=not args.narrow_output)
        for precision in ("float16", "bfloat16", "tf32", "float32"):
            options = launch.launch_options(g, precision, torch.device("cuda"))
            base = launch.kernel_constants(shape, g, precision, shape.n_in, options)
            base.update(INTERPRETED=False, INTERPRETED_BF16=False, WIDE_OFFSETS=False)
            kernels = [("forward train", mlp.forward_kernel, dict(base, SAVE=True)),
                       ("forward infer", mlp.forward_kernel, dict(base, SAVE=False)),
                       ("backward", mlp.backward_kernel,
                        dict(base, WIDTH=shape.width, WANT_DX=True, WANT_PARAMS=True, LOSS=-1)),
                       ("recompute bwd", mlp.recompute_backward_kernel,
                        dict(base, WIDTH=shape.width, WANT_DX=False, WANT_PARAMS=True, LOSS=0)),
                       # a grid's feature-major output in, its gradient out (sample strides of 1, as launched)
                       ("fwd, x by feature", mlp.forward_kernel, dict(base, SAVE=False, s_x_sample=1)),
                       ("rec. bwd, dx by feature", mlp.recompute_backward_kernel,
                        dict(base, WIDTH=shape.width, WANT_DX=True, WANT_PARAMS=True, LOSS=0, s_x_sample=1,
                             s_dx_sample=1))]
            for label, fn, constants in kernels:
                t0 = time.time()
                try:
                    kernel = compile_kernel(fn, constants, precision, args.arch)
                    shared = kernel.metadata.shared
                    ok = shared <= limit
                    note = f"shared {shared:7d} B{'' if ok else ' > limit'} {resource_usage(kernel)}"
                except Exception as e:  # a compile error: report it and go on with the others
                    ok, note = False, f"compile error: {type(e).__name__}: {str(e).splitlines()[-1][:150]}"
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {str(tuple(shape)):28s} {precision:8s} BM={options.block_m:3d} "
                      f"warps={options.num_warps} stages={options.num_stages} {label:23s} {note} "
                      f"({time.time() - t0:.1f} s)", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
