"""``--json``: one JSON object on stdout."""

from __future__ import annotations

import sys

import orjson


def dumps(obj) -> bytes:
    return orjson.dumps(
        obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str
    )


def emit(obj) -> None:
    sys.stdout.buffer.write(dumps(obj) + b"\n")
    sys.stdout.flush()
