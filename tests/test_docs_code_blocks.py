"""Every ```python block of README.md and docs/ runs as written, on the CPU.

Blocks of one page run in order in one interpreter and share their names, as a reader runs them. Two
comments, on the line right before a block, change that:

    <!-- skip: needs CUDA -->     the block is not run; the test reports it skipped with that reason
    <!-- run: fresh -->           the block starts a new interpreter (e.g. a `tinn.init` with other settings)

Each block is written to a file whose line numbers are the page's, so that a traceback points into the
page and Taichi, which reads a function's source to compile it, finds `@ti.func` bodies."""
import glob
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"<!--\s*(skip|run)\s*:\s*(.*?)\s*-->")

DRIVER = r"""
import json, os, sys, traceback
namespace = {"__name__": "__main__"}
for block in json.loads(sys.stdin.read()):
    path = os.path.join("blocks", block["name"])
    os.makedirs("blocks", exist_ok=True)
    with open(path, "w") as f:
        f.write("\n" * (block["line"] - 1) + block["code"])  # the page's line numbers
    try:
        exec(compile(open(path).read(), path, "exec"), namespace)
    except BaseException:
        print(f"FAILED: the block at {block['page']}:{block['line']}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    print(f"ran {block['page']}:{block['line']}", flush=True)
"""


@dataclass
class Session:
    page: str
    blocks: list = field(default_factory=list)  # (first code line, code)
    skip: str | None = None


def pages():
    found = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                  recursive=True))
    return [os.path.relpath(p, ROOT) for p in found]


def sessions_of(page, text):
    """The page's python blocks, grouped into sessions (and one session per skipped block)."""
    lines = text.splitlines()
    sessions, current, i = [], None, 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        indent = len(lines[i]) - len(lines[i].lstrip())
        code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
        marker = MARKER.fullmatch(before)
        if marker and marker.group(1) == "skip":
            sessions.append(Session(page, [(i + 2, code)], skip=marker.group(2)))
        else:
            if current is None or (marker and marker.group(2) == "fresh"):
                current = Session(page)
                sessions.append(current)
            current.blocks.append((i + 2, code))
        i = end + 1
    return sessions


def all_sessions():
    out = []
    for page in pages():
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            out += sessions_of(page, f.read())
    return out


SESSIONS = all_sessions()


def test_the_parser_groups_skips_and_fresh_sessions():
    text = "\n".join(["```python", "a = 1", "```", "", "<!-- skip: needs CUDA -->", "```python", "b", "```",
                      "```python", "assert a == 1", "```", "<!-- run: fresh -->", "", "```python", "c = 3", "```",
                      "```bash", "ls", "```"])
    got = [(s.skip, [line for line, _ in s.blocks]) for s in sessions_of("p.md", text)]
    assert got == [(None, [2, 10]), ("needs CUDA", [7]), (None, [15])]
    assert sessions_of("p.md", text)[0].blocks[1][1] == "assert a == 1\n"


def test_every_page_with_code_has_blocks_found():
    assert any(s.page == "README.md" for s in SESSIONS)


@pytest.mark.parametrize("session", SESSIONS, ids=[f"{s.page}:{s.blocks[0][0]}" for s in SESSIONS])
def test_code_block_runs(session, tmp_path):
    if session.skip:
        pytest.skip(session.skip)
    blocks = [{"page": session.page, "line": line, "code": code,
               "name": f"{os.path.basename(session.page)}_{line}.py"} for line, code in session.blocks]
    env = dict(os.environ, TINN_ARCH="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(blocks), cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("ran ") == len(blocks)
