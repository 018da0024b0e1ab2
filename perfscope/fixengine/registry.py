"""Discover fix modules: every folder of the top-level ``fixes/`` with an ``__init__.py`` that
defines ``FIX``. Adding a fix is adding a folder (its name is the id with ``-`` -> ``_``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Optional

from perfscope.errors import InputError
from perfscope.fixengine.model import FixModule
from perfscope.util.files import resource_dir

_CACHE: dict[str, FixModule] = {}


def _load(folder: Path) -> Optional[FixModule]:
    name = f"perfscope_fixes.{folder.name}"
    if name in sys.modules:
        mod = sys.modules[name]
    else:
        spec = importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        if spec is None or spec.loader is None:
            return None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception:
            del sys.modules[name]
            raise
    fix = getattr(mod, "FIX", None)
    if not isinstance(fix, FixModule):
        return None
    fix.folder = folder
    return fix


def discover(root: Optional[Path] = None) -> dict[str, FixModule]:
    if root is None and _CACHE:
        return dict(_CACHE)
    root = root or resource_dir("fixes")
    found: dict[str, FixModule] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()):
        fix = _load(folder)
        if fix is None:
            continue
        if fix.id.replace("-", "_") != folder.name:
            raise InputError(
                f"fix folder {folder.name} defines id {fix.id!r}: the folder must be named {fix.id.replace('-', '_')}"
            )
        found[fix.id] = fix
    if root is None or root == resource_dir("fixes"):
        _CACHE.update(found)
    return found


def get(fix_id: str) -> FixModule:
    fixes = discover()
    fix = fixes.get(fix_id) or fixes.get(fix_id.replace("_", "-"))
    if fix is None:
        known = ", ".join(sorted(fixes)) or "none"
        raise InputError(f"unknown fix {fix_id!r} (known: {known}; list them with perfscope fix --list)")
    return fix
