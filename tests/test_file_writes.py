"""Where perfscope writes a report: util/files.atomic_writer replaces only new or regular files,
writes character devices and FIFOs in place, writes a symlink's target and refuses a socket; a
write error (a full device) is one line, exit 2.
"""

from __future__ import annotations

import os
import stat
import threading

import pytest
from clirun import invoke, one_line
from profileserver import SMALL

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


@pytest.mark.parametrize("dev", ["/dev/null", "/dev/full"])
def test_report_onto_a_device_node_never_replaces_it(dev):
    """`report -o /dev/full` (or /dev/null) renamed a temp file over the device:
    util/files.atomic_writer replaces only new or regular files and writes character devices and
    FIFOs in place."""
    before = os.stat(dev)
    rc, out, err = invoke("report", str(SMALL), "-o", dev)
    after = os.stat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    if dev == "/dev/null":
        assert rc == 0, err
    else:
        assert rc == 2 and "No space left" in one_line(err)
    assert not [p for p in os.listdir("/dev") if p.startswith(".null.") or p.startswith(".full.")]


def test_writer_rules_fifo_symlink_socket(tmp_path):
    """The writer's rules: a FIFO written in place, a symlink's target written (the link stays),
    a socket refused."""
    import socket

    from perfscope.errors import InputError
    from perfscope.util.files import atomic_write_text

    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    t = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    t.start()
    atomic_write_text(fifo, "through the pipe")
    t.join(10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    sock = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    with pytest.raises(InputError, match="socket"):
        atomic_write_text(sock, "x")
    s.close()


def test_markdown_onto_a_full_device_is_one_line_exit_2():
    """--markdown /dev/full: the write error is one line, exit 2."""
    rc, _, err = invoke("diagnose", str(SMALL), "--markdown", "/dev/full")
    assert rc == 2 and "No space left" in one_line(err)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
