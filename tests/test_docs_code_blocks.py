"""Every ```python block of README.md and docs/ runs as written, on the CPU.

Blocks of one page run in order and share their names, as a reader runs them (a session). Two comments,
on the line right before a block, change that:

    <!-- skip: needs CUDA -->     the block is not run; the test reports it skipped with that reason
    <!-- run: fresh -->           the block starts a new session in a new interpreter (e.g. a `tinn.init`
                                  with other settings, which a process takes once)

The other sessions share one interpreter, each in a namespace and a working directory of its own, so that
the pages cost one start of torch and Taichi. Each block is written to a file whose line numbers are the
page's, so that a traceback points into the page and Taichi, which reads a function's source to compile
it, finds `@ti.func` bodies."""
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
sessions, results_path = json.loads(sys.stdin.read()), sys.argv[1]
results, top = {}, os.getcwd()
for session in sessions:
    folder = os.path.join(top, session["id"].replace("/", "_").replace(":", "_"))
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    namespace = {"__name__": "__main__"}
    results[session["id"]] = "ok"
    for block in session["blocks"]:
        path = os.path.join(folder, f"block_{block['line']}.py")
        with open(path, "w") as f:
            f.write("\n" * (block["line"] - 1) + block["code"])  # the page's line numbers
        try:
            exec(compile(open(path).read(), path, "exec"), namespace)
        except BaseException:
            results[session["id"]] = f"the block at {session['page']}:{block['line']} failed:\n" + traceback.format_exc()
            break
    os.chdir(top)
    with open(results_path, "w") as f:  # after every session: a crash still leaves the earlier results
        json.dump(results, f)
"""


@dataclass
class Session:
    page: str
    blocks: list = field(default_factory=list)  # (first code line, code)
    skip: str | None = None
    fresh: bool = False  # asked for a new interpreter

    @property
    def id(self):
        return f"{self.page}:{self.blocks[0][0]}"


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
            fresh = bool(marker and marker.group(2) == "fresh")
            if current is None or fresh:
                current = Session(page, fresh=fresh)
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


def test_failures_are_reported_per_session(tmp_path):
    sessions = sessions_of("x.md", "```python\na = 1\n```\n```python\nraise ValueError(a)\n```\n")
    sessions += sessions_of("y.md", "```python\nprint(a)\n```\n")           # no names from another page
    sessions += sessions_of("z.md", "```python\nimport os\nos._exit(3)\n```\n")  # the interpreter dies
    results = run_sessions(sessions, str(tmp_path))
    assert results["x.md:2"].startswith("the block at x.md:5 failed") and "ValueError: 1" in results["x.md:2"]
    assert "NameError: name 'a' is not defined" in results["y.md:2"]
    assert results["z.md:2"].startswith("the interpreter exited with 3")


def test_every_page_with_code_has_blocks_found():
    assert any(s.page == "README.md" for s in SESSIONS)


def run_sessions(sessions, folder):
    """{session id: "ok" or the failure} for sessions run one after the other in one new interpreter."""
    payload = [{"id": s.id, "page": s.page, "blocks": [{"line": line, "code": code} for line, code in s.blocks]}
               for s in sessions]
    results_path = os.path.join(folder, "results.json")
    env = dict(os.environ, TINN_ARCH="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", DRIVER, results_path], input=json.dumps(payload), cwd=folder,
                          env=env, capture_output=True, text=True, timeout=600)
    results = {}
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = json.load(f)
    for s in sessions:  # a session the interpreter did not finish: it crashed there
        results.setdefault(s.id, f"the interpreter exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    return results


@pytest.fixture(scope="module")
def shared_results(tmp_path_factory):
    shared = [s for s in SESSIONS if not s.skip and not s.fresh]
    return run_sessions(shared, str(tmp_path_factory.mktemp("docs_blocks")))


@pytest.mark.parametrize("session", SESSIONS, ids=[s.id for s in SESSIONS])
def test_code_block_runs(session, request, tmp_path):
    if session.skip:
        pytest.skip(session.skip)
    if session.fresh:
        result = run_sessions([session], str(tmp_path))[session.id]
    else:
        result = request.getfixturevalue("shared_results")[session.id]
    assert result == "ok", result
