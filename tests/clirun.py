"""The one way the tests run perfscope's CLI (tests/ is on sys.path).

- ``invoke(argv, capsys)``: in-process, through ``perfscope.cli.main`` (the console script's own
  entry point: the same exit codes and one-line errors), with pytest's ``capsys`` capturing;
  returns ``(exit code, stdout, stderr)``. The fast way, for every test that is not about the process.
- ``run(*args, ...)``: ``python -m perfscope ARGS`` in a subprocess, ``CompletedProcess`` with text
  output. For what only a process shows: signals, pipes, stdin, the working directory, the
  environment at start-up, the interpreter's exit.
- ``popen(args, ...)``: the same started and left running (a test that signals it or reads it as it goes).
- ``one_line(err)``: the one ``perfscope:`` line an error takes, asserting there is exactly one and
  no traceback.

A subprocess imports perfscope from this checkout (``PYTHONPATH`` starts with the repository), not
from wherever the virtual environment's install points.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from paths import REPO

from perfscope.cli import main


def invoke(argv, capsys) -> tuple[int, str, str]:
    """``perfscope ARGV`` in this process: (exit code, stdout, stderr) as captured by ``capsys``."""
    with pytest.raises(SystemExit) as ei:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return ei.value.code or 0, out, err


def env_of(env: dict | None = None, **extra: str) -> dict:
    """The environment a perfscope subprocess gets: ``env`` (default: this one) and ``extra``, with
    this checkout first on ``PYTHONPATH``."""
    e = {**(os.environ if env is None else env), **extra}
    rest = e.get("PYTHONPATH", "")
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + rest if rest and rest != str(REPO) else "")
    return e


def command(*args) -> list[str]:
    """The argv of ``perfscope ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "perfscope", *map(str, args)]


def run(*args, cwd=None, env: dict | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``perfscope ARGS`` in a subprocess (text output captured; ``kw`` goes to ``subprocess.run``:
    ``input``, ``stdin``, ...)."""
    return subprocess.run(command(*args), capture_output=True, text=True, cwd=cwd, env=env_of(env), timeout=timeout,
                          **kw)


def popen(args, cwd=REPO, env: dict | None = None, **kw) -> subprocess.Popen:
    """``perfscope ARGS`` started in a subprocess, its stdout and stderr piped as text."""
    return subprocess.Popen(command(*args), cwd=cwd, env=env_of(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def one_line(err: str) -> str:
    """The one line perfscope's verdict takes (progress lines of a trace may come before it)."""
    lines = [ln for ln in err.splitlines() if ln.startswith("perfscope:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Exception (client)" not in err
    return lines[0]
