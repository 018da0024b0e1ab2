"""``trace`` over SSH leaves the host as it found it: a folder with 10,000 traces is checked in
batches that fit OpenSSH's packet limit, the profiler is stopped over a fresh connection when the
first one dies, and the host folder goes after a successful trace whatever else is in it.

Against the suite's real OpenSSH server (tests/sshd.py) and the profile-API stand-in of
tests/test_server_bounds.py (a real SGLang needs a GPU; the stand-in writes a real trace).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from clirun import one_line, popen
from paths import REPO, TRACELENS, gz_bytes
from profileserver import wait_for_call
from test_server_bounds import hostile  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("no_agent")
SMALL = TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.xz"


def _ssh_trace(sshd, port, srv, out, timeout="40") -> subprocess.Popen:
    return popen(["trace", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "-i", str(sshd.user_key), "--known-hosts",
                  str(sshd.known_hosts), "--port", str(port), "--remote-dir", str(srv), "--steps", "2", "--output-len", "4",
                  "--input-len", "4", "--timeout", timeout, "--out", str(out)], cwd=REPO)


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def test_ten_thousand_traces_are_checked_in_batches_over_one_connection(sshd, tmp_path):
    """One ``python3 -c SCRIPT path1 ... path10000`` exceeded OpenSSH's packet limit and sshd dropped
    the connection; in batches, every file is checked and the connection lives on."""
    from perfscope.remote.hostio import SSHHost
    from perfscope.remote.ssh import connect

    d = tmp_path / "many"
    d.mkdir()
    paths = []
    gz = tmp_path / "small.trace.json.gz"  # gzipped, as SGLang writes its traces
    gz.write_bytes(gz_bytes(SMALL))
    for i in range(10_000):
        p = d / f"host-{i:05d}-TP-0.trace.json.gz"
        os.link(gz, p)
        paths.append(str(p))
    cut = d / "cut-TP-0.trace.json.gz"
    cut.write_bytes(gz.read_bytes()[:-100])
    with connect(sshd.target()) as s:
        io = SSHHost(s)
        assert io.incomplete(paths + [str(cut)]) == [str(cut)]
        assert io.alive() and io.run(["true"]).ok


def test_profiler_stopped_over_a_fresh_connection_when_ssh_dies(sshd, hostile, tmp_path):
    """The SSH connection dies while /start_profile is in flight (its sshd process killed): the
    profiler is still stopped, over a fresh connection, and the host folder removed."""
    H, port = hostile
    H.mode = "slow_start"
    srv = tmp_path / "srv"
    srv.mkdir()
    before = set(_children(sshd.proc.pid))
    p = _ssh_trace(sshd, port, srv, tmp_path / "o")
    wait_for_call(H, "/start_profile")
    assert list(srv.iterdir())
    for pid in set(_children(sshd.proc.pid)) - before:
        os.kill(pid, signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    line = one_line(err)
    assert p.returncode == 3, err
    assert "fresh one" in err and line
    assert "/stop_profile" in H.calls[H.calls.index("/start_profile"):]
    assert list(srv.iterdir()) == []


def test_host_folder_removed_after_success_with_links_and_fifos_in_it(sshd, hostile, tmp_path):
    """After a successful trace the host folder was left when it held anything but the traces (a
    link, a FIFO): perfscope's own folder is now removed whole (not the link's target)."""
    H, port = hostile
    H.mode = "debris"
    srv = tmp_path / "srv"
    srv.mkdir()
    keep = tmp_path / "keep.txt"
    keep.write_text("not perfscope's")
    H.link_to = str(keep)
    p = _ssh_trace(sshd, port, srv, tmp_path / "o")
    _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    assert list(srv.iterdir()) == []
    assert keep.read_text() == "not perfscope's"
    assert list((tmp_path / "o" / "traces").iterdir())


@pytest.fixture
def full_fs(tmp_path):
    """A real 256 KiB tmpfs, filled (this suite runs as root; the test fails, not skips, when it cannot mount)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"cannot mount a tmpfs for the full-disk test: {r.stderr}"
    try:
        with open(mnt / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError:
        pass
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("how", ["url", "ssh"])
def test_disk_full_during_the_copy_names_the_local_path(sshd, hostile, tmp_path, full_fs, how):
    """A full disk while a trace is copied here said "No space left on device" and no path."""
    H, port = hostile
    srv = tmp_path / "srv"
    srv.mkdir()
    out = full_fs / "o"
    if how == "ssh":
        p = _ssh_trace(sshd, port, srv, out)
    else:
        p = popen(["trace", "--url", f"http://127.0.0.1:{port}", "--remote-dir", str(srv), "--steps", "2", "--output-len",
                   "4", "--input-len", "4", "--timeout", "40", "--out", str(out)], cwd=REPO)
    _, err = p.communicate(timeout=180)
    line = one_line(err)
    assert p.returncode == 2 and str(out / "traces" / "1700000000-TP-0.trace.json.gz") in line, err
    assert "No space left" in line
    assert list(srv.iterdir()) == []
