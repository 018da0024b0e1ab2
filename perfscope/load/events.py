"""The reader's event tuples: decoded Kineto events (:mod:`perfscope.load.schema`) kept as the compact
tuples of :mod:`perfscope.load.model`, with the values a trace repeats on every step held once; an event
that breaks the schema decoded by a lax decoder; the trace's metadata from its top-level keys."""

from __future__ import annotations

import ast
import math
from typing import Any, Iterator, NamedTuple

import msgspec

from perfscope.errors import InputError
from perfscope.load.model import Annotation, CpuOp, Kernel, Launch, PyFrame, Trace, TraceMeta
from perfscope.load.schema import ANY_EVENT, EVENT, MAX_DUR_US, MAX_TS_US, Args, Event

# runtime/driver calls kept: the ones that carry a correlation id to GPU work, and warm-up markers
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "runtime", "hip_runtime"}
_GPU_CATS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
_ANNOT_CATS = {"user_annotation": False, "gpu_user_annotation": True}


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
                lax = _lax_event(raw)
                meta.lax_events += 1
                if lax is None:
                    continue
                if isinstance(lax, _Negative):
                    meta.negative_durations += 1
                    meta.negative_kernels += lax.cat in gpu_cats
                    continue
                e = lax
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
                frames.append(new(PyFrame, (intern(e.name, e.name), e.ts, dur, pid, tid, a.python_id, ident(pp, pp))))
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
                cpu_ops.append(new(CpuOp, (intern(e.name, e.name), e.ts, dur, pid, tid, a.external_id, it, dims, conc)))
            elif cat in gpu_cats:
                g = a.grid
                if g is not None:
                    g = tuple(g)
                    g = geo(g, g)
                b = a.block
                if b is not None:
                    b = tuple(b)
                    b = geo(b, b)
                kernels.append(
                    new(
                        Kernel,
                        (
                            intern(e.name, e.name),
                            e.ts,
                            dur,
                            a.stream if a.stream is not None else (tid if isinstance(tid, int) else 0),
                            a.device if a.device is not None else (pid if isinstance(pid, int) else 0),
                            a.correlation if a.correlation is not None else -1,
                            g,
                            b,
                            a.external_id,
                            gpu_cats[cat],
                        ),
                    )
                )
            elif cat in rt_cats:
                launches.append(
                    new(Launch, (intern(e.name, e.name), e.ts, dur, pid, tid, a.correlation, a.external_id))
                )
            elif cat in annot_cats:
                annots.append(new(Annotation, (intern(e.name, e.name), e.ts, dur, pid, tid, annot_cats[cat])))

    def trace(self) -> Trace:
        meta, launches, kernels = self.meta, self.launches, self.kernels
        if meta.platform != "rocm" and any(l.name.startswith("hip") for l in launches[:200]):
            meta.platform = "rocm"
        kernels.sort(key=lambda k: k.ts)
        return Trace(
            meta=meta,
            kernels=kernels,
            launches=launches,
            cpu_ops=self.cpu_ops,
            frames=self.frames,
            annotations=self.annots,
        )


_NO_ARGS = Args()


_I64 = 1 << 63


class _Negative(NamedTuple):
    """An event with a negative duration (a clock that went back): counted and said, not analysed."""

    cat: str


def _lax_event(raw) -> Event | _Negative | None:
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
            if isinstance(v, list) and all(
                isinstance(x, int) and not isinstance(x, bool) and -_I64 <= x < _I64 for x in v
            ):
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
        args = Args(
            correlation=num(a.get("correlation")),
            external_id=num(a.get("External id")),
            stream=num(a.get("stream")),
            device=num(a.get("device")),
            grid=ints(a.get("grid")),
            block=ints(a.get("block")),
            python_id=num(a.get("Python id")),
            python_parent=num(a.get("Python parent id")),
        )
        return Event(
            ph=text(d.get("ph", "")),
            cat=text(d.get("cat", "")),
            name=text(d.get("name", "")),
            pid=ident(d.get("pid", 0)),
            tid=ident(d.get("tid", 0)),
            ts=ts,
            dur=dur,
            args=args,
        )
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
    if (
        top.roctracer_version is not None
        or top.hip_runtime_version is not None
        or (meta.device_name and ("AMD" in meta.device_name or "Instinct" in meta.device_name))
    ):
        meta.platform = "rocm"
