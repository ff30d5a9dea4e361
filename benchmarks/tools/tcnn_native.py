"""tiny-cuda-nn's native image sample next to tinn's image step: same config, batch 2^18, same GPU, one run.

    python -m benchmarks.tools.tcnn_native [--steps 3001] [--image PATH] [--config tinn/configs/config_hash.json]
        [--build-dir out/tcnn-native/build] [--skip-build] [--variant precision=float16 ...]
        [--json out/tcnn_native.json]

1. Unpacks .tcnn/tcnn-src.tar.xz (made by benchmarks/tools/tcnn_sources.sh) next to the build folder and
   builds tcnn's `mlp_learning_an_image` with CMake and Ninja for this GPU's architecture; a build folder
   left by an earlier run is reused (Ninja recompiles only what changed).
2. Runs the sample on the image (tinn's embedded default image, written to a PNG, unless --image) with the
   config. The sample trains at batch 2^18 (fixed in its source) and prints `Step#i: loss=... time=T[µs]`
   at steps 0, 10, 100, 1000, 2000, ...; T is the wall time since the previous line, covering the steps in
   between (each one's batch generation, two small kernels, included), with the loss read back, a device
   sync, every 100 steps. ms/step: the time of the windows that start at --warmup or later over their
   steps (the first steps include the runtime compilation of its fused kernels).
3. Times tinn's image step for the same config and batch in this process: the `tinn.Trainer` step on
   fixed batches, the same with a fresh batch sampled each step (as the sample does), and the `tinn.torch`
   loop of tcnn's PyTorch sample; each in blocks of 100 steps with one sync per block, the sample's cadence.

Prints one table (ms per step and the ratio to tcnn native) and writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
ARCHIVE = os.path.join(ROOT, ".tcnn", "tcnn-src.tar.xz")
SAMPLE = "mlp_learning_an_image"
SAMPLE_LOG2_BATCH = 18  # `batch_size = 1 << 18` in the sample's source
SOURCE_DIR_NAME = "tiny-cuda-nn"

# A progress line of the sample: its loss (averaged since the previous line) and the microseconds since it.
STEP_LINE = re.compile(r"^Step#(\d+): loss=(\S+) time=(\d+)\[", re.MULTILINE)
JIT_ENABLED = "JIT fusion is enabled."
ROUNDS = 3  # tinn's rows: each timed this many times, in turn with the others; the median is reported
FAILURE_PREFIX = "Uncaught exception: "  # the sample reports its errors this way and still exits with 0


class ToolError(RuntimeError):
    """A step of the tool failed; the message says which and why."""


# ---------------------------------------------------------------------------------------------------------
# The sample's output


def parse_step_lines(text: str) -> list[dict]:
    """The sample's progress lines in order: {step, loss, us}. A loss C++ printed as nan/-nan/inf is kept
    as a float NaN/inf."""
    rows = []
    for step, loss, us in STEP_LINE.findall(text):
        try:
            value = float(loss)
        except ValueError:
            value = float("nan")
        rows.append({"step": int(step), "loss": value, "us": int(us)})
    return rows


def printed_steps(n_steps: int) -> list[int]:
    """The steps at which the sample prints a progress line when it trains `n_steps` steps: every
    `interval`-th step, the interval starting at 10 and growing tenfold after each line past step 0 up to
    1000."""
    steps, interval = [], 10
    for i in range(0, n_steps, 10):
        if i % interval == 0:
            steps.append(i)
            if i > 0 and interval < 1000:
                interval *= 10
    return steps


def timing_windows(lines: list[dict]) -> list[dict]:
    """Each progress line's time as a window of steps: {first, last, steps, us}. The first line's window is
    step 0 alone (with the setup since the loop began); a later one covers the steps after the previous
    line's up to its own."""
    windows, previous = [], None
    for line in lines:
        first = 0 if previous is None else previous + 1
        if line["step"] < first:
            raise ToolError(f"progress lines out of order: Step#{line['step']} after Step#{previous}")
        windows.append({"first": first, "last": line["step"], "steps": line["step"] - first + 1, "us": line["us"]})
        previous = line["step"]
    return windows


def steady_ms_per_step(windows: list[dict], warmup: int) -> dict:
    """ms per step over the windows that start at step `warmup` or later: their total time over their total
    steps, with each such window's own ms/step to show the spread."""
    kept = [w for w in windows if w["first"] >= warmup]
    if not kept:
        last = windows[-1]["last"] if windows else None
        raise ToolError(f"no timed window starts at step >= {warmup} (last progress line at step {last}); "
                        f"run more steps (the sample prints at 0, 10, 100, then every 1000)")
    steps = sum(w["steps"] for w in kept)
    us = sum(w["us"] for w in kept)
    return {"ms_per_step": us / steps / 1e3, "timed_steps": steps,
            "window_ms_per_step": [w["us"] / w["steps"] / 1e3 for w in kept]}


def check_sample_output(text: str, returncode: int) -> None:
    """Raise ToolError if the sample failed: a non-zero exit, or the exception line it prints before
    exiting with 0."""
    for line in text.splitlines():
        if line.startswith(FAILURE_PREFIX):
            raise ToolError(f"{SAMPLE} failed: {line[len(FAILURE_PREFIX):]}")
    if returncode != 0:
        raise ToolError(f"{SAMPLE} exited with {returncode}; output tail:\n{text[-3000:]}")


# ---------------------------------------------------------------------------------------------------------
# Commands


def configure_command(source_dir: str, build_dir: str, cuda_arch: str, nvcc: str | None = None,
                      extra: list[str] | tuple = ()) -> list[str]:
    """CMake's configure step for the sample alone (no benchmarks), Release, Ninja; `extra` last."""
    cmd = ["cmake", "-S", source_dir, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
           f"-DTCNN_CUDA_ARCHITECTURES={cuda_arch}", "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
           "-DTCNN_BUILD_BENCHMARK=OFF"]
    return cmd + ([f"-DCMAKE_CUDA_COMPILER={nvcc}"] if nvcc else []) + list(extra)


def find_nvcc() -> str:
    """CUDA's compiler: $CUDACXX, else nvcc on PATH, else the usual install folder."""
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ToolError("CUDA's nvcc not found ($CUDACXX, PATH, /usr/local/cuda/bin); the build needs it")


def build_command(build_dir: str, jobs: int | None = None) -> list[str]:
    cmd = ["cmake", "--build", build_dir, "--target", SAMPLE]
    return cmd + (["-j", str(jobs)] if jobs else [])


def sample_binary(build_dir: str) -> str:
    return os.path.join(build_dir, SAMPLE)


def sample_command(binary: str, image: str, config: str, steps: int, result_image: str) -> list[str]:
    """The sample's arguments: image, config, step count and a final image path; giving the last also
    stops it from rendering and writing an image at every progress line."""
    return [binary, os.path.abspath(image), os.path.abspath(config), str(int(steps)), result_image]


# ---------------------------------------------------------------------------------------------------------
# Build


def archive_commits(archive: str) -> str:
    with tarfile.open(archive, "r:xz") as tar:
        member = tar.extractfile(f"{SOURCE_DIR_NAME}/COMMITS")
        if member is None:
            raise ToolError(f"{archive} has no {SOURCE_DIR_NAME}/COMMITS; remake it with tcnn_sources.sh")
        return member.read().decode()


def unpack(archive: str, dest: str) -> str:
    """The archive's source tree under `dest`, unpacked unless the same commits are already there."""
    if not os.path.exists(archive):
        raise ToolError(f"{archive} is missing: run benchmarks/tools/tcnn_sources.sh where the tiny-cuda-nn "
                        f"mirrors are, and carry '.tcnn' to this machine")
    source = os.path.join(dest, SOURCE_DIR_NAME)
    wanted = archive_commits(archive)
    stamp = os.path.join(source, "COMMITS")
    if os.path.exists(stamp) and open(stamp).read() == wanted:
        return source
    shutil.rmtree(source, ignore_errors=True)
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)
    return source


def run_logged(cmd: list[str], log_path: str, timeout: float, what: str, cwd: str | None = None) -> str:
    """Run `cmd`, its output to `log_path`; a ToolError naming `what`, with the log's tail, on failure."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        text = proc.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode("utf-8", "replace")
        with open(log_path, "w") as f:
            f.write(text)
        raise ToolError(f"{what} ran past {timeout:.0f} s (log: {log_path}); tail:\n{text[-3000:]}") from None
    except FileNotFoundError:
        raise ToolError(f"{what}: {cmd[0]!r} not found on PATH") from None
    with open(log_path, "w") as f:
        f.write(text)
    if proc.returncode != 0:
        raise ToolError(f"{what} failed with exit code {proc.returncode} (log: {log_path}); tail:\n{text[-3000:]}")
    print(f"{what}: {time.perf_counter() - t0:.1f} s", flush=True)
    return text


def build(archive: str, build_dir: str, cuda_arch: str, jobs: int | None, timeout: float,
          cmake_args: list[str] | tuple = ()) -> str:
    """Unpack, configure and build; the binary. An earlier build in `build_dir` is reused: configuring
    again takes seconds (and applies changed options), Ninja recompiles only what changed."""
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise ToolError(f"{tool!r} is not on PATH; the build needs cmake and ninja")
    nvcc = find_nvcc()
    parent = os.path.dirname(os.path.abspath(build_dir))
    stamp = os.path.join(parent, SOURCE_DIR_NAME, "COMMITS")
    before = open(stamp).read() if os.path.exists(stamp) else None
    source = unpack(archive, parent)
    if before != open(stamp).read():
        # Unpacked files carry the archive's fixed old times, so Ninja would take objects built from other
        # commits as up to date: a new source tree gets a new build.
        shutil.rmtree(build_dir, ignore_errors=True)
    os.makedirs(build_dir, exist_ok=True)
    run_logged(configure_command(source, build_dir, cuda_arch, nvcc, cmake_args),
               os.path.join(build_dir, "configure.log"), min(timeout, 300), "configure")
    run_logged(build_command(build_dir, jobs), os.path.join(build_dir, "build.log"), timeout, "build")
    return sample_binary(build_dir)


def run_sample(binary: str, image: str, config: str, steps: int, warmup: int, timeout: float) -> dict:
    """Run the sample in a scratch folder (it writes reference.jpg there); its timing and losses."""
    if not os.access(binary, os.X_OK):
        raise ToolError(f"{binary} is missing or not executable (build it, or drop --skip-build)")
    with tempfile.TemporaryDirectory() as work:
        cmd = sample_command(binary, image, config, steps, os.path.join(work, "result.jpg"))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ToolError(f"{SAMPLE} ran past {timeout:.0f} s ({steps} steps)") from None
        seconds = time.perf_counter() - t0
    text = proc.stdout.decode("utf-8", "replace")
    check_sample_output(text, proc.returncode)
    lines = parse_step_lines(text)
    windows = timing_windows(lines)
    steady = steady_ms_per_step(windows, warmup)
    return dict(steady, command=cmd, jit_fusion=JIT_ENABLED in text, process_seconds=seconds,
                losses=[(line["step"], line["loss"]) for line in lines], windows=windows, log_tail=text[-2000:])


# ---------------------------------------------------------------------------------------------------------
# tinn


def tinn_timings(config_path: str, image_path: str | None, log2_batch: int, block: int, blocks: int,
                 with_torch: bool, variants: list[str] | tuple = ()) -> dict:
    """ms per step of tinn's image step at this batch: Trainer on fixed batches, Trainer with a batch sampled
    per step, and (if `with_torch`) the tinn.torch loop of tcnn's PyTorch sample; each under the installed
    settings and again under each of `variants` (settings changes as TINN_SETTINGS takes them, e.g.
    "precision=float16"), labelled with it."""
    import torch

    import tinn
    from tinn import step_graphs
    from benchmarks.bench_torch_path import ImageSteps, on_calling_thread, torch_adam
    from benchmarks.common import pipelined_ms, settings_installed, settle
    from tinn.tasks.image import ImageTask, load_image

    config = tinn.load_config(config_path)
    task = ImageTask(load_image(image_path) if image_path else _default_image(), seed=0)
    base = tinn.settings.installed()
    timed = []  # (label, settings, fn)
    for variant in ("", *variants):
        chosen = base.replace(**tinn.settings.parse(variant)) if variant else base
        suffix = f" [{variant}]" if variant else ""
        with settings_installed(chosen):
            steps = ImageSteps(config, log2_batch)
            if image_path:  # ImageSteps samples the default image; its fixed batches come from this one instead
                steps.batches = [task.batch(1 << log2_batch) for _ in steps.batches]

            def trainer_with_batch(trainer=steps.trainer):
                x, t, _ = task.batch(1 << log2_batch)
                trainer.training_step(x, t)

            timed += [("tinn Trainer" + suffix, chosen, steps.native),
                      ("tinn Trainer + batch" + suffix, chosen, trainer_with_batch)]
            if with_torch:
                optimizer = torch_adam(steps.model.parameters(), config.get("optimizer", {}))
                timed.append(("tinn.torch loop" + suffix, chosen, on_calling_thread(steps.torch_loop(optimizer))))
                fused = torch_adam(steps.model.parameters(), config.get("optimizer", {}), fused=True)
                timed.append(("tinn.torch loop, fused Adam" + suffix, chosen,
                              on_calling_thread(steps.torch_loop(fused))))
                if torch.cuda.is_available():  # the same loop in one CUDA graph of the caller's (torch.cuda.graph)
                    graphed = ImageSteps(config, log2_batch)
                    graphed.batches = steps.batches
                    capturable = torch_adam(graphed.model.parameters(), config.get("optimizer", {}),
                                            capturable=True, fused=True)
                    try:
                        with tinn.checks.disabled():
                            timed.append(("tinn.torch loop, torch.cuda.graph" + suffix, chosen,
                                          graphed.captured_loop(capturable)))
                    except step_graphs.NotCapturable as e:  # float32: a single network on Taichi's kernels
                        print(f"tinn.torch loop, torch.cuda.graph{suffix}: not captured ({e})")
    out = {}
    with tinn.checks.disabled():
        for _, chosen, fn in timed:  # compile, warm up, capture the step graph and finish its trial
            with settings_installed(chosen):
                settle(fn)
        rounds = {label: [] for label, _, _ in timed}
        for _ in range(ROUNDS):  # alternated: a host's and a GPU's speed drift within a process
            for label, chosen, fn in timed:
                with settings_installed(chosen):
                    rounds[label].append(pipelined_ms(fn, block, blocks))
        out.update({label: statistics.median(ms) for label, ms in rounds.items()})
    out["_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return out


def _default_image():
    from tinn.tasks.image import default_image
    return default_image(256)


def write_default_image(path: str) -> str:
    """tinn's embedded default image as a PNG, for the sample (which reads files through stb_image)."""
    import torch

    from tinn.tasks.image import save_png
    save_png(path, torch.from_numpy(_default_image()))
    return path


def cuda_arch_of_device() -> str:
    import torch
    if not torch.cuda.is_available():
        raise ToolError("no CUDA device: this tool compares on a GPU")
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}{minor}"


# ---------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3001,
                   help="the sample's training steps; its last timed window ends at the last multiple of 1000 below")
    p.add_argument("--warmup", type=int, default=1000, help="sample windows starting before this step are not counted")
    p.add_argument("--image", default=None, help="image file (default: tinn's embedded image, 256x256)")
    p.add_argument("--config", default=os.path.join(ROOT, "tinn", "configs", "config_hash.json"))
    p.add_argument("--archive", default=ARCHIVE)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "out", "tcnn-native", "build"),
                   help="the build folder; the sources are unpacked next to it (out/ is git-ignored, and a "
                        "machine that keeps ignored files between runs keeps the build)")
    p.add_argument("--skip-build", action="store_true", help="use the binary already in --build-dir")
    p.add_argument("--cuda-arch", default=None, help="CUDA architecture to build for (default: this GPU's)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: Ninja's)")
    p.add_argument("--cmake-arg", action="append", default=[],
                   help="extra configure option, e.g. -DTCNN_BUILD_WITH_RTC=OFF where CUDA's nvrtc.h is missing")
    p.add_argument("--build-timeout", type=float, default=480)
    p.add_argument("--run-timeout", type=float, default=300)
    p.add_argument("--block", type=int, default=100, help="tinn: steps per timed block (one sync each)")
    p.add_argument("--blocks", type=int, default=5, help="tinn: timed blocks (the median is reported)")
    p.add_argument("--no-torch", action="store_true", help="skip the tinn.torch loop")
    p.add_argument("--variant", action="append", default=[],
                   help="tinn's rows again under these settings changes, e.g. precision=float16 (repeatable)")
    p.add_argument("--json", default=os.path.join(ROOT, "out", "tcnn_native.json"))
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    printed = printed_steps(args.steps)
    if not any(w["first"] >= args.warmup for w in timing_windows([{"step": i, "us": 0} for i in printed])):
        raise SystemExit(f"--steps {args.steps}: the sample prints at steps {printed[-4:]}, no timed window "
                         f"starts at --warmup {args.warmup} or later; use --steps {max(args.warmup, 1000) + 1001}")
    import tinn
    from benchmarks.common import print_table, write_json

    try:
        cuda_arch = args.cuda_arch or cuda_arch_of_device()
        if args.skip_build:
            binary = sample_binary(args.build_dir)
        else:
            binary = build(args.archive, args.build_dir, cuda_arch, args.jobs, args.build_timeout, args.cmake_arg)
        with tempfile.TemporaryDirectory() as scratch:
            image = args.image or write_default_image(os.path.join(scratch, "tinn_default.png"))
            native = run_sample(binary, image, args.config, args.steps, args.warmup, args.run_timeout)
    except ToolError as e:
        raise SystemExit(f"error: {e}") from None

    # tinn starts only now: the sample has had the GPU to itself.
    arch = tinn.init()
    if arch != "cuda":
        raise SystemExit(f"tinn runs on {arch!r} here; this comparison needs the GPU")
    tinn_ms = tinn_timings(args.config, args.image, SAMPLE_LOG2_BATCH, args.block, args.blocks, not args.no_torch,
                           args.variant)
    device = tinn_ms.pop("_device")
    tcnn_ms = native["ms_per_step"]
    rows = [{"path": "tcnn native (mlp_learning_an_image)", "ms": tcnn_ms, "x": 1.0}]
    rows += [{"path": label, "ms": ms, "x": ms / tcnn_ms} for label, ms in tinn_ms.items()]
    spread = native["window_ms_per_step"]
    print(f"\n{device}, sm_{cuda_arch}, config {os.path.basename(args.config)}, batch 2^{SAMPLE_LOG2_BATCH}, "
          f"image {args.image or 'tinn default 256x256'}")
    print(f"tcnn native: {native['timed_steps']} timed steps after step {args.warmup}, JIT fusion "
          f"{'on' if native['jit_fusion'] else 'off'}, per window {min(spread):.3f}..{max(spread):.3f} ms; "
          f"last loss {native['losses'][-1][1]:.5f}")
    print(f"tinn: median of {ROUNDS} rounds (in turn) of the median of {args.blocks} blocks of {args.block} steps\n")
    print_table(rows, [("path", "path", "s"), ("ms", "ms/step", ".3f"), ("x", "x tcnn native", ".2f")])
    payload = {"benchmark": "tcnn_native", "device": device, "cuda_arch": cuda_arch,
               "config": os.path.relpath(os.path.abspath(args.config), ROOT), "image": args.image,
               "log2_batch": SAMPLE_LOG2_BATCH, "steps": args.steps, "warmup": args.warmup,
               "block": args.block, "blocks": args.blocks, "rows": rows, "tcnn_native": native}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
