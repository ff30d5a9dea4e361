"""README.md and the user pages of docs/ use only tinn's supported names (no internals).

The supported names are those of `tinn.__all__`, the modules reachable as `tinn.<name>` after `import tinn`, and,
inside each of those, the names its `__all__` lists (a subpackage's `__all__` may list its modules too). A module
without `__all__` offers its names without a leading underscore. Internals are everything else: `tinn.kernels`
and modules not reachable from `tinn`, private names, and names a module's `__all__` leaves out. Every `tinn.`
reference in a python block of those pages is checked (imports, attribute chains), and so are dotted `tinn.` names in
inline code and `python -m` commands. (Paths of source files, `tinn/...py`, point readers at the implementation and
are not uses.)
docs/design-notes.md and docs/performance.md describe the implementation and are left out, as is the API
reference (generated from the code)."""
import ast
import glob
import importlib
import os
import pkgutil
import re

import pytest

import tinn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLEMENTATION_PAGES = {"docs/design-notes.md", "docs/performance.md"}


def user_pages():
    found = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                                recursive=True))
    return [p for p in found if p not in IMPLEMENTATION_PAGES and not p.startswith("docs/api/")]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^\s*```python\n(.*?)^\s*```", text, flags=re.M | re.S)


def public_modules() -> set[str]:
    """Modules a user may name: tinn, the modules reachable as `tinn.<name>`, the subpackages of a public package
    (each lists its names), and the modules a public package's `__all__` lists."""
    found = {"tinn"}
    todo = [f"tinn.{name}" for name in dir(tinn)
            if not name.startswith("_") and type(getattr(tinn, name)).__name__ == "module"]
    while todo:
        name = todo.pop()
        if name in found or name == "tinn.kernels":
            continue
        found.add(name)
        module = importlib.import_module(name)
        if hasattr(module, "__path__"):
            listed = set(getattr(module, "__all__", []))
            todo += [f"{name}.{m.name}" for m in pkgutil.iter_modules(module.__path__) if m.ispkg or m.name in listed]
    return found


PUBLIC_MODULES = public_modules()


def supported(module_name: str, attr: str) -> bool:
    """Whether `attr` of the public module `module_name` is a supported name."""
    if attr.startswith("_") and attr != "__version__":
        return False
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        return hasattr(module, attr) or f"{module_name}.{attr}" in PUBLIC_MODULES
    return attr in names or f"{module_name}.{attr}" in PUBLIC_MODULES


def internal_uses(code: str) -> list[str]:
    """The internals `code` (one python block) names, as dotted paths."""
    found = []

    def check_path(path: str) -> None:
        """`path`, a dotted reference starting at tinn: each step must be a public module or a supported name."""
        parts = path.split(".")
        module = "tinn"
        for part in parts[1:]:
            step = f"{module}.{part}"
            if step in PUBLIC_MODULES:
                module = step
                continue
            if not supported(module, part):
                found.append(step)
            return  # past the module: attributes of a supported object are its own business

    tree = ast.parse(code)
    aliases = {}  # local name -> dotted tinn path
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tinn":
                    if alias.name not in PUBLIC_MODULES:
                        found.append(alias.name)
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "tinn"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tinn":
            if node.module not in PUBLIC_MODULES:
                found.append(node.module)
                continue
            for alias in node.names:
                check_path(f"{node.module}.{alias.name}")
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = []
            inner = node
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and aliases.get(inner.id) in PUBLIC_MODULES:
                check_path(".".join([aliases[inner.id]] + chain[::-1]))
    return sorted(set(found))


def test_the_checker_finds_internals():
    assert internal_uses("import tinn\ntinn.kernels.mlp_fused.forward(1)") == ["tinn.kernels"]
    assert internal_uses("from tinn.networks.array import NetworkArray") == ["tinn.networks.array"]
    assert internal_uses("import tinn.torch as tcnn\ntcnn._FlatGradient") == ["tinn.torch._FlatGradient"]
    assert internal_uses("from tinn import settings\nsettings._current") == ["tinn.settings._current"]
    assert internal_uses("import tinn\ntinn.scenes.data.posed_images.PosedImages") == ["tinn.scenes.data.posed_images"]
    assert internal_uses("import tinn\ntinn.scenes.data.mesh._read_mtl") == ["tinn.scenes.data.mesh._read_mtl"]
    assert internal_uses("import tinn, torch\nnet = tinn.NetworkArray(2, 2)\nnet.forward_with_context\n"
                         "tinn.runtime.device()\nfrom tinn.encodings import GridEncoding") == []


@pytest.mark.parametrize("page", user_pages())
def test_user_pages_use_no_internals(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    used = sorted({name for block in python_blocks(text) for name in internal_uses(block)})
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for code in re.findall(r"`([^`\n]+)`", prose):
        for ref in re.findall(r"\btinn(?:\.[A-Za-z_]\w*)+", code):
            used += internal_uses(f"import tinn\n{ref}")
    used += [m for m in re.findall(r"python -m (tinn[\w.]*)", text) if m not in PUBLIC_MODULES]
    assert not used, f"{page} uses tinn's internals: {used}"
