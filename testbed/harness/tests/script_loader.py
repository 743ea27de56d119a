"""The repository's standalone scripts (under ``scripts/``), loaded as modules for their
tests: they are entry points, not parts of a package."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from polycorn_harness import ROOT


def load_script(name: str, rel: str) -> ModuleType:
    """The script at ``rel`` (from the repository root), imported as module ``name``, with
    its own folder on the import path as when it runs (it may import its neighbours)."""
    folder = str((ROOT / rel).parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
