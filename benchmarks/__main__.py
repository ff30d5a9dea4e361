"""tinn's benchmarks, one command:

    python -m benchmarks list                          # the suites, one line each
    python -m benchmarks run arrays                    # a suite at its full sizes (GPU sizes on a GPU)
    python -m benchmarks run grid --quick --arch cpu   # toy sizes: checks the suite in seconds
    python -m benchmarks run image --json my.json -- --log2-batch 18   # after `--`: the module's own options

Each suite writes its JSON and the table it printed to out/benchmarks/<suite>/ (--json: the JSON elsewhere).
The modules behind the suites keep their own command lines (`python -m benchmarks.bench_mlp_array --help`).
"""
from __future__ import annotations

import argparse
import sys

from benchmarks import harness
from benchmarks.suites import SUITES


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the suites, one line each")
    r = commands.add_parser("run", help="run one suite")
    r.add_argument("suite", help="one of: " + ", ".join(SUITES))
    r.add_argument("--quick", action="store_true", help="toy sizes: checks the suite, measures nothing worth keeping")
    r.add_argument("--json", default=None, metavar="PATH",
                   help="write the JSON here (default: out/benchmarks/<suite>/<suite>.json)")
    r.add_argument("--arch", default=None, choices=["cpu", "cuda"], help="default: TINN_ARCH, else a GPU if present")
    r.add_argument("--gpus", type=int, default=None, help="processes of a multi-GPU suite (default: every GPU)")
    r.add_argument("--dry-run", action="store_true", help="print the module's command line and stop")
    r.epilog = "Options after `--` go to the suite's module unchanged."
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parse(ours)
    if args.command == "list":
        width = max(len(name) for name in SUITES)
        for name, suite in SUITES.items():
            missing = "" if harness.module_present(suite) else "  [module not in this checkout yet]"
            print(f"{name:<{width}}  {suite.summary}{missing}")
        return 0
    try:
        suite = harness.suite_named(args.suite)
        options = harness.options_for(suite, quick=args.quick, arch=args.arch, json_path=args.json, gpus=args.gpus,
                                      extra=tuple(extra))
        harness.run(suite, options, dry_run=args.dry_run)
    except harness.SuiteError as refused:
        print(f"python -m benchmarks: {refused}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
