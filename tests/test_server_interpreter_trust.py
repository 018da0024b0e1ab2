"""perfscope asks the server's own interpreter for its versions (``trace``, ``fix --port``). The
server's argv[0], its VIRTUAL_ENV and /proc/PID/exe are the server's choices: run as the SSH user
(often root), a server of another, less privileged user would get that user's code run as root.
So an interpreter is run only when the process runs as this user and the interpreter (the path
and what it leads to) belongs to this user or root; else ``--python`` names it.

Real processes on a real port, found the way ``trace`` finds them (:class:`LocalHost`, ``ss``,
/proc): one runs as ``nobody`` (needs root to start; skipped otherwise, failed under CI=true)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from need import missing

from perfscope.remote.hostio import LocalHost

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # fresh virtual environments and servers

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
SERVE = ("import socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\n"
         "print(s.getsockname()[1],flush=True)\ntime.sleep(120)")


def _need(ok: bool, why: str):
    if not ok:
        missing(why)


@pytest.fixture
def venv_dir():
    """A folder every user can enter (pytest's tmp_path is root's 0700), with bin/python a link to
    the system interpreter; removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="perfscope-venv-", dir="/tmp"))
    d.chmod(0o755)
    (d / "bin").mkdir(mode=0o755)
    os.symlink(SYSTEM_PYTHON, d / "bin" / "python")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _serve(argv, env):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    port = int(p.stdout.readline())
    return p, port


def _swap_for_payload(path: Path, marker: Path, uid: int):
    """What the server's user does once the server runs: its interpreter path becomes a program
    that leaves ``marker`` (named after the uid it ran as)."""
    path.unlink()
    path.write_text(f"#!/bin/sh\ntouch {marker}-$(id -u)\nexit 1\n")
    path.chmod(0o755)
    os.lchown(path, uid, uid)


def _ran(marker: Path) -> list[str]:
    return sorted(p.name for p in marker.parent.glob(marker.name + "-*"))


def test_another_users_server_interpreter_is_never_run(venv_dir):
    _need(os.geteuid() == 0 and shutil.which("setpriv") and Path(SYSTEM_PYTHON).exists() and shutil.which("ss"),
          "needs root, setpriv, ss and /usr/bin/python3 to start a server as another user")
    for p in (venv_dir, venv_dir / "bin", venv_dir / "bin" / "python"):
        os.lchown(p, NOBODY, NOBODY)
    env = {"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": str(venv_dir)}
    proc, port = _serve(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                         str(venv_dir / "bin" / "python"), "-c", SERVE], env)
    try:
        marker = venv_dir / "ran"
        _swap_for_payload(venv_dir / "bin" / "python", marker, NOBODY)
        io = LocalHost()
        info = io.server_process(port)
        assert info.get("uid") == NOBODY and info.get("argv0") == str(venv_dir / "bin" / "python")
        cands = io.python_candidates(info)
        versions = io.python_versions(cands)
        assert _ran(marker) == []  # the server's user's program never ran (as root or as anyone)
        assert cands == ["python3"] and versions.get("python")  # this user's own python3 answered
        assert f"uid {NOBODY}" in info["python_note"] and "--python" in info["python_note"]
    finally:
        proc.kill()
        proc.wait()


def test_own_server_interpreter_is_run_unless_another_user_owns_it(venv_dir):
    _need(Path(SYSTEM_PYTHON).exists() and shutil.which("ss"), "needs ss and /usr/bin/python3")
    env = {"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": str(venv_dir)}
    proc, port = _serve([str(venv_dir / "bin" / "python"), "-c", SERVE], env)
    try:
        io = LocalHost()
        info = io.server_process(port)
        assert info.get("uid") == os.geteuid()
        cands = io.python_candidates(dict(info))
        # this user's server, this user's (or root's) interpreter: asked first, as before
        assert cands[0] == str(venv_dir / "bin" / "python") and f"/proc/{info['pid']}/exe" in cands
        if os.geteuid() == 0:
            # the same server, but its interpreter's path now belongs to another user: not run
            marker = venv_dir / "ran"
            _swap_for_payload(venv_dir / "bin" / "python", marker, NOBODY)
            again = dict(info)
            cands = io.python_candidates(again)
            io.python_versions(cands)
            assert str(venv_dir / "bin" / "python") not in cands and _ran(marker) == []
            assert "another user owns" in again["python_note"]
    finally:
        proc.kill()
        proc.wait()


def test_interpreter_of_an_unknown_owner_is_not_run():
    """No uid known for the process (it was not visible): nothing it chose is run."""
    info = {"pid": os.getpid(), "argv0": sys.executable, "exe": sys.executable}
    cands = LocalHost().python_candidates(info)
    assert cands == ["python3"] and "--python" in info["python_note"]
