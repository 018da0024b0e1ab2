"""Exit codes a script can rely on: bad input is 2 (not 3, the remote's), a broken pipe is 0 and
quiet, a bug is 70 with one line (never 1, the code of a gated finding).
"""

from __future__ import annotations

import shlex
import subprocess

import pytest
from clirun import command, env_of, invoke, one_line
from profileserver import SMALL

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


def test_bad_port_and_missing_identity_are_exit_2(tmp_path):
    """A missing identity file and --host h:99999 exited 3 (remote): they are bad input, exit 2."""
    rc, _, err = invoke("trace", "--host", "gpu:99999", "--out", str(tmp_path / "o"))
    assert rc == 2 and "bad port" in one_line(err)
    rc, _, err = invoke("trace", "--host", "127.0.0.1:22", "-i", str(tmp_path / "nope"), "--known-hosts", str(tmp_path / "kh"),
                          "--out", str(tmp_path / "o2"))
    assert rc == 2 and "does not exist" in one_line(err)


def test_broken_pipe_exits_quietly(tmp_path):
    """`diagnose ... | head -1` exited 1 through click's EPIPE path: a broken pipe is exit 0,
    quiet."""
    r = subprocess.run(f"{shlex.join(command('diagnose', SMALL, '--json'))} | head -c 10",
                       shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash",
                       env=env_of())
    r2 = subprocess.run(f"set -o pipefail; {shlex.join(command('diagnose', SMALL, '--json'))} | head -c 10 >/dev/null",
                        shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash",
                        env=env_of())
    assert r.stderr == "" and r2.returncode == 0, r2.stderr


def test_unexpected_exception_is_exit_70_one_line(tmp_path, monkeypatch):
    """A bug is exit 70 with one line (PERFSCOPE_DEBUG=1 prints the traceback), never exit 1,
    the exit code of a gated finding."""
    import perfscope.load.reader as reader

    def boom(*a, **k):
        raise ZeroDivisionError("a bug")
    # both ways the reader decodes a file: in pieces, and whole (the layouts the pieces do not cover)
    monkeypatch.setattr(reader, "_stream", boom)
    monkeypatch.setattr(reader, "parse", boom)
    rc, _, err = invoke("diagnose", str(SMALL), "--workers", "1")
    assert rc == 70 and "internal error, run with PERFSCOPE_DEBUG=1 for the traceback" in one_line(err)
    monkeypatch.setenv("PERFSCOPE_DEBUG", "1")
    rc, _, err = invoke("diagnose", str(SMALL), "--workers", "1")
    assert rc == 70 and "Traceback" in err and "ZeroDivisionError" in err
