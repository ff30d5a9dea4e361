"""Run every test of the given pytest arguments in a process of its own, several at once.

A CUDA kernel's illegal address poisons the process that launched it, so one failing test in a shared pytest
worker fails every later test of that worker; here each test's result is its own. Prints one line per test that
did not pass (with its last error line) and a summary line; full logs go to --logs.

    python -m benchmarks.tools.isolated_tests -j 12 --logs out/tests tests/test_gradient_paths.py -k fused
"""
import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys


def collect(args):
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def run_one(test, logs):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", test],
                          capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", test)[-150:]
    with open(os.path.join(logs, name + ".log"), "w") as f:
        f.write(text)
    status = "passed" if proc.returncode == 0 else ("skipped" if proc.returncode == 0 else "failed")
    if " skipped" in text and " passed" not in text and proc.returncode == 0:
        status = "skipped"
    errors = [line for line in text.splitlines() if line.startswith("E ")]
    return test, status, errors[0][:200] if errors else ""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-j", type=int, default=8)
    p.add_argument("--logs", default="out/isolated")
    a, rest = p.parse_known_args()
    os.makedirs(a.logs, exist_ok=True)
    tests = collect(rest)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    with cf.ThreadPoolExecutor(a.j) as pool:
        for test, status, err in pool.map(lambda t: run_one(t, a.logs), tests):
            counts[status] += 1
            if status == "failed":
                print(f"FAILED {test}  {err}", flush=True)
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    sys.exit(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
