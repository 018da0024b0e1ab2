"""`pytest -m "not slow"` runs on several processes: tests/conftest.py's pytest_cmdline_main turns on
pytest-xdist for exactly that selection (one module per process); `-n 0`, `-p no:xdist` and every other
selection run in one process, the whole suite included (its real engines, sshd and Chromium start once)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paths import REPO

pytestmark = pytest.mark.slow  # three pytest sessions of their own (~10 s)

ONE = "tests/test_names.py::test_names_without_an_entry_point_keep_their_short_form"


def _session(*args: str) -> str:
    # the outer session's PYTEST_* variables (an xdist worker's name, PYTEST_ADDOPTS) would change the inner one
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", ONE, *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_only_the_fast_selection_runs_on_several_processes():
    assert "bringing up nodes" in _session("-m", "not slow")
    assert "bringing up nodes" not in _session("-m", "not slow", "-n", "0")
    assert "bringing up nodes" not in _session()  # the whole suite's selection: one process
