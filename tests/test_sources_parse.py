"""Every Python file the repository ships parses: benchmarks, tools and demos run only on a GPU machine or by
hand, so a syntax error there would otherwise surface only when someone needs the script."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("tinn", "benchmarks", "demos", "tests", "docs", ".ci")


def python_files():
    for top in FOLDERS:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
            for name in files:
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def test_the_walk_finds_the_packages_files():
    found = set(python_files())
    assert os.path.join("tinn", "__init__.py") in found
    assert os.path.join("benchmarks", "profile_image.py") in found


def test_every_source_parses():
    errors = []
    for path in sorted(python_files()):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            source = f.read()
        try:
            ast.parse(source, filename=path)
        except SyntaxError as e:
            errors.append(f"{path}:{e.lineno}: {e.msg}")
    assert not errors, "\n".join(errors)
