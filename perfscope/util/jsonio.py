"""Read the JSON perfscope is given (run.json, fix manifests, ``--config``, ``--model-config``,
server replies) at the boundary: every way it can be unusable is one line naming the file.

:func:`loads` parses and then :func:`check` walks the result without recursion, refusing nesting
deeper than :data:`MAX_DEPTH`, integers outside 64 bits and non-finite numbers (``1e999``). The
caller then checks the shape it needs (``expect``). Kineto traces have their own, faster reader
(:mod:`perfscope.load.reader`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Type

from perfscope.errors import InputError, PerfscopeError

MAX_DEPTH = 100
_I64 = 1 << 63


def check(obj: Any, where: str, *, error: Type[PerfscopeError] = InputError, max_depth: int = MAX_DEPTH) -> Any:
    """``obj`` if it is plain, bounded JSON; else ``error`` naming ``where`` and the JSON path."""
    stack: list[tuple[Any, int, str]] = [(obj, 0, "$")]
    while stack:
        v, depth, path = stack.pop()
        if depth > max_depth:
            raise error(f"{where}: nested more than {max_depth} levels deep (at {path[:80]})")
        if isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        if isinstance(v, int):
            if not -_I64 <= v < _I64:
                raise error(f"{where}: number at {path[:80]} does not fit in 64 bits")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise error(f"{where}: number at {path[:80]} is not finite")
        elif isinstance(v, dict):
            for k, x in v.items():
                stack.append((x, depth + 1, f"{path}.{k}" if len(path) < 80 else path))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                stack.append((x, depth + 1, f"{path}[{i}]" if len(path) < 80 else path))
        else:
            raise error(f"{where}: unexpected {type(v).__name__} at {path[:80]}")
    return obj


def loads(
    data: bytes | str,
    where: str,
    *,
    error: Type[PerfscopeError] = InputError,
    expect: type | None = None,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Parse and :func:`check` JSON text; ``expect`` (dict / list) checks the top level's type."""
    try:
        if isinstance(data, (bytes, bytearray)):
            data = bytes(data).decode("utf-8")
        obj = json.loads(data, parse_constant=lambda c: float(c))
    except UnicodeDecodeError:
        raise error(f"{where}: not UTF-8 text") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to read") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:  # e.g. an integer with thousands of digits
        raise error(f"{where}: unusable JSON ({str(e).split(';')[0][:120]})") from None
    check(obj, where, error=error, max_depth=max_depth)
    if expect is not None and not isinstance(obj, expect):
        raise error(
            f"{where}: expected a JSON {'object' if expect is dict else expect.__name__}, got {type(obj).__name__}"
        )
    return obj


def read(
    path: str | os.PathLike, what: str, *, expect: type | None = dict, error: Type[PerfscopeError] = InputError
) -> Any:
    """Read and :func:`loads` a JSON file; ``what`` names it in messages ("server config")."""
    p = Path(path)
    try:
        if p.exists() and not p.is_file():
            raise error(f"{p}: is not a regular file ({what} expected)")
        data = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{p}: no such file ({what})") from None
    except OSError as e:
        raise error(f"{p}: cannot read the {what} ({e.strerror or e})") from None
    return loads(data, f"{p} ({what})", error=error, expect=expect)
