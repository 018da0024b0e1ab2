"""What a failed exchange with an SGLang server raises, and the message an error reply carries."""

from __future__ import annotations

import json

from perfscope.errors import RemoteError

try:  # the SSH transport's error type, so that `trace` can tell "nothing listens" from other failures
    from perfscope.remote.ssh import ServerDown
except Exception:  # pragma: no cover - ssh.py needs paramiko, a core dependency

    class ServerDown(RemoteError):  # type: ignore[no-redef]
        """Nothing answers at the server's address."""


class HTTPStatusError(RemoteError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, *, status: int, body: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.status = status
        self.body = body


class Unauthorized(HTTPStatusError):
    """401/403: the API key is missing or wrong."""


def message_of(body: bytes) -> str:
    """The message of an error reply's body (its JSON ``message``, ``error`` or ``detail``, else its text), one line."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300]
    if isinstance(obj, dict):
        for k in ("message", "error", "detail"):
            v = obj.get(k)
            if isinstance(v, dict):
                v = v.get("message") or json.dumps(v)
            if isinstance(v, list):
                v = "; ".join(str(x.get("msg", x)) if isinstance(x, dict) else str(x) for x in v)
            if v:
                return " ".join(str(v).split())[:300]
    return " ".join(text.split())[:300]
