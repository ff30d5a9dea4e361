"""Tensor-core (Triton) MLP-array kernels on a GPU: correctness of every path against float64, and timings
against torch's batched GEMMs.

    python3 -m benchmarks.tools.tensor_core_check --quick        (about a minute)
    python3 -m benchmarks.tools.tensor_core_check                (checks and timings in full)
    python3 -m benchmarks.tools.tensor_core_check --part check   (or --part bench: one half only)

Checks: out, dx and dparams of tinn/kernels/tensor_cores against a float64 reference (per network, torch
autograd) for every precision, every activation (hidden and output), widths 1..128, no hidden layer, odd
input and output counts, tcnn's padding, feature-major input, even and ragged routing (with empty networks),
each of dx / dparams alone, float16 with a tiny dy (the gradient scale), batch 0. Prints a pass/fail table.

Timings (CUDA events, median of the repetitions after warm-up), 2^22 samples, 32 inputs, two hidden layers,
16 outputs, ReLU, 4096 and 64 networks of width 64 (and 128 in full), even and ragged routing:
the kernels' inference, training forward, backward, and a step (pack + route + forward + backward) in each
precision; against torch.bmm on samples already grouped by network (padded to the largest network's count)
in float32, with TF32, under autocast float16, and torch._grouped_mm in bfloat16 (<= 1024 groups, no padding),
inference and forward + backward (autograd). Writes out/tensor_core_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

import torch  # noqa: E402

import tinn  # noqa: E402
from tinn.activations import ACTIVATIONS  # noqa: E402
from tinn.networks import NetworkArray  # noqa: E402
from tinn.routing import route_fused  # noqa: E402

from benchmarks.common import gpu_ms  # noqa: E402
from benchmarks.loading import load_file  # noqa: E402

activation = load_file("tests/reference.py").activation
emulated = load_file("tests/tensor_core_reference.py").emulated

PRECISIONS = ("float16", "bfloat16", "tf32", "float32")
# Relative errors (norm) allowed against the float64 model of the kernels' rounding (tests/tensor_core_reference.py;
# TF32 is modelled as float32) and against exact float64, which the 16-bit precisions miss by their rounding
# (amplified in dx and dparams where a ReLU mask flips).
# TF32 rounds its operands to float16's 10 mantissa bits, which the float32 model does not: it is held to float16's
# bound against exact float64 both ways (a rounded pre-activation flips ReLU masks as in float16).
TOL = {"float32": 1e-5, "tf32": 5e-2, "float16": 5e-3, "bfloat16": 2e-2}
TOL_EXACT = {"float32": 1e-5, "tf32": 5e-2, "float16": 5e-2, "bfloat16": 1.5e-1}
ACTS = list(ACTIVATIONS)
TILE, CHUNK = 128, 1024
DEVICE = "cuda"


# ---- float64 reference -----------------------------------------------------------------------------------
def reference(net, x, ids, dy, hidden: str, output: str):
    """(out, dx, dparams) in float64: each network's samples through its weights, torch autograd."""
    p = net.params.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    if not x.shape[0]:
        return x64.new_zeros(0, net.n_output_dims), torch.zeros_like(x64), torch.zeros_like(p)
    n_pad, value = net.input_padding
    h_all = torch.cat([x64, x64.new_full((x64.shape[0], n_pad), value)], 1) if n_pad else x64
    order = torch.argsort(ids.long(), stable=True)
    counts = torch.bincount(ids.long(), minlength=net.n_networks).tolist()
    pieces, first = [], 0
    for n, c in enumerate(counts):
        if not c:
            continue
        h = h_all[order[first:first + c]]
        for l in range(net.n_layers):
            w = net.weights(l, p)[n]
            h = activation(output if l == net.n_layers - 1 else hidden, h @ w.t())
        pieces.append(h[:, :net.n_output_dims])
        first += c
    y = torch.cat(pieces)[torch.argsort(order)] if pieces else x64.new_zeros(0, net.n_output_dims)
    y.backward(dy.double())
    return y.detach(), x64.grad, p.grad


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def make_ids(kind: str, batch: int, n_networks: int, gen) -> torch.Tensor:
    if kind == "even" or batch == 0:
        ids = torch.arange(batch) % n_networks
    else:  # ragged: uneven counts, every 7th network empty, shuffled
        weights = torch.rand(n_networks, generator=gen) ** 3 + 0.01
        weights[::7] = 0.0
        ids = torch.multinomial(weights, batch, replacement=True, generator=gen)
    return ids.to(torch.int32).to(DEVICE)


# ---- correctness ---------------------------------------------------------------------------------------
def check_case(tc, name, precision, *, n_in=32, n_out=16, width=64, hidden_layers=2, hidden="ReLU", output="None",
               n_networks=24, batch=1 << 16, ids="ragged", feature_major=False, input_padding=None,
               output_padding=0, want_dx=True, want_params=True, dy_scale=1e-3, gradient_scale=None, seed=0,
               pad_output_to_hidden=True, x_scale=1.0):
    """One case: a row of the table with its relative errors and verdict. dy_scale: dy's size (a loss
    gradient's; float16's default gradient scale 128 times a unit dy overflows float16 in Exponential layers).
    x_scale: the inputs' range, [-x_scale, x_scale]."""
    gen = torch.Generator().manual_seed(seed)
    cfg = {"otype": "CutlassMLP", "n_neurons": width, "n_hidden_layers": hidden_layers, "activation": hidden,
           "output_activation": output}
    net = NetworkArray(n_in, n_out, cfg, n_networks=n_networks, seed=seed, kernels="unfused",
                       input_padding=input_padding, output_padding=output_padding)
    x = ((torch.rand(batch, n_in, generator=gen) * 2 - 1) * x_scale).to(DEVICE)
    net_ids = make_ids(ids, batch, n_networks, gen)
    dy = (torch.randn(batch, n_out, generator=gen) * dy_scale).to(DEVICE)
    y64, dx64, dp64 = reference(net, x, net_ids, dy, hidden, output)
    tiles, chunks = route_fused(net_ids, n_networks, (TILE, CHUNK))
    packed = tc.pack_weights(net.params.detach(), net.shape, precision, pad_output_to_hidden)
    x_in = x.t().contiguous() if feature_major else x
    out, saved = tc.forward(x_in, feature_major, tiles, packed, net.shape, save=True, input_padding=net.input_padding)
    inferred, _ = tc.forward(x_in, feature_major, tiles, packed, net.shape, input_padding=net.input_padding)
    dx, dparams = tc.backward(dy, saved, chunks, want_dx=want_dx, want_params=want_params,
                              gradient_scale=gradient_scale)
    scale = tc.DEFAULT_GRADIENT_SCALES[precision] if gradient_scale is None else gradient_scale
    model = emulated(net, x, net_ids, dy, hidden, output, tc.COMPUTE_DTYPES[precision], scale)
    errs, exact = {"out": rel_err(out, model[0])}, {"out": rel_err(out, y64)}
    problems = [] if torch.equal(inferred, out) else ["inference != training forward"]
    if want_dx:
        mine = dx.t() if feature_major else dx
        errs["dx"], exact["dx"] = rel_err(mine, model[1]), rel_err(mine, dx64)
    elif dx is not None:
        problems.append("dx not None")
    if want_params:
        errs["dparams"], exact["dparams"] = rel_err(dparams, model[2]), rel_err(dparams, dp64)
        empty = torch.bincount(net_ids.long(), minlength=n_networks) == 0
        if not torch.all(dparams[empty] == 0):
            problems.append("empty networks' gradient not zero")
        if output_padding:
            fan_out, fan_in = net.layer_shapes()[-1]
            last = dparams[:, -fan_out * fan_in:].view(-1, fan_out, fan_in)
            if not torch.all(last[:, n_out:] == 0):
                problems.append("padded output rows' gradient not zero")
    elif dparams is not None:
        problems.append("dparams not None")
    if batch:
        problems += [f"{k} {v:.1e} > {TOL[precision]:.0e}" for k, v in errs.items() if not v < TOL[precision]]
        problems += [f"{k} {v:.1e} > {TOL_EXACT[precision]:.0e} (exact)" for k, v in exact.items()
                     if not v < TOL_EXACT[precision]]
    return {"case": name, "precision": precision, **errs, "exact": max(exact.values()) if batch else 0.0,
            "ok": not problems, "problems": problems}


def check_cases(quick: bool):
    """(name, precision, kwargs) of every check; `quick`: the benchmark's shape in each precision and a few."""
    cases = [("32-64x2-16 relu ragged", p, {}) for p in PRECISIONS]
    # The last layer's block as narrow as its outputs (the padding to the hidden width worked around a
    # miscompilation seen in a prototype): whether it computes right numbers now.
    cases += [("32-64x2-16 narrow output block", p, dict(pad_output_to_hidden=False)) for p in PRECISIONS]
    if quick:
        cases.append(("act Sine / out SiLU", "float16", dict(hidden="Sine", output="SiLU")))
    else:
        for p in PRECISIONS:
            cases.append(("32-128x2-16 relu ragged", p, dict(width=128)))
            cases.append(("32-128x2-16 narrow output block", p, dict(width=128, pad_output_to_hidden=False)))
            cases.append(("3-64x3-1 tanh/sigmoid narrow output", p, dict(n_in=3, n_out=1, hidden_layers=3,
                                                                          hidden="Tanh", output="Sigmoid",
                                                                          pad_output_to_hidden=False)))
            cases.append(("17-none-3 (no hidden) sine out", p, dict(n_in=17, n_out=3, hidden_layers=0,
                                                                     output="Sine")))
            cases.append(("32-64x2-16 feature-major", p, dict(feature_major=True)))
            cases.append(("29+3pad-64x2-3+13pad tcnn padding", p, dict(n_in=29, n_out=3, input_padding=(3, 1.0),
                                                                        output_padding=13, hidden="Sigmoid")))
        for p in ("float16", "tf32"):
            for i, a in enumerate(ACTS):
                out = ACTS[(i + 3) % len(ACTS)]
                # Two Exponential layers on unit inputs reach exp(16) and more, past float16's 65504 (inf, then
                # NaN): a limit of the format, as in tcnn. Inputs in [-0.1, 0.1] keep that case in range.
                small = dict(x_scale=0.1) if a == "Exponential" and p == "float16" else {}
                cases.append((f"act {a} / out {out}", p, dict(hidden=a, output=out, **small)))
        for w in (1, 7, 16, 24, 48):
            for p in ("float16", "tf32"):
                cases.append((f"3-{w}x3-1 tanh", p, dict(n_in=3, n_out=1, width=w, hidden_layers=3, hidden="Tanh")))
        cases.append(("1-32x1-16 silu", "bfloat16", dict(n_in=1, n_out=16, width=32, hidden_layers=1, hidden="SiLU")))
        cases.append(("4096 nets even", "float16", dict(n_networks=4096, batch=1 << 19, ids="even")))
        cases.append(("1 net", "float16", dict(n_networks=1, ids="even")))
        cases.append(("dx only", "float16", dict(want_params=False)))
        cases.append(("dparams only", "float16", dict(want_dx=False)))
        cases.append(("dparams only fp32", "float32", dict(want_dx=False)))
    cases.append(("tiny dy 1e-7, scale 65536", "float16", dict(dy_scale=1e-7, gradient_scale=65536.0)))
    cases.append(("batch 0", "float16", dict(batch=0)))
    return cases


def run_checks(tc, quick: bool, batch: int | None = None):
    rows = []
    print("relative errors against the model of the kernels' rounding (out, dx, dparams) and the largest against "
          "exact float64")
    print(f"{'case':40s} {'precision':9s} {'out':>9s} {'dx':>9s} {'dparams':>9s} {'exact':>9s}  verdict", flush=True)
    for name, precision, kwargs in check_cases(quick):
        t0 = time.time()
        try:
            if batch is not None:
                kwargs = dict(kwargs, batch=min(kwargs.get("batch", batch), batch),
                              n_networks=min(kwargs.get("n_networks", 24), 8))
            row = check_case(tc, name, precision, **kwargs)
        except Exception as e:  # report and go on: one failing path should not hide the others
            traceback.print_exc()
            row = {"case": name, "precision": precision, "ok": False, "problems": [f"{type(e).__name__}: {e}"]}
        row["seconds"] = time.time() - t0
        rows.append(row)
        fmt = lambda k: f"{row[k]:9.1e}" if k in row else f"{'-':>9s}"  # noqa: E731
        verdict = "pass" if row["ok"] else "FAIL " + "; ".join(row["problems"])
        print(f"{name:40s} {precision:9s} {fmt('out')} {fmt('dx')} {fmt('dparams')} {fmt('exact')}  {verdict} "
              f"({row['seconds']:.1f} s)", flush=True)
    # Without a scale the same tiny dy loses the float16 gradients (shows that the scale matters).
    try:
        row = check_case(tc, "tiny dy 1e-7, scale 1 (expect loss)", "float16", dy_scale=1e-7, gradient_scale=1.0,
                         **({} if batch is None else dict(batch=batch, n_networks=8)))
        print(f"float16 tiny dy without a gradient scale: largest error against exact float64 {row['exact']:.2e} "
              f"(with scale 65536: see above)")
    except Exception:
        traceback.print_exc()
    failed = [r for r in rows if not r["ok"]]
    print(f"checks: {len(rows) - len(failed)} passed, {len(failed)} failed")
    return rows


# ---- timings --------------------------------------------------------------------------------------------
def grouped_layout(x, ids, n_networks):
    """x sorted by network and padded to the largest count: (N, M, n_in), the index to scatter back."""
    counts = torch.bincount(ids.long(), minlength=n_networks)
    m = int(counts.max())
    order = torch.argsort(ids.long(), stable=True)
    starts = torch.cumsum(counts, 0) - counts
    sorted_ids = ids.long()[order]
    slot = torch.arange(ids.shape[0], device=x.device) - starts[sorted_ids]
    flat = sorted_ids * m + slot
    grouped = x.new_zeros(n_networks * m, x.shape[1])
    grouped[flat] = x[order]
    return grouped.view(n_networks, m, -1), order, counts


def bmm_mlp(xg, weights):
    h = xg
    for l, w in enumerate(weights):
        h = torch.bmm(h, w)
        if l < len(weights) - 1:
            h = torch.relu(h)
    return h


def grouped_mm_mlp(xs, weights, offs):
    h = xs
    for l, w in enumerate(weights):
        h = torch._grouped_mm(h, w, offs=offs)
        if l < len(weights) - 1:
            h = torch.relu(h)
    return h


def bench_config(tc, n_networks, width, routing, reps, batch, precisions):
    rows = []
    gen = torch.Generator().manual_seed(1)
    cfg = {"otype": "CutlassMLP", "n_neurons": width, "n_hidden_layers": 2, "activation": "ReLU",
           "output_activation": "None"}
    net = NetworkArray(32, 16, cfg, n_networks=n_networks, kernels="unfused")
    params = net.params.detach()
    x = torch.rand(batch, 32, device="cuda")
    ids = make_ids(routing, batch, n_networks, gen)
    dy = torch.randn(batch, 16, device="cuda") / (batch * 16)
    label = f"{n_networks}x{width} {routing}"

    def add(method, precision, what, ms):
        rows.append({"config": label, "method": method, "precision": precision, "what": what, "ms": ms})
        print(f"{label:18s} {method:18s} {precision:9s} {what:22s} {ms:9.3f} ms", flush=True)

    route = lambda: route_fused(ids, n_networks, (TILE, CHUNK))  # noqa: E731
    add("tinn-tc", "-", "route (sort + tiles)", gpu_ms(route, reps))
    tiles, chunks = route()
    for p in precisions:
        packed = tc.pack_weights(params, net.shape, p)
        add("tinn-tc", p, "pack weights", gpu_ms(lambda: tc.pack_weights(params, net.shape, p), reps))
        if p in ("float16", "bfloat16"):  # the last layer's block not padded to the hidden width
            narrow = tc.pack_weights(params, net.shape, p, pad_output_to_hidden=False)
            add("tinn-tc narrow-out", p, "inference", gpu_ms(
                lambda: tc.forward(x, False, tiles, narrow, net.shape), reps))
            _, saved = tc.forward(x, False, tiles, narrow, net.shape, save=True)
            add("tinn-tc narrow-out", p, "backward (dparams)", gpu_ms(
                lambda: tc.backward(dy, saved, chunks, want_dx=False), reps))
            del saved, narrow
        add("tinn-tc", p, "inference", gpu_ms(lambda: tc.forward(x, False, tiles, packed, net.shape), reps))
        add("tinn-tc", p, "inference + route", gpu_ms(
            lambda: tc.forward(x, False, route()[0], packed, net.shape), reps))
        add("tinn-tc", p, "forward (save)", gpu_ms(
            lambda: tc.forward(x, False, tiles, packed, net.shape, save=True), reps))
        _, saved = tc.forward(x, False, tiles, packed, net.shape, save=True)
        add("tinn-tc", p, "backward (dparams)", gpu_ms(lambda: tc.backward(dy, saved, chunks, want_dx=False), reps))
        add("tinn-tc", p, "backward (dx+dparams)", gpu_ms(lambda: tc.backward(dy, saved, chunks), reps))
        del saved

        def step():
            t, c = route()
            pk = tc.pack_weights(params, net.shape, p)
            _, s = tc.forward(x, False, t, pk, net.shape, save=True)
            return tc.backward(dy, s, c, want_dx=False)
        add("tinn-tc", p, "step fwd+bwd (+route)", gpu_ms(step, reps))
        torch.cuda.empty_cache()

    # torch baselines on pre-grouped samples (the grouping itself not timed)
    try:
        xg, order, counts = grouped_layout(x, ids, n_networks)
        dyg, _, _ = grouped_layout(dy, ids, n_networks)
        weights = [net.weights(l).detach().transpose(1, 2).contiguous() for l in range(net.n_layers)]
        wgrad = [w.clone().requires_grad_() for w in weights]

        def bmm_train():
            for w in wgrad:
                w.grad = None
            (bmm_mlp(xg, wgrad) * dyg).sum().backward()

        for name, tf32, autocast in (("bmm", False, False), ("bmm", True, False), ("bmm autocast", False, True)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            prec = "float16" if autocast else ("tf32" if tf32 else "float32")
            with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
                with torch.no_grad():
                    add(f"torch {name}", prec, "inference", gpu_ms(lambda: bmm_mlp(xg, weights), reps))
                add(f"torch {name}", prec, "fwd+bwd (autograd)", gpu_ms(bmm_train, reps))
        torch.backends.cuda.matmul.allow_tf32 = False
        del xg, dyg
        torch.cuda.empty_cache()
    except torch.cuda.OutOfMemoryError:
        print(f"{label}: torch.bmm baseline out of memory (padded to the largest network)")
        torch.cuda.empty_cache()
    if hasattr(torch, "_grouped_mm") and n_networks <= 1024:
        try:
            order = torch.argsort(ids.long(), stable=True)
            xs = x[order].bfloat16()
            dys = dy[order].bfloat16()
            counts = torch.bincount(ids.long(), minlength=n_networks)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            wb = [net.weights(l).detach().transpose(1, 2).contiguous().bfloat16() for l in range(net.n_layers)]
            wbg = [w.clone().requires_grad_() for w in wb]
            with torch.no_grad():
                add("torch grouped_mm", "bfloat16", "inference", gpu_ms(lambda: grouped_mm_mlp(xs, wb, offs), reps))

            def gmm_train():
                for w in wbg:
                    w.grad = None
                (grouped_mm_mlp(xs, wbg, offs).float() * dys.float()).sum().backward()
            add("torch grouped_mm", "bfloat16", "fwd+bwd (autograd)", gpu_ms(gmm_train, reps))
        except Exception as e:  # not on this GPU / torch build
            print(f"{label}: torch._grouped_mm: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return rows


def main(argv=None):
    global DEVICE, TILE, CHUNK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a subset of about a minute")
    parser.add_argument("--part", choices=("all", "check", "bench"), default="all")
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "tensor_core_check.json"))
    parser.add_argument("--tile", type=int, default=TILE, help="samples per forward tile (a program)")
    parser.add_argument("--chunk", type=int, default=CHUNK, help="samples per backward chunk (one atomic add each)")
    parser.add_argument("--options", default=None, metavar="BM,WARPS,STAGES",
                        help="launch options for every kernel instead of launch.launch_options' choice")
    parser.add_argument("--interpret", action="store_true",
                        help="smoke-test the checks on the CPU under Triton's interpreter (tiny batches, no timings)")
    args = parser.parse_args(argv)
    TILE, CHUNK = args.tile, args.chunk
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["TINN_ARCH"] = "cpu"
        DEVICE, TILE, CHUNK = "cpu", 16, 64
        args.part = "check"
    elif not torch.cuda.is_available():
        sys.exit("tensor_core_check.py needs CUDA")
    os.environ.setdefault("TINN_ARCH", "cuda")
    tinn.init()
    from tinn.kernels import tensor_cores as tc
    ok, why = tc.available()
    if not ok:
        sys.exit(why)
    if args.options:
        from tinn.kernels.tensor_cores import launch
        fixed = launch.LaunchOptions(*(int(v) for v in args.options.split(",")))
        launch.launch_options = lambda *a, **k: fixed
    import triton
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter)",
              "tile": TILE, "chunk": CHUNK, "options": args.options,
              "torch": torch.__version__, "triton": triton.__version__, "quick": args.quick, "checks": [], "timings": []}
    if args.part in ("all", "check"):
        result["checks"] = run_checks(tc, args.quick, batch=300 if args.interpret else None)
    if args.part in ("all", "bench"):
        batch = 1 << 22
        configs = [(4096, 64), (64, 64)] + ([] if args.quick else [(4096, 128), (64, 128)])
        routings = ("even", "ragged")
        precisions = ("float16", "bfloat16") if args.quick else PRECISIONS
        reps = 5 if args.quick else 20
        print(f"{'config':18s} {'method':18s} {'precision':9s} {'what':22s} {'median':>12s}")
        for n, w in configs:
            for r in routings:
                if args.quick and (n, r) == (64, "ragged"):
                    continue
                result["timings"] += bench_config(tc, n, w, r, reps, batch, precisions)
                torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    if any(not r["ok"] for r in result["checks"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
