"""Commands perfscope runs on a host (remote/hostio, remote/ssh): a hung command is killed with its
whole process group, locally and over the suite's real sshd; a command that cannot start is a
result (rc 126), not a traceback.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


def _alive(tag: str) -> list[str]:
    r = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True)
    return r.stdout.split()


def test_hung_restart_cmd_is_killed_by_process_group_locally():
    """A hung --restart-cmd was left running (subprocess.run killed only the outer sh):
    LocalHost.run gives it its own process group and kills the group (TERM, then KILL)."""
    from perfscope.errors import RemoteError
    from perfscope.remote.hostio import LocalHost

    with pytest.raises(RemoteError, match="timed out"):
        LocalHost().run(["sh", "-c", "sleep 771.25 & sleep 771.25; true"], timeout=1)
    time.sleep(0.5)
    assert _alive("sleep 771.25") == []


def test_hung_command_is_killed_by_process_group_on_the_host(sshd):
    """The same over SSH (only the channel was closed): SSHSession.run learns the remote process
    group and kills it (kill -- -PGID)."""
    from perfscope.errors import RemoteError
    from perfscope.remote.ssh import connect

    with connect(sshd.target()) as s:
        with pytest.raises(RemoteError, match="timed out"):
            s.run(["sh", "-c", "sleep 772.5 & sleep 772.5; true"], timeout=1)
        r = s.run(["true"])  # stderr carries no pid line
        assert r.ok and r.stderr == ""
    deadline = time.monotonic() + 10
    while _alive("sleep 772.5") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive("sleep 772.5") == []


def test_local_command_unrunnable_is_a_result_not_a_traceback(tmp_path):
    """A PATH entry the user cannot enter made LocalHost.run raise PermissionError: any OSError
    is a result with rc 126."""
    from perfscope.remote.hostio import LocalHost

    d = tmp_path / "noexec"
    d.mkdir()
    (d / "tool").write_text("#!/bin/sh\n")
    os.chmod(d / "tool", 0o644)  # not executable: PermissionError from exec
    r = LocalHost().run([str(d / "tool")])
    assert r.rc == 126 and "ermission" in r.stderr
