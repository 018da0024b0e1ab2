"""Attribute graph-replayed kernels with a graph-capture trace.

Under CUDA/HIP graphs a decode step is one ``cudaGraphLaunch``: its kernels have no CPU op, no
shapes and no Python stack. A trace recorded while the graph was *captured* (SGLang's
``--enable-profile-cuda-graph`` / ``SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE=1``, vLLM's
graph-capture traces) has, between ``StreamBeginCapture`` and ``StreamEndCapture``, one launch
call per graph node, in program order, each naming its kernel (``args.kernel``) and carrying the
CPU op, shapes and Python stack of the code that launched it. A graph replays its nodes in that
order, so the i-th kernel of a replay is the i-th launch of the matching capture.

Matching, per replayed graph (the kernels of one graph launch, in GPU start order):
  1. ``positional``: the capture's launch names equal the replay's kernel names, in order;
  2. ``by-name``: the same names and counts in another order (several streams): the k-th kernel
     of a name pairs with the k-th launch of that name;
  3. ``greedy``: the capture has extra launches (profiler noise): scan forward, skipping them.
The captured graph that maps the most kernels wins; below half mapped, the replay stays unmapped.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import msgspec

from perfscope.analysis.attribution import Attribution, Attributor
from perfscope.analysis.steps import is_graph_launch
from perfscope.errors import InputError
from perfscope.load.model import Kernel, Trace
from perfscope.load.reader import parse, read_bytes

MIN_MAPPED_FRACTION = 0.5
_BEGIN = "StreamBeginCapture"
_END = "StreamEndCapture"


class _CapArgs(msgspec.Struct, gc=False):
    correlation: Union[int, None] = None
    external_id: Union[int, None] = msgspec.field(default=None, name="External id")
    kernel: Union[str, None] = None


class _CapEvent(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    args: Union[_CapArgs, None] = None


class _CapTop(msgspec.Struct, gc=False):
    traceEvents: Union[list[msgspec.Raw], None] = None


_TOP = msgspec.json.Decoder(_CapTop)
_EV = msgspec.json.Decoder(_CapEvent)


def node_key(name: str, kind: str = "kernel") -> str:
    """What a graph node is called on both sides: the kernel name, or memcpy/memset."""
    if kind in ("memcpy", "memset"):
        return kind
    if name.startswith(("Memcpy", "hipMemcpy", "cudaMemcpy", "cuMemcpy")):
        return "memcpy"
    if name.startswith(("Memset", "hipMemset", "cudaMemset", "cuMemset")) or "fillBuffer" in name:
        return "memset"
    return name


def _is_dispatch(name: str) -> bool:
    return (
        "LaunchKernel" in name
        or name in ("cuLaunchKernelEx", "cudaLaunchKernelExC")
        or "LaunchCooperativeKernel" in name
        or "Memcpy" in name
        or "Memset" in name
    )


@dataclass
class CapturedLaunch:
    key: str  # node_key: the kernel's name (args.kernel), or memcpy/memset
    ts: float
    corr: Optional[int]
    ext: Optional[int]
    runtime: str  # hipLaunchKernel, cudaLaunchKernel, ...


@dataclass
class CapturedGraph:
    file: str
    label: str  # the annotation around the capture (`capture_32_DECODE`), else "graph N"
    launches: list[CapturedLaunch]
    trace: Trace = field(repr=False)
    _attributor: Optional[Attributor] = field(default=None, repr=False)
    _attr: dict = field(default_factory=dict, repr=False)

    @property
    def keys(self) -> list[str]:
        return [l.key for l in self.launches]

    def attribution(self, i: int) -> Attribution:
        """CPU op chain, shapes and Python source of the code that launched node ``i`` at capture."""
        a = self._attr.get(i)
        if a is None:
            if self._attributor is None:
                self._attributor = Attributor(self.trace)
            l = self.launches[i]
            k = Kernel(l.key, l.ts, 0.0, 0, 0, l.corr if l.corr is not None else -1, None, None, l.ext, "kernel")
            a = self._attributor.attribute(k)
            self._attr[i] = a
        return a


def _labels(trace: Trace, t0: float, t1: float) -> str:
    """The innermost CPU annotation enclosing a capture window, e.g. ``capture_32_DECODE``."""
    best = None
    for a in trace.annotations:
        if not a.gpu and a.ts <= t0 and t1 <= a.ts + a.dur and not a.name.startswith("ProfilerStep"):
            if best is None or a.dur < best.dur:
                best = a
    return best.name if best is not None else ""


def load_capture(path: Union[str, Path]) -> list[CapturedGraph]:
    """The graphs captured in one capture trace (one per Begin/EndCapture window)."""
    buf = read_bytes(path)
    trace = parse(buf, str(path))
    try:
        top = _TOP.decode(buf)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InputError(f"{path}: not a Kineto trace ({e})") from None
    runtime: list[_CapEvent] = []
    for raw in top.traceEvents or []:
        try:
            ev = _EV.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if ev.ph == "X" and ev.cat in ("cuda_runtime", "cuda_driver", "hip_runtime", "Runtime", "runtime"):
            runtime.append(ev)
    runtime.sort(key=lambda e: e.ts)
    begins = [e.ts + e.dur for e in runtime if _BEGIN in e.name]
    ends = [e.ts for e in runtime if _END in e.name]
    graphs: list[CapturedGraph] = []
    for n, (t0, t1) in enumerate(zip(begins, ends)):
        launches = []
        for ev in runtime:
            if t0 <= ev.ts <= t1 and _is_dispatch(ev.name):
                a = ev.args or _CapArgs()
                launches.append(
                    CapturedLaunch(node_key(a.kernel or ev.name), ev.ts, a.correlation, a.external_id, ev.name)
                )
        if launches:
            graphs.append(
                CapturedGraph(
                    file=str(path), label=_labels(trace, t0, t1) or f"graph {n}", launches=launches, trace=trace
                )
            )
    if not graphs:
        if begins:
            raise InputError(f"{path}: the capture windows hold no kernel launches")
        raise InputError(
            f"{path}: not a graph-capture trace (no StreamBeginCapture/StreamEndCapture); record "
            "one with SGLang's --enable-profile-cuda-graph"
        )
    return graphs


def _positional(cap: list[str], rep: list[str]) -> Optional[list[Optional[int]]]:
    return list(range(len(rep))) if cap == rep else None


def _by_name(cap: list[str], rep: list[str]) -> Optional[list[Optional[int]]]:
    if Counter(cap) != Counter(rep):
        return None
    where: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(cap):
        where[k].append(i)
    seen: Counter = Counter()
    out: list[Optional[int]] = []
    for k in rep:
        out.append(where[k][seen[k]])
        seen[k] += 1
    return out


def _greedy(cap: list[str], rep: list[str]) -> list[Optional[int]]:
    """Scan the capture forward for each replayed kernel; a kernel not found stays unmapped."""
    out: list[Optional[int]] = []
    ci = 0
    for k in rep:
        j = ci
        while j < len(cap) and cap[j] != k:
            j += 1
        if j < len(cap):
            out.append(j)
            ci = j + 1
        else:
            out.append(None)
    return out


def align(cap: list[str], rep: list[str]) -> tuple[str, list[Optional[int]]]:
    """(method, capture index per replayed kernel or None)."""
    m = _positional(cap, rep)
    if m is not None:
        return "positional", m
    m = _by_name(cap, rep)
    if m is not None:
        return "by-name", m
    return "greedy", _greedy(cap, rep)


@dataclass
class GraphMatch:
    graph: CapturedGraph
    method: str
    index: list[Optional[int]]  # capture launch index per replayed kernel (GPU order)

    @property
    def mapped(self) -> int:
        return sum(i is not None for i in self.index)


class CaptureSet:
    """Every graph of one or more capture traces (files, or folders of them)."""

    def __init__(self, graphs: list[CapturedGraph], files: list[str]):
        self.graphs = graphs
        self.files = files

    @classmethod
    def load(cls, paths: Sequence[Union[str, Path]]) -> "CaptureSet":
        files: list[Path] = []
        for p in map(Path, paths):
            if p.is_dir():
                from perfscope.load.discover import not_a_trace

                found = sorted(
                    q for q in p.rglob("*") if q.name.endswith((".json", ".json.gz", ".json.xz")) and not not_a_trace(q)
                )  # a tool's own JSON beside the traces (TraceLens' arrays)
                if not found:
                    raise InputError(f"{p}: no capture traces (.json/.json.gz/.json.xz) in this folder")
                files.extend(found)
            else:
                files.append(p)
        graphs: list[CapturedGraph] = []
        for f in files:
            graphs.extend(load_capture(f))
        return cls(graphs, [str(f) for f in files])

    def best_match(self, rep: list[str]) -> Optional[GraphMatch]:
        best: Optional[GraphMatch] = None
        for g in self.graphs:
            method, index = align(g.keys, rep)
            m = GraphMatch(g, method, index)
            if best is None or m.mapped > best.mapped or (m.mapped == best.mapped and method == "positional"):
                best = m
        if best is None or best.mapped < MIN_MAPPED_FRACTION * max(len(rep), 1):
            return None
        return best

    def map_trace(self, trace: Trace) -> "ReplayMap":
        return ReplayMap.build(self, trace)


class ReplayMap:
    """Graph-replayed kernels of one trace -> the captured launch that made each of them."""

    def __init__(self):
        self.by_kernel: dict[tuple, tuple[CapturedGraph, int]] = {}
        self.replays = 0
        self.replays_mapped = 0
        self.kernels = 0
        self.kernels_mapped = 0
        self.methods: Counter = Counter()
        self.labels: Counter = Counter()

    @classmethod
    def build(cls, cs: CaptureSet, trace: Trace) -> "ReplayMap":
        rm = cls()
        graph_corrs = {l.corr for l in trace.launches if l.corr is not None and is_graph_launch(l.name)}
        groups: dict[int, list[Kernel]] = defaultdict(list)
        for k in trace.kernels:  # sorted by start
            if k.corr in graph_corrs:
                groups[k.corr].append(k)
        cache: dict[tuple, Optional[GraphMatch]] = {}
        for ks in groups.values():
            rep = [node_key(k.name, k.kind) for k in ks]
            sig = tuple(rep)
            if sig not in cache:
                cache[sig] = cs.best_match(rep)
            m = cache[sig]
            rm.replays += 1
            rm.kernels += len(ks)
            if m is None:
                continue
            rm.replays_mapped += 1
            rm.methods[m.method] += 1
            rm.labels[m.graph.label] += 1
            for k, ci in zip(ks, m.index):
                if ci is not None:
                    rm.by_kernel[(k.corr, k.ts, k.stream)] = (m.graph, ci)
                    rm.kernels_mapped += 1
        return rm

    def fill(self, k: Kernel, a: Attribution) -> bool:
        """Copy the capture-time op chain, shapes and source of ``k`` into ``a``; False if unmapped."""
        hit = self.by_kernel.get((k.corr, k.ts, k.stream))
        if hit is None:
            return False
        g, i = hit
        c = g.attribution(i)
        a.op_chain = list(c.op_chain)
        a.input_types = copy.deepcopy(c.input_types)
        a.input_dims = copy.deepcopy(c.input_dims)
        a.concrete_inputs = copy.deepcopy(c.concrete_inputs)
        a.source = c.source
        a.stack = list(c.stack)
        a.captured = g.label
        return True

    def note(self) -> str:
        if not self.replays:
            return "a capture trace was given, but this trace has no graph-replayed kernels"
        how = ", ".join(f"{m} x{n}" for m, n in self.methods.most_common()) or "none matched"
        graphs = ", ".join(sorted(self.labels)) or "-"
        return (
            f"graph-replayed kernels attributed by capture trace: {self.kernels_mapped:,} of {self.kernels:,} "
            f"kernels in {self.replays_mapped} of {self.replays} replays mapped ({how}; graphs: {graphs})"
        )

    def to_dict(self) -> dict:
        return {
            "replays": self.replays,
            "replays_mapped": self.replays_mapped,
            "kernels": self.kernels,
            "kernels_mapped": self.kernels_mapped,
            "methods": dict(self.methods),
            "graphs": dict(self.labels),
        }
