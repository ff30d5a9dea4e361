"""Taichi against Quadrants, side by side, each part in its own process (a process holds one backend).

    python -m benchmarks.backend_compare --out out/backends [--parts tests,bench,image,graph]
                                         [--backends taichi,quadrants] [--fast-launch both]

Parts, per backend:
    tests   the CUDA kernel tests (the GPU suite's list plus the backend tests): passed / failed / skipped
    bench   the target MLP case: 4096 networks x 64 wide, 2^22 samples, even routing (bench_mlp_array.py)
    image   the image-learning step (config_hash.json, batch 2^18): ms/step with and without the input
            checks, host side alone, GPU busy time (profile_image.py)
    graph   Quadrants only: the image step with its CUDA graphs off / on multi-loop kernels / on every
            kernel (quadrants_graph_step.py)
`--fast-launch both` also runs bench and image with TINN_SETTINGS=fast_launch=0 (the backend's standard launch).
`--smoke` runs every part at toy sizes on whatever device is there (a check of the script, not a measurement).

On a machine without internet, bring Quadrants' wheels (about 45 MB for Python 3.12, more with numpy):
    pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 -d wheels quadrants
    pip install --no-index --find-links wheels quadrants      # there, next to taichi
Parts can run in separate calls into one --out folder (each call under ten minutes), e.g.
    --parts tests --backends taichi; --parts tests --backends quadrants; --parts bench,image --fast-launch both;
    --parts graph

Results merge into OUT/backend_compare.json (so parts can run in separate calls); logs in OUT/*.log;
the table is printed from everything in the JSON at the end.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The CUDA kernel tests: fused MLP kernels, grid and parameter-free encodings, routing, the lean launch,
# the part contract's training step, the backend rules.
TESTS = ["tests/test_mlp_fused_cuda.py", "tests/test_encodings_cuda.py", "tests/test_routing.py", "tests/test_launch.py",
         "tests/test_part_contract.py", "tests/test_backend.py"]
SMOKE = {"tests": ["tests/test_backend.py"], "bench": ["--networks", "64", "--log2-samples", "12", "--reps", "1"],
         "image": ["--log2-batch", "10", "--steps", "3"], "graph": ["--log2-batch", "10", "--steps", "3", "--warmup", "2"]}
smoke = False


def run(name, cmd, env, out, limit):
    """Run one step; returns (rc, seconds, log text). The log is kept in OUT/name.log."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=limit)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = 124, (exc.stdout or b"").decode(errors="replace") + f"\n[timed out after {limit} s]"
    seconds = time.perf_counter() - t0
    with open(os.path.join(out, f"{name}.log"), "w") as f:
        f.write(text)
    tail = "\n".join(text.strip().splitlines()[-3:])
    print(f"== {name}: rc={rc}, {seconds:.0f} s\n{tail}", flush=True)
    return rc, seconds, text


def pytest_counts(text):
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", text.splitlines()[-1]
                                              if text.strip() else "")}
    return counts


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def part_tests(backend, env, out, res):
    rc, s, text = run(f"{backend}_tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                           *(SMOKE["tests"] if smoke else TESTS)],
                      dict(env, TINN_ARCH=env.get("TINN_ARCH", "cuda")), out, 540)
    res["tests"] = {"rc": rc, "seconds": round(s, 1), **pytest_counts(text)}


def part_bench(backend, env, out, res, fast):
    path = os.path.join(out, f"{backend}_bench{'' if fast else '_std'}.json")
    rc, s, _ = run(f"{backend}_bench{'' if fast else '_std'}",
                   [sys.executable, "-m", "benchmarks.bench_mlp_array", "--networks", "4096", "--log2-samples", "22",
                    "--widths", "64", "--routing", "even", "--no-vmap", "--json", path, *(SMOKE["bench"] if smoke else [])],
                   env, out, 400)
    data = load_json(path)
    row = data["rows"][0] if data and data.get("rows") else {}
    res["bench" if fast else "bench_std_launch"] = {
        "rc": rc, **{k: row.get(k) for k in ("tinn_fwd_ms", "tinn_train_ms", "torch_fwd_ms", "torch_train_ms",
                                              "tinn_fwd_tflops", "train_speedup")}}


def part_image(backend, env, out, res, fast):
    path = os.path.join(out, f"{backend}_image{'' if fast else '_std'}.json")
    rc, s, _ = run(f"{backend}_image{'' if fast else '_std'}",
                   [sys.executable, "-m", "benchmarks.profile_image", "--steps", "200", "--json", path,
                    *(SMOKE["image"] if smoke else [])], env, out, 300)
    data = load_json(path) or {}
    kernels = data.get("kernels") or []
    res["image" if fast else "image_std_launch"] = {
        "rc": rc, **(data.get("ms_per_step") or {}),
        "gpu_busy_ms": round(sum(k["ms_per_step"] for k in kernels), 3) if kernels else None}


def part_graph(backend, env, out, res):
    if backend != "quadrants":
        return
    res["graph"] = {}
    for mode in ("off", "multi", "all"):
        path = os.path.join(out, f"{backend}_graph_{mode}.json")
        rc, s, _ = run(f"{backend}_graph_{mode}", [sys.executable, "-m", "benchmarks.quadrants_graph_step", "--graph", mode,
                                                   "--json", path, *(SMOKE["graph"] if smoke else [])],
                       env, out, 240)
        data = load_json(path) or {}
        res["graph"][mode] = {"rc": rc, **{k: data.get(k) for k in ("wall_ms_per_step", "host_only_ms_per_step",
                                                                   "gpu_ms_per_step", "graph_kernels")}}


def fmt(v, spec=".3f"):
    if isinstance(v, dict):
        v = v.get("p50")
    return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)


def table(results):
    names = [b for b in ("taichi", "quadrants") if b in results]
    rows = [
        ("version", lambda r: r.get("version")),
        ("CUDA tests passed/failed/skipped", lambda r: "/".join(str(r.get("tests", {}).get(k, 0))
                                                                for k in ("passed", "failed", "skipped"))
         if "tests" in r else None),
        ("4096x64 2^22 forward ms", lambda r: r.get("bench", {}).get("tinn_fwd_ms")),
        ("4096x64 2^22 training step ms", lambda r: r.get("bench", {}).get("tinn_train_ms")),
        ("  same, torch bmm step ms", lambda r: r.get("bench", {}).get("torch_train_ms")),
        ("  same, standard launch step ms", lambda r: r.get("bench_std_launch", {}).get("tinn_train_ms")),
        ("image step ms (checks off)", lambda r: r.get("image", {}).get("checks off")),
        ("image step host alone ms", lambda r: r.get("image", {}).get("host only")),
        ("image step GPU busy ms", lambda r: r.get("image", {}).get("gpu_busy_ms")),
        ("  same, standard launch ms", lambda r: r.get("image_std_launch", {}).get("checks off")),
    ]
    for mode in ("off", "multi", "all"):
        rows.append((f"image step, graphs {mode}: wall ms", lambda r, m=mode: r.get("graph", {}).get(m, {})
                     .get("wall_ms_per_step")))
        rows.append((f"  graphs {mode}: host alone / GPU p50 ms", lambda r, m=mode: (
            f"{fmt(r.get('graph', {}).get(m, {}).get('host_only_ms_per_step'))} / "
            f"{fmt(r.get('graph', {}).get(m, {}).get('gpu_ms_per_step'))}") if r.get("graph", {}).get(m) else None))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'':{width}s}" + "".join(f" {n:>18s}" for n in names))
    for label, get in rows:
        print(f"{label:{width}s}" + "".join(f" {fmt(get(results[n])):>18s}" for n in names))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/backends")
    p.add_argument("--parts", default="tests,bench,image,graph")
    p.add_argument("--backends", default="taichi,quadrants")
    p.add_argument("--fast-launch", choices=["on", "both"], default="on")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    global smoke
    smoke = args.smoke
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "backend_compare.json")
    results = load_json(path) or {}
    parts = args.parts.split(",")
    for backend in args.backends.split(","):
        env = dict(os.environ, TINN_BACKEND=backend, PYTHONUNBUFFERED="1",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        res = results.setdefault(backend, {})
        probe = subprocess.run([sys.executable, "-c", "import tinn.backend as b; print(b.name(), b.version())"],
                               env=env, cwd=ROOT, capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"== {backend}: not usable here: {probe.stderr.strip().splitlines()[-1:]}")
            continue
        res["version"] = probe.stdout.split()[-1]
        for part in parts:
            if part == "tests":
                part_tests(backend, env, args.out, res)
            elif part in ("bench", "image"):
                fn = part_bench if part == "bench" else part_image
                fn(backend, env, args.out, res, True)
                if args.fast_launch == "both":
                    fn(backend, dict(env, TINN_SETTINGS="fast_launch=0"), args.out, res, False)
            elif part == "graph":
                part_graph(backend, env, args.out, res)
            else:
                sys.exit(f"unknown part {part!r}; allowed: tests, bench, image, graph")
        with open(path, "w") as f:  # after every backend, so a cut-off run keeps what it measured
            json.dump(results, f, indent=1)
    table(results)
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
