"""What a test does when something it runs against is not installed: under ``CI=true`` that is a
failure (CI installs everything: nothing skips there), elsewhere a skip that says how to install it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(why: str) -> NoReturn:
    """Fail (CI) or skip (elsewhere) the running test, saying ``why``."""
    if in_ci():
        pytest.fail(f"{why} (CI=true: nothing skips)")
    pytest.skip(why)


def module(name: str, why: str = "the test extra installs it"):
    """``import name``, or fail (CI) / skip (elsewhere, the whole module when called at its top)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        msg = f"{name} is not importable ({e}): {why}"
        if in_ci():
            pytest.fail(f"{msg} (CI=true: nothing skips)")
        pytest.skip(msg, allow_module_level=True)
