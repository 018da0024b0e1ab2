"""A hostile inference server cannot make ``perfscope trace`` take all memory or hang: every reply
is bounded in size (``PERFSCOPE_MAX_REPLY_MB``), every request in total time (the timeout, or
``PERFSCOPE_HTTP_DEADLINE_S``), each stream line in time and size; the result is one line, exit 3,
and the profiler is stopped when it was armed.

The server is a small HTTP stand-in speaking SGLang's profile API (a real SGLang cannot be made
to send an endless body or trickle its bytes): on /start_profile it writes a real trace from
tests/traces/corpus into the requested folder, as SGLang would. perfscope runs in a real subprocess,
so that its memory and its wall time are its own.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clirun import one_line
from net import StubHandler
from paths import REPO, TRACELENS, gz_bytes
from profileserver import stream_four_tokens

SMALL = TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.xz"
SMALL_GZ = gz_bytes(SMALL)  # as SGLang writes a trace
INFO = json.dumps({"version": "0.4.6", "tp_size": 1, "model_path": "stub"}).encode()


class _Hostile(StubHandler):
    protocol_version = "HTTP/1.1"
    calls: list = []
    mode = ""
    link_to = "/etc/hostname"

    def _endless(self, first: bytes, unit: bytes, pause: float = 0.0) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if first.startswith(b"data:") else "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(first)
            while True:
                self.wfile.write(unit)
                self.wfile.flush()
                if pause:
                    time.sleep(pause)
        except OSError:
            return  # perfscope hung up: the point

    def do_GET(self):
        self.calls.append(self.path)
        if self.path in ("/server_info", "/get_server_info"):
            if self.mode == "endless_info":
                return self._endless(b'{"version": "0.4.6", "x": "', b"x" * 65536)
            if self.mode == "huge_length_info":
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 40))
                self.end_headers()
                return
            if self.mode == "trickle_info":
                return self._endless(b"", b" ", pause=0.2)
            return self._send(200, INFO)
        self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else {}
        self.calls.append(self.path)
        if self.path == "/start_profile":
            out = Path(body.get("output_dir", "/nonexistent"))
            if self.mode == "slow_start":
                time.sleep(4)
            if out.is_dir() and self.mode not in ("endless_sse", "trickle_sse", "slow_start"):
                (out / "1700000000-TP-0.trace.json.gz").write_bytes(SMALL_GZ)
            if out.is_dir() and self.mode == "debris":  # what else a server or a user may leave there
                os.symlink(self.link_to, out / "a-link")
                os.mkfifo(out / "a-fifo")
                (out / "sub").mkdir()
                (out / "sub" / "x").write_text("x")
            return self._send(200, b'{"ok": true}')
        if self.path == "/stop_profile":
            return self._send(200, b'{"ok": true}')
        if self.path == "/generate":
            if self.mode == "endless_sse":
                return self._endless(b"data: {\"text\": \"", b"y" * 65536)
            if self.mode == "trickle_sse":
                return self._endless(b"data: ", b"z", pause=0.5)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            return stream_four_tokens(self.wfile)
        self._send(404, b'{"error": "not found"}')


@pytest.fixture
def hostile():
    class H(_Hostile):
        calls = []

    class Quiet(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass

    httpd = Quiet(("127.0.0.1", 0), H)
    # a short poll, so that shutdown() at teardown returns in ~0.05 s instead of the default 0.5 s
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield H, httpd.server_address[1]
    httpd.shutdown()


def _trace(port, tmp_path, env=None, timeout="60"):
    """``perfscope trace --url`` in a subprocess; returns (rc, stderr, seconds, peak RSS in MB)."""
    srv = tmp_path / "srv"
    srv.mkdir(exist_ok=True)
    # the address space is capped at 3 GB, so that a client without the bounds fails (MemoryError,
    # exit 70) instead of taking the machine's memory. The peak is VmHWM, this process image's own
    # high-water mark: getrusage's ru_maxrss carries over the forking parent's peak through exec
    # (Linux keeps it in the signal struct), and pytest grows past 1 GB in a whole run
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from perfscope.cli import main\n"
            "try:\n    main()\nfinally:\n"
            "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
            "    print('peak-rss-kb', hwm[0].split()[1], file=sys.stderr)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code, "trace", "--url", f"http://127.0.0.1:{port}", "--remote-dir", str(srv),
                        "--steps", "2", "--output-len", "4", "--input-len", "4", "--timeout", timeout,
                        "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    secs = time.monotonic() - t0
    rss = [ln for ln in p.stderr.splitlines() if ln.startswith("peak-rss-kb")]
    err = "\n".join(ln for ln in p.stderr.splitlines() if not ln.startswith("peak-rss-kb"))
    return p.returncode, err, secs, int(rss[0].split()[1]) / 1024 if rss else 0.0


def test_endless_server_info_body_is_cut_at_the_reply_bound(hostile, tmp_path):
    """An endless /server_info body was read until memory ran out (exit 70 at 5.8 GB): now perfscope
    holds at most the bound (here 4 MB), says it and how to raise it, and never arms the profiler."""
    H, port = hostile
    H.mode = "endless_info"
    rc, err, _, rss = _trace(port, tmp_path, env={"PERFSCOPE_MAX_REPLY_MB": "4"})
    line = one_line(err)
    assert rc == 3 and "larger than 4 MB" in line and "PERFSCOPE_MAX_REPLY_MB" in line, err
    assert "/start_profile" not in H.calls
    assert rss < 400, rss  # the interpreter and perfscope's imports, not the endless body


def test_reply_announcing_a_huge_length_is_refused_before_reading(hostile, tmp_path):
    H, port = hostile
    H.mode = "huge_length_info"
    rc, err, secs, _ = _trace(port, tmp_path)
    line = one_line(err)
    assert rc == 3 and "1,099,511,627,776 bytes announced" in line and "PERFSCOPE_MAX_REPLY_MB" in line, err


def test_trickling_server_meets_the_total_deadline(hostile, tmp_path):
    """One byte every 0.2 s kept each read alive, so the per-read socket timeout never fired and
    `trace` hung for ever; the total deadline (here 1 s, under the 60 s --timeout) ends it with one line."""
    H, port = hostile
    H.mode = "trickle_info"
    rc, err, secs, _ = _trace(port, tmp_path, env={"PERFSCOPE_HTTP_DEADLINE_S": "1"})
    line = one_line(err)
    assert rc == 3 and "within 1s" in line and "PERFSCOPE_HTTP_DEADLINE_S" in line, err
    assert secs < 60, secs  # the deadline, not the 300 s of the test's own guard


def test_endless_stream_line_is_cut_and_the_profiler_stopped(hostile, tmp_path):
    """An endless SSE line from /generate while the profiler runs: cut at the bound, one line,
    exit 3, and /stop_profile sent."""
    H, port = hostile
    H.mode = "endless_sse"
    rc, err, _, rss = _trace(port, tmp_path, env={"PERFSCOPE_MAX_REPLY_MB": "2"})
    line = one_line(err)
    assert rc == 3 and "stream line" in line and "PERFSCOPE_MAX_REPLY_MB" in line, err
    assert "/stop_profile" in H.calls[H.calls.index("/start_profile"):]
    assert rss < 400, rss
    assert not list((tmp_path / "srv").iterdir())


@pytest.mark.slow  # waits out a trickling server (~8 s)
def test_trickling_stream_line_stops_the_profiler(hostile, tmp_path):
    """A stream line trickled one byte every 0.5 s: each line must complete within the deadline
    (here 2 s); the load fails, the trace ends with one line, exit 3, the profiler stopped."""
    H, port = hostile
    H.mode = "trickle_sse"
    rc, err, secs, _ = _trace(port, tmp_path, env={"PERFSCOPE_HTTP_DEADLINE_S": "2"})
    line = one_line(err)
    assert rc == 3 and "complete stream line within 2s" in line, err
    assert "/stop_profile" in H.calls[H.calls.index("/start_profile"):]


def test_client_reply_bound_and_deadline_in_process(hostile, monkeypatch):
    """The client itself (no CLI): the bound and the deadline are RemoteErrors naming their variable."""
    from perfscope.errors import RemoteError
    from perfscope.remote.sglang_api import SGLangClient

    H, port = hostile
    H.mode = "endless_info"
    monkeypatch.setenv("PERFSCOPE_MAX_REPLY_MB", "1")
    with pytest.raises(RemoteError, match="PERFSCOPE_MAX_REPLY_MB"):
        SGLangClient(f"http://127.0.0.1:{port}").server_info()
    H.mode = "trickle_info"
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="within 1s"):
        SGLangClient(f"http://127.0.0.1:{port}", timeout=1).server_info()
    assert time.monotonic() - t0 < 30
    H.mode = ""
    assert SGLangClient(f"http://127.0.0.1:{port}").server_info()["version"] == "0.4.6"
