"""The bounds perfscope puts on what it reads, and how a user raises each.

Every bound is an environment variable, read when it is used (so a test or a wrapper can set it
per call); the message that refuses an input names the bound and the variable:

* ``PERFSCOPE_MAX_REPLY_MB`` (default 64): one HTTP reply body from a server, and one SSE frame
  of a stream; ``PERFSCOPE_HTTP_DEADLINE_S`` (default: the request's own timeout) is the total
  time one request may take, however slowly the server trickles its bytes;
* ``PERFSCOPE_MAX_TRACE_GB`` (default 4): the JSON size of one trace after inflating its gzip;
* ``PERFSCOPE_MAX_EVENTS`` (default 5,000,000): events in one trace file (diagnose reads about
  10,000 events per second or more at under 1,000 bytes of memory each: benchmarks/diagnose_speed.py);
* ``PERFSCOPE_MAX_FIX_FILE_MB`` (default 16): a file ``fix`` reads or patches (``--launch-file``,
  ``--target-file``, the engine's Python sources).
"""

from __future__ import annotations

import os

from perfscope.errors import InputError

_MB = 1 << 20
_GB = 1 << 30


def _number(var: str, default: float) -> float:
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return default
    try:
        v = float(raw)
    except ValueError:
        raise InputError(f"{var}={raw!r}: not a number") from None
    if not v > 0 or v != v or v == float("inf"):
        raise InputError(f"{var}={raw!r}: must be a positive number")
    return v


def max_reply_bytes() -> int:
    return int(_number("PERFSCOPE_MAX_REPLY_MB", 64) * _MB)


def max_trace_bytes() -> int:
    return int(_number("PERFSCOPE_MAX_TRACE_GB", 4) * _GB)


def max_events() -> int:
    return int(_number("PERFSCOPE_MAX_EVENTS", 5_000_000))


def max_fix_file_bytes() -> int:
    return int(_number("PERFSCOPE_MAX_FIX_FILE_MB", 16) * _MB)


def http_deadline(timeout: float) -> float:
    """The total time one HTTP request may take: ``PERFSCOPE_HTTP_DEADLINE_S``, else ``timeout``."""
    return _number("PERFSCOPE_HTTP_DEADLINE_S", timeout)


def size_text(n: int) -> str:
    if n >= _GB:
        return f"{n / _GB:g} GB"
    if n >= _MB:
        return f"{n / _MB:g} MB"
    return f"{n:,} bytes"


def too_big(what: str, bound: int, var: str, unit: str) -> str:
    """The sentence for an input past a bound: the bound, and how to raise it."""
    return f"{what} is larger than {size_text(bound)}, perfscope's bound (raise it with {var}=<{unit}>)"
