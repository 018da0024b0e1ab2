"""SIGINT, SIGTERM and SIGHUP during ``perfscope trace`` (a real subprocess, against the profile
server stand-in of tests/profileserver.py, and over the suite's real sshd): "perfscope: interrupted"
once, exit 128 + the signal, the profiler stopped, the host's trace folder removed and the run
folder marked incomplete.

Not proven by a test of its own: Ctrl-C during the copy-back (it goes through the same cleanup as
the other interrupts).
"""

from __future__ import annotations

import json
import signal

import pytest
from clirun import invoke, one_line, popen
from profileserver import url_args, wait_for_call

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_signal_while_start_profile_has_not_answered_stops_the_profiler(profile_server, tmp_path, sig, code):
    """SIGTERM/SIGHUP left the profiler running, and Ctrl-C while /start_profile had not
    answered too: signal handlers (cli/__init__) unwind like Ctrl-C, and the profiler counts as
    armed from the moment /start_profile is sent."""
    H, port = profile_server
    H.start_delay = 4.0
    p = popen(["trace", *url_args(port, tmp_path), "--out", str(tmp_path / "o")])
    wait_for_call(H, "/start_profile")
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert one_line(err) == "perfscope: interrupted"
    assert "/stop_profile" in H.calls[H.calls.index("/start_profile"):]
    info = json.loads((tmp_path / "o" / "run.json").read_text())
    assert info["status"] == "incomplete"
    assert not list((tmp_path / "srv").iterdir())  # the host's trace folder was removed
    rc = invoke("diagnose", str(tmp_path / "o"))
    assert rc.returncode == 2 and "incomplete" in rc.stderr


def test_sigint_prints_interrupted(profile_server, tmp_path):
    """Ctrl-C printed no line: "perfscope: interrupted" once, exit 128 + the signal. (SIGINT
    during interpreter start-up, before perfscope's code runs, still ends as Python does.)"""
    H, port = profile_server
    H.start_delay = 3.0
    p = popen(["trace", *url_args(port, tmp_path), "--out", str(tmp_path / "o")])
    wait_for_call(H, "/start_profile")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and one_line(err) == "perfscope: interrupted"


def test_sigterm_over_ssh_stops_the_profiler_and_removes_the_host_folder(sshd, profile_server, tmp_path):
    """SIGTERM during an SSH trace: the profiler is stopped and the host folder removed."""
    H, port = profile_server
    H.start_delay = 4.0
    srv = tmp_path / "srv"
    srv.mkdir()
    p = popen(["trace", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "-i", str(sshd.user_key), "--known-hosts",
                  str(sshd.known_hosts), "--port", str(port), "--remote-dir", str(srv), "--steps", "2", "--output-len", "4",
                  "--input-len", "4", "--timeout", "30", "--out", str(tmp_path / "o")])
    wait_for_call(H, "/start_profile")
    assert list(srv.iterdir())  # the host folder exists while the profiler arms
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and one_line(err) == "perfscope: interrupted"
    assert "/stop_profile" in H.calls[H.calls.index("/start_profile"):]
    assert list(srv.iterdir()) == []
    assert json.loads((tmp_path / "o" / "run.json").read_text())["status"] == "incomplete"
