"""``perfscope trace`` against the profile server stand-in (tests/profileserver.py) where the
server is slow, fails or echoes secrets: the waits are bounded, the error is one line with its
class, the API key never shows, and the run folder is complete (relative --out included) or says
"incomplete", with the host's trace folder removed either way.
"""

from __future__ import annotations

import json
import time

import pytest
from clirun import invoke, one_line, popen
from profileserver import url_args

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


def test_trace_with_relative_out_writes_its_run_folder(profile_server, tmp_path):
    """A relative --out (and the default run folder) was joined onto itself after profiling
    (FileNotFoundError, no run.json, the host folder left): out paths are made absolute once."""
    H, port = profile_server
    p = popen(["trace", *url_args(port, tmp_path), "--out", "run1"], cwd=tmp_path)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    info = json.loads((tmp_path / "run1" / "run.json").read_text())
    assert info["files"] and (tmp_path / "run1" / info["files"][0]["path"]).is_file()
    assert not list((tmp_path / "srv").iterdir())  # the host's trace folder is gone


def test_start_profile_wait_is_bounded_by_timeout(profile_server, tmp_path):
    """The wait for /start_profile was a fixed 120 s: it is min(120 s, --timeout), and
    /stop_profile after the failure is bounded too."""
    H, port = profile_server
    H.start_delay = 60.0
    args = url_args(port, tmp_path)
    args[args.index("--timeout") + 1] = "1"  # the option's least
    t0 = time.monotonic()
    rc, _, err = invoke("trace", *args, "--out", str(tmp_path / "o"))
    # bounded: well before the server's 60 s answer (the stop that follows has its own short timeout; on a
    # loaded 2-core CI box the whole run took 20-26 s, so the bound is not a speed claim, only "not 60 s")
    assert time.monotonic() - t0 < 45
    assert rc == 3 and "timed out" in err
    assert "/stop_profile" in H.calls


def test_several_hosts_and_an_http_error_give_one_line(profile_server, tmp_path):
    """Several hosts and an HTTP error from one host's /start_profile gave a TypeError (the
    error was re-raised as type(e)(msg, hint=...)): it is re-raised with its class and fields."""
    from perfscope.capture.options import TraceOptions
    from perfscope.capture.trace import Endpoint, trace
    from perfscope.remote.sglang_api import HTTPStatusError

    H, port = profile_server
    H.start_status, H.start_body = 500, b'{"error": "boom"}'
    srv = tmp_path / "srv"
    srv.mkdir()
    opts = TraceOptions(steps=2, output_len=4, input_len=4, timeout=10, remote_dir=str(srv))
    eps = [Endpoint(url=f"http://127.0.0.1:{port}"), Endpoint(url=f"http://localhost:{port}")]
    with pytest.raises(HTTPStatusError) as ei:
        trace(eps, opts, tmp_path / "o", command=["perfscope", "trace"], log=lambda m: None)
    assert ei.value.status == 500 and "HTTP 500" in str(ei.value) and "\n" not in str(ei.value)
    assert json.loads((tmp_path / "o" / "run.json").read_text())["status"] == "incomplete"


def test_api_key_echoed_by_the_server_is_redacted(profile_server, tmp_path, monkeypatch):
    """A server or proxy echoing the Authorization header put the API key in the one-line error:
    errors.register_secret/redact cut it out of every PerfscopeError and trace log line."""
    H, port = profile_server
    H.start_status, H.echo_auth = 500, True
    monkeypatch.setenv("PS_KEY", "SEKRIT-0123456789")
    rc, out, err = invoke("trace", *url_args(port, tmp_path), "--api-key-env", "PS_KEY", "--out", str(tmp_path / "o"))
    assert rc == 3
    line = one_line(err)
    assert "SEKRIT" not in line + out and "Bearer ***" in line


def test_a_failed_trace_leaves_no_host_folder_and_an_incomplete_run_folder(profile_server, tmp_path):
    """A failed or interrupted trace left the host's perfscope-trace.* folder and a run folder
    without run.json: the host folder is removed (rm -rf of perfscope's own mktemp folder) and
    run.json says "status": "incomplete" (read_run refuses it)."""
    H, port = profile_server
    H.write_trace = False  # the profile never completes
    args = url_args(port, tmp_path)
    args[args.index("--timeout") + 1] = "1"  # the option's least
    rc, _, err = invoke("trace", *args, "--out", str(tmp_path / "o"))
    assert rc == 3 and "did not complete" in one_line(err)
    assert "/stop_profile" in H.calls
    assert list((tmp_path / "srv").iterdir()) == []
    info = json.loads((tmp_path / "o" / "run.json").read_text())
    assert info["status"] == "incomplete" and "did not complete" in info["incomplete_reason"]
    rc, _, err = invoke("diagnose", str(tmp_path / "o"))
    assert rc == 2 and "incomplete run folder" in one_line(err)
