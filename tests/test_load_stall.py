"""The load ``perfscope trace`` drives, against an engine that stops streaming while it writes its
profile (vLLM's worker does, for seconds to minutes on a loaded box; SGLang pauses too).

The real vLLM test (tests/test_real_vllm.py) meets that stall only when its timing falls so; here a
small HTTP server on loopback speaks SGLang's streamed /generate and stalls on purpose, so the
rule is held every time: the real HTTP client, the real load driver, a real socket. (The server is
a stand-in: no real engine can be made to stall on cue.)
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from perfscope.bench import workload
from perfscope.errors import RemoteError
from perfscope.remote.sglang_api import SGLangClient

TOKENS_BEFORE_STALL = 3
STALL_S = 1.5
LINE_TIMEOUT_S = 0.4


class _Stalling(BaseHTTPRequestHandler):
    """Streams TOKENS_BEFORE_STALL tokens, then, when the server's ``stall`` event is set, sends
    nothing for STALL_S before the rest (an engine writing its profile)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n))
        want = body["sampling_params"]["max_new_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for i in range(1, want + 1):
                if i == TOKENS_BEFORE_STALL + 1 and self.server.stall.is_set():
                    time.sleep(STALL_S)
                meta = {"completion_tokens": i, "finish_reason": {"type": "length"} if i == want else None}
                self.wfile.write(b"data: " + json.dumps({"meta_info": meta}).encode() + b"\n\n")
                self.wfile.flush()
                time.sleep(0.002)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on a stalled stream
            pass


@pytest.fixture()
def stalling_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stalling)
    srv.daemon_threads = True
    srv.stall = threading.Event()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _client(srv):
    return SGLangClient(f"http://127.0.0.1:{srv.server_address[1]}", timeout=LINE_TIMEOUT_S)


def test_a_stall_while_the_engine_writes_its_profile_is_noted_not_a_failed_load(stalling_server):
    stalling_server.stall.set()
    res = workload.drive_decode(_client(stalling_server), concurrency=2, input_len=4, output_len=8,
                                num_requests=4, timeout=LINE_TIMEOUT_S, stall_expected=lambda: True)
    assert len(res) == 4
    assert all(r.stalled and not r.ok for r in res), [(r.error, r.stalled) for r in res]
    # each stalled request kept the tokens it had streamed before the stall, and its error says why
    assert all(r.output_tokens == TOKENS_BEFORE_STALL for r in res)
    assert all("no stream data" in r.error or "stream line" in r.error for r in res), [r.error for r in res]


def test_the_same_stall_when_no_profile_is_being_written_fails_the_load(stalling_server):
    stalling_server.stall.set()
    with pytest.raises(RemoteError, match="the load's requests fail"):
        workload.drive_decode(_client(stalling_server), concurrency=1, input_len=4, output_len=8,
                              num_requests=4, timeout=LINE_TIMEOUT_S, stall_expected=lambda: False)


def test_no_stall_no_note(stalling_server):
    res = workload.drive_decode(_client(stalling_server), concurrency=2, input_len=4, output_len=8,
                                num_requests=4, timeout=LINE_TIMEOUT_S, stall_expected=lambda: True)
    assert all(r.ok and not r.stalled and r.output_tokens == 8 for r in res)
