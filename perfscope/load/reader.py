"""Read one Kineto trace file (``.json``, ``.json.gz`` or ``.json.xz``) into a :class:`Trace`, fast and small.

How (:func:`load_trace`): the file is inflated half a MB at a time and its ``traceEvents`` decoded a
piece (~1 MB of JSON) at a time as the text arrives (:func:`_stream`), each piece by msgspec into
typed structs holding only the fields perfscope uses, each event kept as a compact tuple; the
top-level keys before and after the events are decoded apart. The inflated JSON is never whole in
memory: on the 171 MB eager trace the reader peaks at ~1.0x the JSON size and diagnose at ~1.4x
(the events themselves take ~0.6x: names, ids, durations and shapes repeated on every step are one
object each). A file laid out otherwise (JSON Array Format, UTF-16 or a BOM) or with something wrong
in it is read whole by :func:`parse`, which says what is wrong (or repairs it) as before.
"""

from __future__ import annotations

import ast
import math
import os
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

import msgspec

from perfscope.errors import InputError
from perfscope.util import limits
from perfscope.util.files import read_regular
from perfscope.util.gcpause import collector_paused
from perfscope.load.model import Annotation, CpuOp, Kernel, Launch, PyFrame, Trace, TraceMeta
from perfscope.load.repair import fix_names, fix_surrogates, normalise_encoding, repair_names  # noqa: F401 - API
from perfscope.load.schema import ANY_EVENT, EVENT, MAX_DUR_US, MAX_TS_US, TOP, Args, Event, Top

_CHUNK = 1 << 19  # JSON bytes inflated per call
_FEED = 1 << 18  # compressed bytes handed to zlib per call
# runtime/driver calls kept: the ones that carry a correlation id to GPU work, and warm-up markers
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "runtime", "hip_runtime"}
_GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
             "gpu_memset": "memset", "Memset": "memset"}
_ANNOT_CATS = {"user_annotation": False, "gpu_user_annotation": True}


def read_bytes(path: str | os.PathLike, progress: Optional[Callable[[int, int], None]] = None) -> bytes | bytearray:
    """The file's JSON bytes, inflated if gzipped or xz-compressed. Truncated or corrupt, a file that is no
    regular file, or one past the bound (:func:`perfscope.util.limits.max_trace_bytes`) -> InputError."""
    p = Path(path)
    return _inflate(_read_file(p), p, progress)


def _read_file(p: Path) -> bytes:
    """The file's bytes as stored (compressed or not): no regular file, past the bound or empty -> InputError."""
    comp = read_regular(p, limits.max_trace_bytes(), "PERFSCOPE_MAX_TRACE_GB", "GB", what="the trace",
                        hint="save the trace to a file and pass its path")
    if not comp.strip():
        raise InputError(f"{p}: empty file, not a trace")
    return comp


def _json_chunks(comp: bytes, p: Path, progress=None) -> Iterator[bytes | memoryview]:
    """The file's JSON in pieces of at most ``_CHUNK`` bytes, inflated as they are asked for; the same
    errors as :func:`read_bytes`, raised when the piece they are in is reached."""
    if comp[:6] == _XZ_MAGIC:
        return _unxz_chunks(comp, p, progress)
    if comp[:2] != b"\x1f\x8b":
        view = memoryview(comp)
        return (view[i:i + _CHUNK] for i in range(0, len(comp), _CHUNK))
    return _gunzip_chunks(comp, p, progress)


_XZ_MAGIC = b"\xfd7zXZ\x00"


def _unxz(comp: bytes, p: Path, progress, cap: Optional[int] = None) -> bytearray:
    """Decompress an xz file (every stream of it) into one buffer of at most ``cap`` bytes (default:
    the trace bound), in chunks: a stream that grows past the bound is refused before it is held."""
    buf = bytearray()
    for out in _unxz_chunks(comp, p, progress, cap):
        buf += out
    return buf


def _unxz_chunks(comp: bytes, p: Path, progress, cap: Optional[int] = None) -> Iterator[bytes]:
    """:func:`_unxz`'s chunks, one at a time (at most ``_CHUNK`` bytes each)."""
    import lzma

    cap = limits.max_trace_bytes() if cap is None else cap
    total = 0
    d = lzma.LZMADecompressor(lzma.FORMAT_XZ)
    data = comp
    while True:
        try:
            out = d.decompress(data, _CHUNK)
        except lzma.LZMAError as e:
            raise InputError(f"{p}: corrupt xz data ({e})") from None
        except MemoryError:
            raise InputError(f"{p}: not enough memory to decompress the trace ({total:,} bytes so far)") from None
        data = b""
        if total + len(out) > cap:
            raise InputError(f"{p}: " + limits.too_big(f"the trace decompressed from its {len(comp):,} xz bytes",
                                                       cap, "PERFSCOPE_MAX_TRACE_GB", "GB"))
        total += len(out)
        if out:
            yield out
        if progress and d.eof:
            progress(len(comp) - len(d.unused_data), len(comp))
        if d.eof:
            rest = d.unused_data.lstrip(b"\0")  # stream padding between (and after) streams
            if not rest:
                break
            if rest[:6] != _XZ_MAGIC:
                raise InputError(f"{p}: {len(rest):,} bytes of junk after the xz stream")
            d = lzma.LZMADecompressor(lzma.FORMAT_XZ)
            data = rest
            continue
        if d.needs_input:
            break
    if not d.eof:
        raise InputError(f"{p}: truncated xz file (the stream ends after {total:,} bytes of JSON); "
                         "was it copied while still being written?")


def _gunzip(comp: bytes, p: Path, progress, cap: Optional[int] = None) -> bytearray:
    """Inflate every gzip member of ``comp`` into one buffer of at most ``cap`` bytes (default: the
    trace bound); a stream that inflates past it is refused before it is held."""
    cap = limits.max_trace_bytes() if cap is None else cap
    hint = int.from_bytes(comp[-4:], "little") if len(comp) >= 18 else 0
    buf = bytearray(hint if 0 < hint < min(64 * len(comp) + (1 << 20), cap + 1) else 0)
    view = memoryview(buf)
    pos = 0
    try:
        for out in _gunzip_chunks(comp, p, progress, cap):
            n = len(out)
            if pos + n <= len(buf):
                view[pos:pos + n] = out
            else:  # the trailer's size was wrong (files over 4 GiB): grow
                view.release()
                buf[pos:] = out
                view = memoryview(buf)
            pos += n
    except MemoryError:
        raise InputError(f"{p}: not enough memory to inflate the trace ({pos:,} bytes so far)") from None
    view.release()
    if pos < len(buf):
        del buf[pos:]
    return buf


def _gunzip_chunks(comp: bytes, p: Path, progress, cap: Optional[int] = None) -> Iterator[bytes]:
    """:func:`_gunzip`'s chunks, one at a time (at most ``_CHUNK`` bytes each). The compressed bytes are
    fed ``_FEED`` at a time: zlib copies the input it could not use yet on every call (its
    ``unconsumed_tail``), so feeding all of a large file at once would copy it again per chunk."""
    cap = limits.max_trace_bytes() if cap is None else cap
    view = memoryview(comp)
    size = len(comp)
    fed = total = 0  # compressed bytes handed to zlib, JSON bytes out
    d = zlib.decompressobj(31)
    while True:
        data = view[fed:fed + _FEED]
        fed += len(data)
        while True:
            try:
                # at most _CHUNK bytes out per call: no large temporary beside the buffer
                out = d.decompress(data, _CHUNK)
            except zlib.error as e:
                raise InputError(f"{p}: corrupt gzip data ({e})") from None
            except MemoryError:
                raise InputError(f"{p}: not enough memory to inflate the trace ({total:,} bytes so far)") from None
            n = len(out)
            if total + n > cap:
                raise InputError(f"{p}: " + limits.too_big(f"the trace inflated from its {size:,} gzip bytes",
                                                           cap, "PERFSCOPE_MAX_TRACE_GB", "GB"))
            total += n
            if n:
                yield out
            data = d.unconsumed_tail
            if d.eof or (not data and not out):
                break
        # at the end of a member, what follows it in the input is its unused_data (zlib may leave it in
        # unconsumed_tail too)
        done = fed - len(d.unused_data if d.eof else data)
        if progress:
            progress(done, size)
        if d.eof:
            rest_at = done
            if rest_at < size:  # RFC 1952: several members are one file, read whole
                rest = view[rest_at:]
                if rest[:2] != b"\x1f\x8b":
                    if bytes(rest).strip(b"\0"):
                        raise InputError(f"{p}: {len(rest):,} bytes of junk after the gzip stream")
                    break
                d = zlib.decompressobj(31)
                fed = rest_at
                continue
            break
        if fed >= size:
            break
    if not d.eof:
        raise InputError(f"{p}: truncated gzip file (the stream ends after {total:,} bytes of JSON); "
                         "was it copied while still being written?")


def _meta_dict(value: Any) -> Any:
    """Some traces store ``deviceProperties``/``distributedInfo`` as a Python repr string."""
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            return None
    return value


def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true")


_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])


def _top(buf: bytes | bytearray, path: str):
    """The file's top level: a Kineto object, or the JSON Array Format (a bare list of events,
    its closing bracket optional, as chrome://tracing and Perfetto read it)."""
    i = 0
    n = len(buf)
    while i < n and buf[i] in b" \t\r\n":
        i += 1
    if buf[i:i + 1] != b"[":
        return TOP.decode(buf)
    try:
        events = _ARRAY.decode(buf)
    except msgspec.DecodeError:
        j = len(buf)
        while j > 0 and buf[j - 1] in b" \t\r\n":
            j -= 1
        if j == 0 or buf[j - 1:j] == b"]":
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
            raise InputError(f"{path}: this is a PyTorch execution trace (ExecutionTraceObserver), "
                             "not a Kineto profiler trace; export the profiler's chrome trace instead")
        raise InputError(f"{path}: not a Kineto trace (no 'traceEvents' list)")
    bound = limits.max_events()
    if len(top.traceEvents) > bound:
        raise InputError(f"{path}: {len(top.traceEvents):,} events, more than perfscope's bound of {bound:,} "
                         "per trace (raise it with PERFSCOPE_MAX_EVENTS=<events>, or trace fewer steps)")

    meta = TraceMeta(path=str(path), json_bytes=len(buf), events=len(top.traceEvents), repaired_names=repaired,
                     lone_surrogates=surrogates, encoding=encoding)
    _fill_meta(meta, top)
    acc = _Events(meta)
    acc.take_raw(top.traceEvents)
    return acc.trace()


class _Events:
    """The event tuples of one trace, taken a list of decoded events (or of raw ones) at a time."""

    def __init__(self, meta: TraceMeta) -> None:
        self.meta = meta
        self.kernels: list[Kernel] = []
        self.launches: list[Launch] = []
        self.cpu_ops: list[CpuOp] = []
        self.frames: list[PyFrame] = []
        self.annots: list[Annotation] = []
        self.names: dict[str, str] = {}
        self.ids: dict = {}
        self.geo: dict = {}
        self.shapes: dict[bytes, bytes] = {}
        self.durs: dict[float, float] = {}  # apart from the ids: 2.0 == 2

    def take_raw(self, raws) -> None:
        """Raw events: each decoded on its own, one that breaks the schema by the lax decoder."""
        self.take(self._decoded(raws))

    def _decoded(self, raws) -> Iterator[Event]:
        meta = self.meta
        decode = EVENT.decode
        gpu_cats = _GPU_CATS
        for raw in raws:
            try:
                e = decode(raw)  # out-of-range numbers fail the schema's bounds (perfscope.load.schema)
            except (msgspec.ValidationError, RecursionError):
                e = _lax_event(raw)
                meta.lax_events += 1
                if e is None:
                    continue
                if e.__class__ is _Negative:
                    meta.negative_durations += 1
                    meta.negative_kernels += e.cat in gpu_cats
                    continue
            except msgspec.DecodeError as exc:  # pragma: no cover - top-level decode validated JSON
                raise InputError(f"{meta.path}: malformed event ({exc})") from None
            yield e

    def take(self, events) -> None:
        """Decoded events. Equal names, process, thread and parent-frame ids, durations, geometries and
        shapes are one object each (a trace repeats them on every step: a fifth of the trace's memory); a
        shape is kept as its own bytes (raw JSON), not as a view of the text it was decoded from, so that
        no piece of a file stays held by the ops that have one."""
        kernels, launches, cpu_ops, frames, annots = self.kernels, self.launches, self.cpu_ops, self.frames, self.annots
        intern = self.names.setdefault
        ident = self.ids.setdefault
        geo = self.geo.setdefault
        shape = self.shapes.setdefault
        durs = self.durs.setdefault
        no_args = _NO_ARGS
        gpu_cats = _GPU_CATS
        rt_cats = _RUNTIME_CATS
        annot_cats = _ANNOT_CATS
        new = tuple.__new__  # the event tuples built without their NamedTuple's Python-level __new__
        for e in events:
            if e.ph != "X":
                continue
            cat = e.cat
            a = e.args or no_args
            pid = e.pid
            tid = e.tid
            pid = ident(pid, pid)
            tid = ident(tid, tid)
            dur = e.dur
            if dur:  # (0.0 and -0.0 left as they are: equal keys, different values)
                dur = durs(dur, dur)
            if cat == "python_function":
                pp = a.python_parent
                frames.append(new(PyFrame, (intern(e.name, e.name), e.ts, dur, pid, tid, a.python_id,
                                            ident(pp, pp))))
            elif cat == "cpu_op" or cat == "Operator":
                if cat == "Operator" and e.name.startswith("ProfilerStep#"):
                    # the 2021 Kineto format wrote every CPU range as an `Operator`, the profiler's steps too
                    annots.append(Annotation(intern(e.name, e.name), e.ts, dur, pid, tid, False))
                    continue
                it, dims, conc = a.input_type, a.input_dims, a.concrete
                if it:
                    it = bytes(it)
                    it = shape(it, it)
                else:
                    it = b""
                if dims:
                    dims = bytes(dims)
                    dims = shape(dims, dims)
                else:
                    dims = b""
                if conc:
                    conc = bytes(conc)
                    conc = shape(conc, conc)
                else:
                    conc = b""
                cpu_ops.append(new(CpuOp, (intern(e.name, e.name), e.ts, dur, pid, tid, a.external_id,
                                           it, dims, conc)))
            elif cat in gpu_cats:
                g = a.grid
                if g is not None:
                    g = tuple(g)
                    g = geo(g, g)
                b = a.block
                if b is not None:
                    b = tuple(b)
                    b = geo(b, b)
                kernels.append(new(Kernel, (intern(e.name, e.name), e.ts, dur,
                                            a.stream if a.stream is not None else (tid if isinstance(tid, int) else 0),
                                            a.device if a.device is not None else (pid if isinstance(pid, int) else 0),
                                            a.correlation if a.correlation is not None else -1,
                                            g, b, a.external_id, gpu_cats[cat])))
            elif cat in rt_cats:
                launches.append(new(Launch, (intern(e.name, e.name), e.ts, dur, pid, tid, a.correlation,
                                             a.external_id)))
            elif cat in annot_cats:
                annots.append(new(Annotation, (intern(e.name, e.name), e.ts, dur, pid, tid, annot_cats[cat])))

    def trace(self) -> Trace:
        meta, launches, kernels = self.meta, self.launches, self.kernels
        if meta.platform != "rocm" and any(l.name.startswith("hip") for l in launches[:200]):
            meta.platform = "rocm"
        kernels.sort(key=lambda k: k.ts)
        return Trace(meta=meta, kernels=kernels, launches=launches, cpu_ops=self.cpu_ops, frames=self.frames,
                     annotations=self.annots)


_NO_ARGS = Args()


_I64 = 1 << 63


class _Negative(NamedTuple):
    """An event with a negative duration (a clock that went back): counted and said, not analysed."""

    cat: str


def _lax_event(raw) -> Optional[Event]:
    """An event whose field types break the schema (e.g. numbers written as strings). Fields that
    still make no sense become their defaults; an event without a usable time is dropped."""
    try:
        d = ANY_EVENT.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    try:
        a = d.get("args")
        if not isinstance(a, dict):
            a = {}

        def num(v, default=None):
            if isinstance(v, bool):
                return default
            try:
                n = int(v) if v is not None else default
            except (TypeError, ValueError, OverflowError):
                return default
            return n if n is None or -_I64 <= n < _I64 else default

        def ints(v):
            if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and -_I64 <= x < _I64 for x in v):
                return v
            return None

        def ident(v):  # pid / tid: an int or a string, else 0
            if isinstance(v, str):
                return v
            n = num(v)
            return n if n is not None else 0

        def text(v):
            return v if isinstance(v, str) else ""

        ts, dur = float(d.get("ts", 0.0) or 0.0), float(d.get("dur", 0.0) or 0.0)
        if math.isfinite(ts) and abs(ts) < MAX_TS_US and -MAX_DUR_US < dur < 0:
            return _Negative(text(d.get("cat", "")))
        if not (math.isfinite(ts) and math.isfinite(dur) and abs(ts) < MAX_TS_US and 0 <= dur < MAX_DUR_US):
            return None
        args = Args(correlation=num(a.get("correlation")), external_id=num(a.get("External id")),
                    stream=num(a.get("stream")), device=num(a.get("device")),
                    grid=ints(a.get("grid")), block=ints(a.get("block")),
                    python_id=num(a.get("Python id")), python_parent=num(a.get("Python parent id")))
        return Event(ph=text(d.get("ph", "")), cat=text(d.get("cat", "")), name=text(d.get("name", "")),
                     pid=ident(d.get("pid", 0)), tid=ident(d.get("tid", 0)), ts=ts, dur=dur, args=args)
    except (TypeError, ValueError, OverflowError):
        return None


def _fill_meta(meta: TraceMeta, top) -> None:
    def count(v):  # a non-negative int, else None
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _I64 else None

    props = _meta_dict(top.deviceProperties)
    if isinstance(props, list) and props and isinstance(props[0], dict):
        p0 = props[0]
        meta.device_name = p0.get("name") if isinstance(p0.get("name"), str) else None
        major, minor = count(p0.get("computeMajor")), count(p0.get("computeMinor", 0))
        if major is not None:
            meta.compute_capability = f"{major}.{minor or 0}"
        meta.num_sms = count(p0.get("numSms"))
        meta.total_mem_bytes = count(p0.get("totalGlobalMem"))
    dist = _meta_dict(top.distributedInfo)
    if isinstance(dist, dict):
        meta.rank = count(dist.get("rank"))
        meta.world_size = count(dist.get("world_size"))
    meta.with_stack = _truthy(top.with_stack)
    meta.record_shapes = _truthy(top.record_shapes)
    if top.roctracer_version is not None or top.hip_runtime_version is not None or (
            meta.device_name and ("AMD" in meta.device_name or "Instinct" in meta.device_name)):
        meta.platform = "rocm"


def _inflate(comp: bytes, p: Path, progress=None) -> bytes | bytearray:
    if comp[:6] == _XZ_MAGIC:
        return _unxz(comp, p, progress)
    if comp[:2] != b"\x1f\x8b":
        return comp
    return _gunzip(comp, p, progress)


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
        raise InputError(f"{path}: not enough memory to analyse this trace (see the bounds in the README: "
                         "PERFSCOPE_MAX_TRACE_GB, PERFSCOPE_MAX_EVENTS)") from None


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
        if total == len(chunk) and (normalise_encoding(bytes(pending[:4]))[1] != "utf-8"
                                    or pending.lstrip(_WS)[:1] not in (b"{", b"")):
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
        c = buf[j - 1:j]
        if c in (b",", b"{"):
            # the text before the key, closed: an object only when the key is one of the top level's
            try:
                head = TOP.decode(b"".join((memoryview(buf)[:j - 1 if c == b"," else j], b"}")))
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
            piece = b"".join((b"[", v[:k + 1], b"]"))
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
            del pending[:k + 2]
            return len(raws)
        except msgspec.DecodeError:
            continue  # not the end of an event (inside a string, or of an object inside one)
        acc.take(events)
        del pending[:k + 2]
        return len(events)
    return 0
