"""Byte-level repairs of trace JSON that real tools write and msgspec refuses, done in place.

* text encodings: a UTF-8 byte-order mark is dropped; UTF-16 (with a BOM, or recognised by its
  NUL bytes) is re-encoded as UTF-8;
* Kineto does not escape event names: torch's profiler sometimes records a Python function name
  with quotes in it (``"name": "x.py(0): "finish_reason"",``), which breaks the JSON. Such values
  get their bare quotes escaped. A value ends at the quote that is followed by ``,`` and a newline
  or the next known key;
* a lone UTF-16 surrogate escape (``\\ud800`` with no partner; Perfetto and Chrome read it) becomes
  ``\\ufffd``, so one name does not reject the whole file.

The repairs edit a ``bytearray`` in place (:func:`splice`): the buffer grows by the few bytes the
escapes add, and no second copy of a multi-GB trace is made.
"""

from __future__ import annotations

import re

_NAME_VALUE = re.compile(
    rb'("name": ")([^\n]*?)("(?=[ \t]*,[ \t]*(?:\r?\n|"(?:pid|tid|ts|dur|cat|ph|args|id|bp|s)"[ \t]*:)))'
)
_BARE_QUOTE = re.compile(rb'(?<!\\)"')
_HIGH = rb"\\u[dD][89abAB][0-9a-fA-F]{2}"
_LOW = rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}"
# a high surrogate not followed by a low one, or a low one not preceded by a high one
_LONE = re.compile(rb"(?<!\\)(?:" + _HIGH + rb"(?!" + _LOW + rb")|(?<!" + _HIGH + rb")" + _LOW + rb")")
_MOVE_CHUNK = 1 << 22


def _move_up(v: memoryview, a: int, b: int, d: int) -> None:
    """``v[a:b]`` moved ``d`` bytes up, from the top down in chunks (no temporary of the whole)."""
    hi = b
    while hi > a:
        lo = max(a, hi - _MOVE_CHUNK)
        v[lo + d : hi + d] = v[lo:hi]
        hi = lo


def splice(buf: bytearray, edits: list[tuple[int, int, bytes]]) -> None:
    """Replace ``buf[s:e]`` by ``rep`` for each ``(s, e, rep)`` (sorted, disjoint, ``rep`` never
    shorter than what it replaces), in place."""
    grow = sum(len(r) - (e - s) for s, e, r in edits)
    if grow < 0:
        raise ValueError("splice only grows the buffer")
    end = len(buf)
    buf.extend(bytes(grow))
    with memoryview(buf) as v:
        shift = grow
        for s, e, r in reversed(edits):
            _move_up(v, e, end, shift)
            shift -= len(r) - (e - s)
            v[s + shift : s + shift + len(r)] = r
            end = s


def normalise_encoding(buf: bytes | bytearray) -> tuple[bytes | bytearray, str]:
    """(UTF-8 JSON bytes, the encoding it was in). A UTF-8 BOM is cut in place (bytearray)."""
    head = bytes(buf[:4])
    if head[:3] == b"\xef\xbb\xbf":
        if isinstance(buf, bytearray):
            del buf[:3]
            return buf, "utf-8-sig"
        return buf[3:], "utf-8-sig"
    enc = None
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        enc = "utf-16"
    elif len(head) == 4 and head[1] == 0 and head[3] == 0 and head[0] and head[2]:
        enc = "utf-16-le"
    elif len(head) == 4 and head[0] == 0 and head[2] == 0 and head[1] and head[3]:
        enc = "utf-16-be"
    if enc is None:
        return buf, "utf-8"
    try:
        return bytearray(bytes(buf).decode(enc).encode("utf-8", "surrogatepass")), enc
    except UnicodeError:
        return buf, "utf-8"  # not UTF-16 after all: the JSON decoder says what is wrong


def fix_surrogates(buf: bytearray) -> int:
    """Replace lone surrogate escapes by ``\\ufffd`` in place (same length); returns how many."""
    n = 0
    with memoryview(buf) as v:
        for m in _LONE.finditer(buf):
            v[m.start() : m.end()] = rb"\ufffd"
            n += 1
    return n


def fix_names(buf: bytearray) -> int:
    """Escape bare quotes in ``"name"`` values in place; returns how many values were fixed."""
    edits: list[tuple[int, int, bytes]] = []
    for m in _NAME_VALUE.finditer(buf):
        inner = m.group(2)
        if b'"' in inner:
            edits.append((m.start(2), m.end(2), _BARE_QUOTE.sub(rb'\\"', inner)))
    if edits:
        splice(buf, edits)
    return len(edits)


def repair_names(buf: bytes | bytearray) -> tuple[bytearray, int]:
    """Escape bare quotes inside ``"name": "..."`` values; returns (buffer, values fixed). A
    ``bytearray`` is repaired in place and returned; ``bytes`` are copied once."""
    b = buf if isinstance(buf, bytearray) else bytearray(buf)
    return b, fix_names(b)
