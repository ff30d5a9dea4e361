"""Import a file of the repository that is not part of a package (a demo script, a test helper) by its path."""
from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_file(relative_path: str):
    """The module in `relative_path` (from the repository root), imported under its plain file name, as the
    demos and tests import one another. Loaded once: later calls, and plain imports of the same name,
    get the same module."""
    path = os.path.join(ROOT, relative_path)
    name = os.path.splitext(os.path.basename(path))[0]
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.samefile(getattr(loaded, "__file__", None) or os.devnull, path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: a module that imports itself back finds it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
