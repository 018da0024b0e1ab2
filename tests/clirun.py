"""The one way the tests run perfscope's CLI (tests/ is on sys.path).

- ``invoke(*args, cwd=, env=)``: in this process, through ``perfscope.cli.main`` (the console
  script's own entry point: the same exit codes and one-line errors), stdout and stderr captured
  as a pipe would take them; a ``Result`` with ``CompletedProcess``'s fields that also unpacks as
  ``rc, out, err``. The fast way (no interpreter start-up, no imports), for every test that is not
  about the process itself.
- ``run(*args, cwd=, env=, ...)``: ``python -m perfscope ARGS`` in a subprocess, a
  ``CompletedProcess`` with text output: the same call, for what only a process shows (signals,
  pipes, file descriptors, the interpreter's start-up and exit, state a command leaves behind).
- ``popen(args, ...)``: the same started and left running (a test that signals it or reads it as it goes).
- ``one_line(err)``: the one ``perfscope:`` line an error takes, asserting there is exactly one and
  no traceback (progress lines may come before it); ``error_line(r, code)``: a failed run's whole
  stderr is that one line.

A subprocess imports perfscope from this checkout (``PYTHONPATH`` starts with the repository), not
from wherever the virtual environment's install points.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from typing import NamedTuple

from paths import REPO

from perfscope.cli import main


class Result(NamedTuple):
    """What a run of the CLI gave: ``subprocess.CompletedProcess``'s fields (text output, newlines
    as ``text=True`` translates them); unpacks as ``rc, out, err``."""

    returncode: int
    stdout: str
    stderr: str


def _text(raw: bytes) -> str:
    return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as subprocess's text=True reads a pipe


def _capture() -> io.TextIOWrapper:
    # what a piped stdout is in a subprocess under the C.UTF-8 locale (not a terminal)
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape", write_through=True)


@contextlib.contextmanager
def _environment(env: dict | None, cwd):
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(saved_env)


def invoke(*args, cwd=None, env: dict | None = None, input: str | None = None) -> Result:
    """``perfscope ARGS`` in this process, through the console script's entry point: exit code,
    stdout and stderr as a subprocess gives them (``env`` replaces the environment for the call,
    ``cwd`` is the working directory, ``input`` stdin's text)."""
    out, err = _capture(), _capture()
    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
    with _environment(env, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        saved_stdin, sys.stdin = sys.stdin, stdin
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.stdin = saved_stdin
    out.flush()
    err.flush()
    return Result(code, _text(out.buffer.getvalue()), _text(err.buffer.getvalue()))


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


def error_line(r, code: int = 2) -> str:
    """The whole of a failed run's stderr (a ``Result`` or ``CompletedProcess``): exit ``code`` and one
    line, ``perfscope: error: ...``, nothing else."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("perfscope: error:"), r.stderr
    return lines[0]
