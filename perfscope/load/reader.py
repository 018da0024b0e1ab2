"""Read one Kineto trace file (``.json``, ``.json.gz`` or ``.json.xz``) into a :class:`Trace`, fast and small.

How (:func:`load_trace`): the file is inflated half a MB at a time and its ``traceEvents`` decoded a
piece (~1 MB of JSON) at a time as the text arrives (:func:`_stream`), each piece by msgspec into
typed structs holding only the fields perfscope uses, each event kept as a compact tuple; the
top-level keys before and after the events are decoded apart. The inflated JSON is never whole in
memory: on the 171 MB eager trace the reader peaks at ~1.0x the JSON size and diagnose at ~1.4x
(the events themselves take ~0.6x: names, ids, durations and shapes repeated on every step are one
object each). A file laid out otherwise (JSON Array Format, UTF-16 or a BOM) or with something wrong
in it is read whole by :func:`parse`, which says what is wrong (or repairs it) as before.
The file's bytes are inflated by :mod:`perfscope.load.inflate`, the decoded events kept by
:mod:`perfscope.load.events`; this module finds the events in the text and decodes them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Optional

import msgspec

from perfscope.errors import InputError
from perfscope.util import limits
from perfscope.util.gcpause import collector_paused
from perfscope.load.events import _GPU_CATS, _Events, _fill_meta  # noqa: F401 - _GPU_CATS: API
from perfscope.load.inflate import _gunzip, _inflate, _json_chunks, _read_file, read_bytes  # noqa: F401 - API
from perfscope.load.model import Trace, TraceMeta
from perfscope.load.repair import fix_names, fix_surrogates, normalise_encoding, repair_names  # noqa: F401 - API
from perfscope.load.schema import TOP, Event, Top

_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])


def _top(buf: bytes | bytearray, path: str):
    """The file's top level: a Kineto object, or the JSON Array Format (a bare list of events,
    its closing bracket optional, as chrome://tracing and Perfetto read it)."""
    i = 0
    n = len(buf)
    while i < n and buf[i] in b" \t\r\n":
        i += 1
    if buf[i : i + 1] != b"[":
        return TOP.decode(buf)
    try:
        events = _ARRAY.decode(buf)
    except msgspec.DecodeError:
        j = len(buf)
        while j > 0 and buf[j - 1] in b" \t\r\n":
            j -= 1
        if j == 0 or buf[j - 1 : j] == b"]":
            raise
        if not isinstance(buf, bytearray):
            buf = bytearray(buf)
        del buf[j:]  # "the ] at the end is optional": close the list in place
        if buf[-1:] == b",":
            del buf[-1:]
        buf.append(ord("]"))
        events = _ARRAY.decode(buf)
    return Top(traceEvents=events)


def parse(buf: bytes | bytearray, path: str = "<trace>") -> Trace:
    """Decode Kineto JSON bytes into a :class:`Trace`. Non-Kineto JSON -> InputError. A
    ``bytearray`` may be repaired in place (see :mod:`perfscope.load.repair`)."""
    repaired = surrogates = 0
    buf, encoding = normalise_encoding(buf)
    try:
        top = _top(buf, path)
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply to be a trace") from None
    except msgspec.DecodeError as e:
        # repairs in place, one kind at a time, each only when the JSON does not decode
        if not isinstance(buf, bytearray):
            buf = bytearray(buf)
        top = None
        for fix in (fix_surrogates, fix_names):
            try:
                n = fix(buf)
            except MemoryError:
                raise InputError(f"{path}: not valid JSON ({e}), and no memory left to repair it") from None
            if fix is fix_surrogates:
                surrogates = n
            else:
                repaired = n
            if not n:
                continue
            try:
                top = _top(buf, path)
                break
            except msgspec.DecodeError:
                continue
            except RecursionError:
                raise InputError(f"{path}: JSON nested too deeply to be a trace") from None
        if top is None:
            raise InputError(f"{path}: not valid JSON ({e})") from None
    except msgspec.ValidationError as e:
        raise InputError(f"{path}: not a Kineto trace: {e}") from None
    if top.traceEvents is None:
        if top.nodes is not None:
            raise InputError(
                f"{path}: this is a PyTorch execution trace (ExecutionTraceObserver), "
                "not a Kineto profiler trace; export the profiler's chrome trace instead"
            )
        raise InputError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
    bound = limits.max_events()
    if len(top.traceEvents) > bound:
        raise InputError(
            f"{path}: {len(top.traceEvents):,} events, more than perfscope's bound of {bound:,} "
            "per trace (raise it with PERFSCOPE_MAX_EVENTS=<events>, or trace fewer steps)"
        )

    meta = TraceMeta(
        path=str(path),
        json_bytes=len(buf),
        events=len(top.traceEvents),
        repaired_names=repaired,
        lone_surrogates=surrogates,
        encoding=encoding,
    )
    _fill_meta(meta, top)
    acc = _Events(meta)
    acc.take_raw(top.traceEvents)
    return acc.trace()


def load_trace(path: str | os.PathLike, progress=None) -> Trace:
    """Read and parse one trace file; every failure is a one-line InputError. The JSON is inflated and
    decoded a piece at a time (:func:`_stream`); a file laid out otherwise, or one with something wrong
    in it, is read whole by :func:`parse`. The cyclic collector is off while it parses
    (perfscope.util.gcpause): its passes would walk the events read so far, again and again as they grow."""
    try:
        with collector_paused():
            p = Path(path)
            comp = _read_file(p)
            trace = _stream(_json_chunks(comp, p, progress), str(path))
            if trace is None:
                trace = parse(_inflate(comp, p, progress), str(path))
            return trace
    except MemoryError:
        raise InputError(
            f"{path}: not enough memory to analyse this trace (see the bounds in the README: "
            "PERFSCOPE_MAX_TRACE_GB, PERFSCOPE_MAX_EVENTS)"
        ) from None


# ---------------------------------------------------------------------------------------------- pieces

_PIECE = 1 << 20  # JSON bytes of events decoded per msgspec call when a file is read in pieces
_EVENT_LIST = msgspec.json.Decoder(list[Event])
_WS = b" \t\r\n"
_KEY = b'"traceEvents"'
_OPEN = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\[")
_OPENING = re.compile(rb"[ \t\r\n]*(?::[ \t\r\n]*)?")  # the text up to the "[" not all here yet


class _Rest(msgspec.Struct, gc=False):
    """The file's last events and the top-level keys after them, decoded as ``{"traceEvents": [`` + the
    rest of the file (a key that is absent stays UNSET: the one before the events, if any, holds)."""

    traceEvents: list[msgspec.Raw]
    deviceProperties: Any = msgspec.UNSET
    distributedInfo: Any = msgspec.UNSET
    with_stack: Any = msgspec.UNSET
    record_shapes: Any = msgspec.UNSET
    roctracer_version: Any = msgspec.UNSET
    hip_runtime_version: Any = msgspec.UNSET
    cuda_runtime_version: Any = msgspec.UNSET
    traceName: Any = msgspec.UNSET
    nodes: Any = msgspec.UNSET
    schema: Any = msgspec.UNSET


_REST = msgspec.json.Decoder(_Rest)
_TOP_KEYS = [f for f in Top.__struct_fields__ if f != "traceEvents"]


class _Layout(Exception):
    """The file is not laid out as :func:`_stream` reads it: it is read whole instead."""


def _stream(chunks: Iterable, path: str) -> Optional[Trace]:
    """The trace read from its JSON in pieces (``chunks``: the inflated text, a piece at a time), so that
    the text is never whole in memory: the top-level keys before ``"traceEvents": [`` decoded as an
    object of their own, then the events ``_PIECE`` bytes at a time (up to the last ``},`` in what has
    arrived that closes an event: the one where ``[`` + the text + ``]`` decodes, which only the end of
    an element of the list can do), then ``{"traceEvents": [`` + what is left (the last events and the
    keys after them). The result is :func:`parse`'s on the whole text. None when the file is not one
    that reads this way (no object at the top, no ``"traceEvents": [``, another encoding than UTF-8,
    text that does not decode, more events than the bound): :func:`parse` then reads it whole and says
    what is wrong with it, as it would have."""
    it = iter(chunks)
    pending = bytearray()
    total = 0
    head = None
    at = 0  # where to look for the key next
    for chunk in it:
        pending += chunk
        total += len(chunk)
        if total == len(chunk) and (
            normalise_encoding(bytes(pending[:4]))[1] != "utf-8" or pending.lstrip(_WS)[:1] not in (b"{", b"")
        ):
            return None
        try:
            head, opened = _head(pending, at)
        except _Layout:
            return None
        if head is not None:
            del pending[:opened]
            break
        at = opened
    if head is None:
        return None
    meta = TraceMeta(path=path, encoding="utf-8")
    acc = _Events(meta)
    count = 0
    bound = limits.max_events()
    want = _PIECE
    try:
        while True:
            if len(pending) >= want:
                n = _piece(pending, acc)
                count += n
                if count > bound:
                    return None
                want = _PIECE if n else 2 * len(pending)  # no end of an event found: wait for twice as much
            chunk = next(it, None)
            if chunk is None:
                break
            pending += chunk
            total += len(chunk)
    except _Layout:
        return None
    if _KEY in pending:  # another "traceEvents" (a key twice, or in an event's name): read whole
        return None
    try:
        rest = _REST.decode(b"".join((b'{"traceEvents":[', pending)))
    except (msgspec.DecodeError, RecursionError):
        return None
    del pending
    count += len(rest.traceEvents)
    if count > bound:
        return None
    acc.take_raw(rest.traceEvents)
    top = Top(**{k: getattr(head, k) if getattr(rest, k) is msgspec.UNSET else getattr(rest, k) for k in _TOP_KEYS})
    meta.json_bytes, meta.events = total, count
    _fill_meta(meta, top)
    return acc.trace()


def _head(buf: bytearray, at: int) -> tuple[Optional[Top], int]:
    """(the top-level keys before the events, the offset just past the events' ``[``) once ``buf`` (the
    file's start) holds them, else (None, where to look next). :class:`_Layout` when the key is there
    but its value is no list."""
    while True:
        i = buf.find(_KEY, at)
        if i < 0:
            return None, max(at, len(buf) - len(_KEY))
        j = i
        while j and buf[j - 1] in _WS:
            j -= 1
        c = buf[j - 1 : j]
        if c in (b",", b"{"):
            # the text before the key, closed: an object only when the key is one of the top level's
            try:
                head = TOP.decode(b"".join((memoryview(buf)[: j - 1 if c == b"," else j], b"}")))
            except RecursionError:
                raise _Layout from None
            except msgspec.ValidationError:
                raise _Layout from None
            except msgspec.DecodeError:
                head = None
            if head is not None:
                if head.traceEvents is not None:
                    raise _Layout
                m = _OPEN.match(buf, i + len(_KEY))
                if m is not None:
                    return head, m.end()
                if _OPENING.fullmatch(buf, i + len(_KEY)):
                    return None, i  # the "[" has not arrived yet
                raise _Layout  # "traceEvents": null, or not a list
        at = i + 1


def _piece(pending: bytearray, acc: "_Events") -> int:
    """Take the events at the start of ``pending`` (the text after the events' ``[`` or after a comma
    between two of them) up to the last ``},`` that ends one, and cut them off it; the number of events
    taken (0: no end of an event found)."""
    hi = len(pending)
    for _ in range(4):
        k = pending.rfind(b"},", 0, hi)
        if k < 0:
            return 0
        hi = k
        with memoryview(pending) as v:
            piece = b"".join((b"[", v[: k + 1], b"]"))
        try:
            events = _EVENT_LIST.decode(piece)
        except (msgspec.ValidationError, RecursionError):  # an event breaks the schema: each on its own
            try:
                raws = _ARRAY.decode(piece)
            except RecursionError:
                raise _Layout from None
            except msgspec.DecodeError:
                continue  # not the end of an event
            acc.take_raw(raws)
            del pending[: k + 2]
            return len(raws)
        except msgspec.DecodeError:
            continue  # not the end of an event (inside a string, or of an object inside one)
        acc.take(events)
        del pending[: k + 2]
        return len(events)
    return 0
