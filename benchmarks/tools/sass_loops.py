"""Instruction mix of every loop in a kernel's SASS (the text `cuobjdump -sass` prints).

A loop is the range between a backward branch and its target. For each one it prints how many
instructions one iteration issues and what share are FFMA: the multiply-adds a GEMM stage exists for.
The rest are loads and the integer arithmetic that forms their addresses, which is where Taichi's code
generation spends the issue slots (docs/design-notes.md).

    python -m benchmarks.tools.sass_loops kernels.sass [FUNCTION_PREFIX ...]
"""
from __future__ import annotations

import collections
import re
import sys

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH_TARGET = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")
_PREDICATE = re.compile(r"^@!?U?P[T\d]+\s+")
INTEGER_OPS = ("IADD3", "IMAD", "LEA", "VIADD", "SHF", "LOP3", "IABS", "ISETP", "UIADD3", "UISETP", "SEL")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """{function name: [(address, instruction text without predicate), ...]} of a cuobjdump listing."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        if "Function :" in line:
            current = out.setdefault(line.split("Function :", 1)[1].strip(), [])
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), _PREDICATE.sub("", m.group(2).strip())))
    return out


def loops(instructions: list[tuple[int, str]]) -> list[dict]:
    """One record per backward branch: its address range and the opcode counts of one iteration."""
    found = []
    for addr, text in instructions:
        m = _BRANCH_TARGET.search(text) if text.startswith("BRA") else None
        if not m or int(m.group(1), 16) >= addr:
            continue
        lo = int(m.group(1), 16)
        ops = collections.Counter(t.split()[0].split(".")[0] for a, t in instructions if lo <= a <= addr)
        n = sum(ops.values())
        found.append({"start": lo, "end": addr, "instructions": n, "ffma": ops.get("FFMA", 0),
                      "integer": sum(ops.get(k, 0) for k in INTEGER_OPS),
                      "loads": sum(v for k, v in ops.items() if k in ("LD", "LDG", "LDS")), "ops": dict(ops)})
    return found


def report(sass: str, prefixes: tuple[str, ...] = ()) -> str:
    lines = []
    for name, body in functions(sass).items():
        if prefixes and not name.startswith(prefixes):
            continue
        lines.append(f"{name}: {len(body)} instructions")
        for lp in loops(body):
            share = 100.0 * lp["ffma"] / max(lp["instructions"], 1)
            top = ", ".join(f"{k} {v}" for k, v in collections.Counter(lp["ops"]).most_common(8))
            lines.append(f"  loop {lp['start']:#x}-{lp['end']:#x}: {lp['instructions']} per iteration, "
                         f"FFMA {lp['ffma']} ({share:.0f}%), loads {lp['loads']}, integer {lp['integer']}: {top}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(open(sys.argv[1]).read(), tuple(sys.argv[2:])))
