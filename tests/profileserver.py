"""The profile server stand-in the trace, signal and capture tests run against (a pytest plugin,
registered in conftest.py): a small HTTP server on loopback that speaks SGLang's profile API and,
on /start_profile, writes a real trace from tests/traces/corpus into the requested folder, as
SGLang would. This machine has no GPU for SGLang, and the stand-in shows what a real server cannot
be made to do on demand: answer late, fail, echo the Authorization header, never finish a profile.

``profile_server`` yields ``(H, port)``: ``H`` is the handler class of this test's server; a test
sets its knobs (``start_delay``, ``start_status``, ``start_body``, ``echo_auth``, ``write_trace``)
and reads ``H.calls``, the paths requested in order.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest
from net import StubHandler
from paths import TRACELENS, gz_bytes

SMALL = TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.xz"
SMALL_GZ = gz_bytes(SMALL)  # as SGLang writes a trace


class _Server(StubHandler):
    calls: list = []
    start_delay = 0.0
    start_status = 200
    start_body = b'{"ok": true}'
    echo_auth = False
    write_trace = True

    def do_GET(self):
        self.calls.append(self.path)
        if self.path in ("/server_info", "/get_server_info"):
            return self._send(200, json.dumps({"version": "0.4.6", "tp_size": 1, "model_path": "stub"}).encode())
        if self.path == "/health":
            return self._send(200, b"{}")
        self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}") if n else {}
        self.calls.append(self.path)
        if self.path == "/start_profile":
            time.sleep(self.start_delay)
            if self.start_status != 200:
                text = self.start_body
                if self.echo_auth:
                    text = f'{{"error": "start failed, auth was {self.headers.get("Authorization")}"}}'.encode()
                return self._send(self.start_status, text)
            out = Path(body.get("output_dir", "/nonexistent"))
            if out.is_dir() and self.write_trace:
                (out / "1700000000-TP-0.trace.json.gz").write_bytes(SMALL_GZ)
            return self._send(200, self.start_body)
        if self.path == "/stop_profile":
            return self._send(200, b'{"ok": true}')
        if self.path == "/generate":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            return stream_four_tokens(self.wfile)
        self._send(404, b'{"error": "not found"}')


def stream_four_tokens(wfile) -> None:
    """The SSE body of a /generate that streams four tokens (SGLang's frames), then [DONE]."""
    for i in range(4):
        meta = {"completion_tokens": i + 1, "prompt_tokens": 4, "finish_reason": None if i < 3 else {"type": "length"}}
        frame = {"text": f" t{i}", "output_ids": [i], "meta_info": meta}
        wfile.write(f"data: {json.dumps(frame)}\n\n".encode())
        wfile.flush()
        time.sleep(0.01)
    wfile.write(b"data: [DONE]\n\n")


def wait_for_call(handler, path: str, timeout: float = 60) -> None:
    """Until the stand-in server's handler class has seen a request for ``path`` (at most ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while path not in handler.calls and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def profile_server():
    class H(_Server):
        calls = []
    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # a stream perfscope cut (the load stops) is not the test's business: keep stderr perfscope's

    httpd = Quiet(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    # a short poll, so that shutdown() at teardown returns in ~0.05 s instead of the default 0.5 s
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield H, httpd.server_address[1]
    httpd.shutdown()


def url_args(port, tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir(exist_ok=True)
    return ["--url", f"http://127.0.0.1:{port}", "--remote-dir", str(srv), "--steps", "2", "--output-len", "4",
            "--input-len", "4", "--timeout", "20", "--poll", "0.1"]
