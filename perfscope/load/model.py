"""The in-memory trace perfscope analyses: compact tuples per event kind, names shared.

Everything analysis needs and nothing more. Times are microseconds as in the file.
"""

from __future__ import annotations

import operator

from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter, eq
from typing import Any, NamedTuple, Optional


def by_start_longest_first(events) -> list:
    """``events`` (anything with ``ts`` and ``dur``) sorted by (start, -duration), equal ones in their
    order: an outer range before the ranges it holds. A trace's events come nearly sorted by start,
    so a sort by start alone is quick; the (start, -duration) key, a Python call per event, only
    when two events start together."""
    out = sorted(events, key=_TS)
    ts = [e.ts for e in out]
    if any(map(eq, ts, islice(ts, 1, None))):  # two neighbours start together
        out.sort(key=_start_longest_first)
    return out


def _start_longest_first(e) -> tuple:
    return (e.ts, -e.dur)


_TS = attrgetter("ts")


class Kernel(NamedTuple):
    """A GPU activity: a kernel, or a memcpy/memset (``kind``)."""

    name: str
    ts: float
    dur: float
    stream: int
    device: int
    corr: int
    grid: Optional[tuple]
    block: Optional[tuple]
    ext: Optional[int]
    kind: str  # "kernel" | "memcpy" | "memset"

    @property
    def end(self) -> float:
        return self.ts + self.dur


# Kernel's fields read by position, for the passes that map over every kernel of a trace (a tuple's item is
# read in C, quicker than its name); taken from the fields' order, so they follow the type
KERNEL_TS, KERNEL_DUR, KERNEL_STREAM, KERNEL_CORR, KERNEL_KIND = (
    operator.itemgetter(Kernel._fields.index(f)) for f in ("ts", "dur", "stream", "corr", "kind")
)


class Launch(NamedTuple):
    """A CUDA/HIP runtime or driver call (kernel launch, graph launch, memcpy, sync, ...)."""

    name: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    corr: Optional[int]
    ext: Optional[int]


class CpuOp(NamedTuple):
    """A CPU operator (``aten::copy_``) with its recorded shapes, raw until asked for."""

    name: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    ext: Optional[int]
    input_type: bytes  # raw JSON (b"": none recorded), read by perfscope.load.shapes
    input_dims: bytes
    concrete: bytes


class PyFrame(NamedTuple):
    """A Python function interval recorded with ``with_stack``: ``file.py(123): fn``."""

    name: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    id: Optional[int]
    parent: Optional[int]


class Annotation(NamedTuple):
    """A ``record_function`` range (``ProfilerStep#3``, ``step[DECODE bs=32]``), CPU or GPU side."""

    name: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    gpu: bool


@dataclass
class TraceMeta:
    path: str
    json_bytes: int = 0
    events: int = 0
    device_name: Optional[str] = None
    compute_capability: Optional[str] = None  # "9.0"
    num_sms: Optional[int] = None
    total_mem_bytes: Optional[int] = None
    platform: str = "cuda"  # "cuda" | "rocm"
    rank: Optional[int] = None
    world_size: Optional[int] = None
    with_stack: bool = False
    record_shapes: bool = False
    lax_events: int = 0  # events that needed the slow, untyped decoder
    repaired_names: int = 0  # event names with bare quotes (a torch profiler bug) escaped on load
    lone_surrogates: int = 0  # lone UTF-16 surrogate escapes replaced by U+FFFD on load
    negative_durations: int = 0  # events with a negative duration, left out (negative_kernels of them GPU work)
    negative_kernels: int = 0
    encoding: str = "utf-8"  # the file's text encoding ("utf-8-sig": with a BOM; "utf-16")

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Trace:
    meta: TraceMeta
    kernels: list[Kernel] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    cpu_ops: list[CpuOp] = field(default_factory=list)
    frames: list[PyFrame] = field(default_factory=list)
    annotations: list[Annotation] = field(default_factory=list)
    # what the analysis derives from the events once and shares between its passes (the kernel
    # classification table, the step model's indexes); never copied by dataclasses.replace
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
