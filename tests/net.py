"""Loopback networking helpers shared by the test plugins and tests (tests/ is on sys.path)."""

from __future__ import annotations

import http.server
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubHandler(http.server.BaseHTTPRequestHandler):
    """Base of the few HTTP stand-ins the tests run where a real server cannot show the case (each
    test says why): ``_send`` writes one complete response; requests are not logged."""

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass
