"""Traces with no GPU kernels (a CPU-only server, a CPU-side profile) are analysed on their CPU ops:
each leaf op (one with no child op on its thread) stands in for a kernel, on a "stream" per thread.
The rest of the analysis then runs unchanged; the report says so in one line."""

from __future__ import annotations

from perfscope.load.model import Kernel, Trace


def leaf_ops_as_kernels(trace: Trace) -> list[Kernel]:
    by_tid: dict = {}
    for o in trace.cpu_ops:
        by_tid.setdefault((o.pid, o.tid), []).append(o)
    out: list[Kernel] = []
    for (pid, tid), ops in by_tid.items():
        ops.sort(key=lambda o: (o.ts, -o.dur))
        stream = tid if isinstance(tid, int) else hash(tid) & 0xFFFF
        for i, o in enumerate(ops):
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            if nxt is not None and nxt.ts < o.ts + o.dur:
                continue  # has a child op: not a leaf
            out.append(Kernel(o.name, o.ts, o.dur, stream, -1, -1, None, None, o.ext, "cpu"))
    out.sort(key=lambda k: k.ts)
    return out
