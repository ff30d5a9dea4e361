"""tinn's modules import one another without a cycle, counting the imports inside functions too.

A cycle that is closed by an import inside a function still ties the modules' order of import to the
call order, and hides which module builds on which; the graph is parsed from the sources (no import
runs), relative imports resolved, and imports under `if TYPE_CHECKING:` left out (they never run)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "tinn"


def module_files(root=ROOT, package=PACKAGE):
    """{dotted module name: file path} for every .py file of the package."""
    found = {}
    for folder, _, files in os.walk(os.path.join(root, package)):
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            found[".".join(rel)] = os.path.join(folder, name)
    return found


def runtime_import_nodes(tree):
    """Import statements that can run: everywhere except under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(module, path, modules):
    """The package's modules that `module` (at `path`) imports: `from .x import y` gives x, or x.y when
    y is a module itself; a package's own __init__ only when the import names the package."""
    is_package = path.endswith("__init__.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in runtime_import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.add(alias.name)
            continue
        if node.level:
            parts = module.split(".")
            base_parts = parts if is_package else parts[:-1]
            base_parts = base_parts[:len(base_parts) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base.split(".")[0] != PACKAGE:
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in modules else base)
    found.discard(module)
    return {name for name in found if name in modules}


def import_graph(root=ROOT):
    modules = module_files(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_finder_reports_a_cycle_closed_inside_a_function(tmp_path):
    pkg = tmp_path / PACKAGE / "kernels"
    pkg.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    graph = import_graph(str(tmp_path))
    assert graph["tinn.kernels.b"] == {"tinn.kernels.a"}
    assert graph["tinn.kernels.c"] == set()
    assert find_cycle(graph) == ["tinn.kernels.a", "tinn.kernels.b", "tinn.kernels.a"]


def test_tinn_has_no_import_cycle():
    graph = import_graph()
    assert "tinn.kernels.mlp_array" in graph and graph["tinn.kernels.mlp_array"]  # the parse found edges
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
