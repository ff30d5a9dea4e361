"""Runs one registered suite: checks that this machine can, runs its module, and leaves its JSON and the table it
printed in out/benchmarks/<suite>/."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys

from benchmarks.loading import ROOT
from benchmarks.suites import SUITES, Options, Suite

OUT = os.path.join(ROOT, "out", "benchmarks")


class SuiteError(Exception):
    """A suite that cannot run here: unknown, its module not in this checkout, or hardware it needs missing."""


def suite_named(name: str) -> Suite:
    if name not in SUITES:
        raise SuiteError(f"unknown suite {name!r}; the suites are: {', '.join(SUITES)}")
    return SUITES[name]


def module_present(suite: Suite) -> bool:
    return importlib.util.find_spec(suite.module) is not None


def check_module(suite: Suite) -> None:
    if not module_present(suite):
        path = suite.module.replace(".", "/") + ".py"
        raise SuiteError(f"suite {suite.name!r} has no module yet: {path} is not in this checkout "
                         f"(the suite is registered ahead of it, in benchmarks/suites.py)")


def cuda_devices() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_hardware(suite: Suite, options: Options) -> None:
    """Refuse, saying what is missing, a suite this machine cannot run."""
    if suite.needs == "cuda":
        if options.arch == "cpu":
            raise SuiteError(f"suite {suite.name!r} runs on CUDA GPUs only; --arch cpu is not an option for it")
        if cuda_devices() == 0:
            raise SuiteError(f"suite {suite.name!r} needs a CUDA GPU, and this machine has none")
    elif suite.needs == "multi-gpu":
        if options.arch == "cpu":
            if not options.quick:
                raise SuiteError(f"suite {suite.name!r} on the CPU is the toy-size check of the script only: "
                                 f"add --quick (two processes over gloo)")
            return
        found = cuda_devices()
        wanted = options.gpus or found
        if wanted < 2 or found < wanted:
            raise SuiteError(f"suite {suite.name!r} needs 2 or more CUDA GPUs (asked for {wanted}, this machine "
                             f"has {found}); `--arch cpu --quick` checks the script on the CPU (two processes, gloo)")


def options_for(suite: Suite, quick: bool = False, arch: str | None = None, json_path: str | None = None,
                gpus: int | None = None, extra: tuple[str, ...] = ()) -> Options:
    if arch not in (None, "cpu", "cuda"):
        raise SuiteError(f"--arch must be cpu or cuda (or left out: the module's choice), not {arch!r}")
    if gpus is not None and (suite.launch != "torchrun" or gpus < 1):
        raise SuiteError("--gpus is an option of the multi-GPU suites only, and at least 1"
                         if suite.launch != "torchrun" else f"--gpus must be at least 1, not {gpus}")
    out_dir = os.path.join(OUT, suite.name)
    return Options(quick=quick, arch=arch, json_path=os.path.abspath(json_path or os.path.join(out_dir, f"{suite.name}.json")),
                   out_dir=out_dir, gpus=gpus, extra=tuple(extra))


def command_line(suite: Suite, options: Options) -> list[str]:
    """The command that runs the suite's module: `python -m module ...`, or torchrun's for a multi-GPU suite."""
    argv = suite.argv(options) + list(options.extra)
    if suite.launch == "torchrun":
        processes = options.gpus or (2 if options.arch == "cpu" else cuda_devices())
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                "-m", suite.module] + argv
    return [sys.executable, "-m", suite.module] + argv


class _Tee:
    """Writes to the terminal and to a file: the table a suite prints is kept beside its JSON."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def run(suite: Suite, options: Options, dry_run: bool = False) -> dict:
    """Runs the suite; returns its JSON. dry_run: prints the command line only (no checks of this machine)."""
    check_module(suite)
    if dry_run:
        print(shlex.join(command_line(suite, options)))
        return {}
    check_hardware(suite, options)
    os.makedirs(options.out_dir, exist_ok=True)
    os.makedirs(os.path.dirname(options.json_path), exist_ok=True)
    if os.path.exists(options.json_path):
        os.remove(options.json_path)  # a result left by an earlier run must not pass for this one
    table_path = os.path.join(options.out_dir, f"{suite.name}.txt")
    env_arch = {"TINN_ARCH": options.arch} if options.arch else {}
    with open(table_path, "w") as table:
        if suite.launch == "torchrun":
            returned = _run_processes(suite, options, env_arch, table)
        else:
            returned = _run_here(suite, options, env_arch, table)
        if not os.path.exists(options.json_path):
            if not isinstance(returned, dict):
                raise SuiteError(f"suite {suite.name!r} wrote no JSON ({options.json_path})")
            with open(options.json_path, "w") as f:
                json.dump(returned, f, indent=1)
        with open(options.json_path) as f:
            result = json.load(f)
        if suite.table is not None:
            with contextlib.redirect_stdout(_Tee(sys.stdout, table)):
                print()
                suite.table(result)
    print(f"\n{suite.name}: JSON in {_shown(options.json_path)}, table in {_shown(table_path)}")
    return result


def _run_here(suite: Suite, options: Options, env_arch: dict, table):
    module = importlib.import_module(suite.module)
    saved = {k: os.environ.get(k) for k in env_arch}
    os.environ.update(env_arch)
    try:
        with contextlib.redirect_stdout(_Tee(sys.stdout, table)):
            return module.main(suite.argv(options) + list(options.extra))
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise SuiteError(f"suite {suite.name!r} stopped: {stop.code}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_processes(suite: Suite, options: Options, env_arch: dict, table):
    env = dict(os.environ, **env_arch)
    proc = subprocess.Popen(command_line(suite, options), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        sys.stdout.write(line)
        table.write(line)
    if proc.wait() != 0:
        raise SuiteError(f"suite {suite.name!r}: its processes exited with {proc.returncode}")
    return None


def _shown(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel
