"""A cpu_op's recorded shapes (``Input type``, ``Input Dims``, ``Concrete Inputs``), typed.

The reader keeps them as raw JSON slices (most are never looked at); these functions are the only
way analysis reads them, and each returns the documented type whatever the trace holds: a number
where a list belongs, an integer over 64 bits, a dict, nesting. Anything that does not fit is
``None`` (the whole field) or ``None`` in its place (one entry).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import msgspec

_I64 = 1 << 63
_MAX_DEPTH = 4
Dims = Union[list, None]


def _decode(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        b = bytes(raw)
    except TypeError:
        return raw  # already decoded (a capture map copies decoded values)
    if not b:
        return None
    try:
        return msgspec.json.decode(b)
    except (msgspec.DecodeError, RecursionError):
        return None


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and -_I64 <= v < _I64 else None


def _dims(v: Any, depth: int = 0) -> Dims:
    """One input's shape: a list of 64-bit ints (a tensor), a list of such lists (a tensor list,
    nested at most a few levels), ``[]`` for a scalar; else None."""
    if not isinstance(v, list) or depth > _MAX_DEPTH:
        return None
    if all(_int(x) is not None for x in v):
        return v
    if all(isinstance(x, list) for x in v):
        inner = [_dims(x, depth + 1) for x in v]
        return None if any(x is None for x in inner) else inner
    return None


def input_types(raw: Any) -> Optional[list]:
    """``Input type``: a list of dtype names (``"c10::BFloat16"``), ``None`` where an entry is no string."""
    v = _decode(raw)
    if not isinstance(v, list):
        return None
    return [x if isinstance(x, str) else None for x in v]


def input_dims(raw: Any) -> Optional[list]:
    """``Input Dims``: one shape per input (see :func:`_dims`), ``None`` where an entry is no shape."""
    v = _decode(raw)
    if not isinstance(v, list):
        return None
    return [_dims(x) for x in v]


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, int):
        return v if -_I64 <= v < _I64 else str(v)
    return None


def concrete_inputs(raw: Any) -> Optional[list]:
    """``Concrete Inputs``: a list of scalars (strings as torch writes them, numbers, booleans);
    an integer over 64 bits becomes its decimal string, a list or object entry ``None``."""
    v = _decode(raw)
    if not isinstance(v, list):
        return None
    return [_scalar(x) for x in v]
