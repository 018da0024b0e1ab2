"""Who launched a kernel: the runtime call, the CPU op chain with dtypes/shapes, the Python line.

Eager kernels carry the External id of the innermost CPU op (``aten::copy_``); the ops around it
(``aten::to > aten::_to_copy > aten::copy_``) and the Python frames around the launch are found by
time containment on the launching thread. Graph-replayed kernels have none of this: they are
attributed by name and launch geometry, or by a graph-capture trace (see ``capture_map``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Optional


from perfscope.analysis.kernel_table import launches_by_corr
from perfscope.analysis.steps import is_graph_launch
from perfscope.load import shapes
from perfscope.load.model import CpuOp, Kernel, Launch, PyFrame, Trace, by_start_longest_first

# frames that are plumbing, not the line a user wants to see
_PLUMBING = (
    "torch/",
    "<built-in",
    "nn.Module:",
    "contextlib.py",
    "functools.py",
    "threading.py",
    "typing.py",
    "<frozen",
    "abc.py",
    "site-packages/torch/",
    "_compile.py",
    "eval_frame.py",
    "profiler.py",
    "_ops.py",
    "triton/runtime",
    "triton/backends",
    "dist-packages/torch/",
)


@dataclass
class Attribution:
    launcher: Optional[str] = None  # cudaLaunchKernel / cudaGraphLaunch / ...
    graph_replay: bool = False
    op_chain: list[str] = field(default_factory=list)  # outermost -> innermost
    input_types: Optional[list] = None
    input_dims: Optional[list] = None
    concrete_inputs: Optional[list] = None
    source: Optional[str] = None  # "path/file.py(123): fn"
    stack: list[str] = field(default_factory=list)  # innermost first, plumbing removed
    captured: Optional[str] = None  # graph-replayed: the captured graph that attributed it (capture_map)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _innermost(sorted_items: list, starts: list[float], ts: float, accept=None, below: int | None = None):
    """The latest-starting interval that contains ts (nested intervals sorted by start), searching
    only indices below ``below`` when given."""
    i = bisect.bisect_right(starts, ts) - 1
    if below is not None:
        i = min(i, below - 1)
    scanned = 0
    while i >= 0 and scanned < 20000:
        it = sorted_items[i]
        if it.ts <= ts <= it.ts + it.dur and (accept is None or accept(it)):
            return i
        i -= 1
        scanned += 1
    return -1


class Attributor:
    def __init__(self, trace: Trace, capture=None):
        self.trace = trace
        self.capture = capture  # capture_map.ReplayMap: graph-replayed kernels -> capture-time launches
        self.by_corr: dict[int, Launch] = launches_by_corr(trace)  # shared with the step model: read only
        # indexes built on first use (_index_ops, _index_frames): ops by External id, ops and frames by
        # thread (sorted by start, with their starts), frames by id
        self._ops_indexed = False
        self._ops_by_ext: dict[int, CpuOp] = {}
        self._ops_by_tid: dict[Any, tuple[list[CpuOp], list[float]]] = {}
        self._frames_indexed = False
        self._frames_by_tid: dict[Any, tuple[list[PyFrame], list[float]]] = {}
        self._frame_by_id: dict[int, PyFrame] = {}

    def _index_ops(self) -> None:
        if not self._ops_indexed:
            self._ops_indexed = True
            by_tid: dict[Any, list[CpuOp]] = {}
            by_ext = self._ops_by_ext
            for o in self.trace.cpu_ops:
                if o.ext is not None and o.ext not in by_ext:
                    by_ext[o.ext] = o
                th = by_tid.get((o.pid, o.tid))
                if th is None:
                    th = by_tid[(o.pid, o.tid)] = []
                th.append(o)
            for key, ops in by_tid.items():
                ops = by_start_longest_first(ops)
                self._ops_by_tid[key] = (ops, [o.ts for o in ops])

    def _index_frames(self) -> None:
        if not self._frames_indexed:
            self._frames_indexed = True
            by_tid: dict[Any, list[PyFrame]] = {}
            for f in self.trace.frames:
                th = by_tid.get((f.pid, f.tid))
                if th is None:
                    th = by_tid[(f.pid, f.tid)] = []
                th.append(f)
                if f.id is not None:
                    self._frame_by_id[f.id] = f
            for key, fr in by_tid.items():
                fr = by_start_longest_first(fr)
                self._frames_by_tid[key] = (fr, [f.ts for f in fr])

    def op_of(self, k: Kernel) -> Optional[CpuOp]:
        """The innermost CPU op of a kernel (its External id), or the op itself for CPU-only traces."""
        self._index_ops()
        ext = k.ext
        if ext is None:
            launch = self.launch_of(k)
            ext = launch.ext if launch is not None else None
        return self._ops_by_ext.get(ext) if ext is not None else None

    def signature(self, k: Kernel):
        """What groups instances of one op: the kernel name; for CPU ops also their dtypes and
        shapes (one `aten::copy_` name covers very different copies)."""
        if k.kind != "cpu":
            return k.name
        op = self.op_of(k)
        if op is None:
            return k.name
        return (k.name, bytes(op.input_type), bytes(op.input_dims))

    def launch_of(self, k: Kernel) -> Optional[Launch]:
        return self.by_corr.get(k.corr)

    def attribute(self, k: Kernel) -> Attribution:
        a = Attribution()
        launch = self.launch_of(k)
        if launch is not None:
            a.launcher = launch.name
            a.graph_replay = is_graph_launch(launch.name)
        if a.graph_replay:
            if self.capture is not None:
                self.capture.fill(k, a)
            return a
        self._index_ops()
        ext = k.ext if k.ext is not None else (launch.ext if launch is not None else None)
        op = self._ops_by_ext.get(ext) if ext is not None else None
        where = launch if launch is not None else op
        if op is not None:
            a.input_types = shapes.input_types(op.input_type)
            a.input_dims = shapes.input_dims(op.input_dims)
            a.concrete_inputs = shapes.concrete_inputs(op.concrete)
            a.op_chain = self._op_chain(op)
        elif launch is not None:
            a.op_chain = self._op_chain_at(launch)
        if where is not None and self.trace.frames:
            a.stack = self._py_stack(where.pid, where.tid, where.ts)
            a.source = a.stack[0] if a.stack else None
        return a

    def _op_chain(self, op: CpuOp) -> list[str]:
        chain = self._enclosing_ops(op.pid, op.tid, op.ts + min(op.dur, 1e-3))
        if not chain or chain[-1] != op.name:
            chain.append(op.name)
        return chain[-4:]

    def _op_chain_at(self, launch: Launch) -> list[str]:
        self._index_ops()
        return self._enclosing_ops(launch.pid, launch.tid, launch.ts)[-4:]

    def _enclosing_ops(self, pid, tid, ts) -> list[str]:
        entry = self._ops_by_tid.get((pid, tid))
        if not entry:
            return []
        ops, starts = entry
        out: list[str] = []
        i = _innermost(ops, starts, ts)
        guard = 0
        while i >= 0 and guard < 64:
            o = ops[i]
            out.append(o.name)
            # the next enclosing op starts before this one and ends after ts
            i = _innermost(ops, starts, o.ts, below=i, accept=lambda x, o=o: x.ts + x.dur >= o.ts + o.dur)
            guard += 1
        return list(reversed(out))

    def _py_stack(self, pid, tid, ts) -> list[str]:
        self._index_frames()
        entry = self._frames_by_tid.get((pid, tid))
        if not entry:
            return []
        frames, starts = entry
        i = _innermost(frames, starts, ts)
        if i < 0:
            return []
        f = frames[i]
        out = []
        guard = 0
        while f is not None and guard < 200:
            if not any(p in f.name for p in _PLUMBING):
                out.append(f.name)
                if len(out) >= 6:
                    break
            f = self._frame_by_id.get(f.parent) if f.parent is not None else None
            guard += 1
        return out
