"""Bounds on one HTTP exchange with a server: a total deadline and a size cap.

A socket timeout bounds one read, not a request: a server that sends one byte every few seconds
keeps every read alive for ever. :class:`Deadline` is a watchdog thread that shuts the socket
down when the request's total time is up (a stream moves its deadline on with each complete
frame), so the blocked read returns and the caller reports the deadline. :func:`read_capped` and
:func:`readline_capped` never hold more than the reply cap (:func:`perfscope.util.limits.max_reply_bytes`).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Optional

from perfscope.errors import RemoteError, StreamStall
from perfscope.util import limits


class Deadline:
    """Shut ``sock`` down ``seconds`` from now unless :meth:`done` comes first; :meth:`extend`
    moves the deadline to ``seconds`` from now (a stream's next line). The socket itself is held:
    ``http.client`` drops its connection's reference when the reply says ``Connection: close``."""

    def __init__(self, sock, seconds: float):
        self.sock = sock
        self.seconds = seconds
        self.fired = False
        self._due = time.monotonic() + seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="perfscope-http-deadline", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            left = self._due - time.monotonic()
            if left <= 0:
                self.fired = True
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            self._stop.wait(left)

    def extend(self) -> None:
        self._due = time.monotonic() + self.seconds

    def done(self) -> None:
        self._stop.set()

    def error(self, where: str, what: str = "a complete reply") -> StreamStall:
        return StreamStall(
            f"{where}: timed out: no {what} within {self.seconds:g}s (the server sends too slowly "
            "or not at all); each request has this total deadline, raise it with "
            "PERFSCOPE_HTTP_DEADLINE_S=<seconds>"
        )


def _too_big(where: str, what: str, cap: int) -> RemoteError:
    return RemoteError(f"{where}: " + limits.too_big(what, cap, "PERFSCOPE_MAX_REPLY_MB", "MB"))


def check_length(resp, where: str, cap: Optional[int] = None) -> None:
    """Refuse a reply whose Content-Length already says it is over the cap."""
    cap = limits.max_reply_bytes() if cap is None else cap
    n = resp.getheader("Content-Length")
    if n and n.strip().isdigit() and int(n) > cap:
        raise _too_big(where, f"the reply ({int(n):,} bytes announced)", cap)


def read_capped(resp, where: str, cap: Optional[int] = None) -> bytes:
    """The whole body, refused once it passes ``cap`` bytes (only cap + 1 are ever held)."""
    cap = limits.max_reply_bytes() if cap is None else cap
    check_length(resp, where, cap)
    data = resp.read(cap + 1)
    if len(data) > cap:
        raise _too_big(where, "the reply", cap)
    return data


def readline_capped(resp, where: str, cap: int) -> bytes:
    """One line of a stream (with its newline); a line longer than ``cap`` is refused."""
    line = resp.readline(cap + 1)
    if len(line) > cap and not line.endswith(b"\n"):
        raise _too_big(where, "a stream line", cap)
    return line
