"""The README stays a front page: short, and every link into the docs resolves to a file."""
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_is_at_most_250_lines():
    assert len(readme().splitlines()) <= 250


def test_readme_links_resolve():
    targets = re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)", readme())
    assert targets, "the README links into the docs"
    missing = [t for t in targets if not os.path.exists(os.path.join(ROOT, t))]
    assert not missing, f"README links to missing files: {missing}"
