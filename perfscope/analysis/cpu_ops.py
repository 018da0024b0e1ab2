"""Traces with no GPU kernels (a CPU-only server, a CPU-side profile) are analysed on their CPU ops:
each leaf op (one with no child op on its thread) stands in for a kernel, on a "stream" per thread.
Collective waits that the backends record as annotations on their own threads (``gloo:all_reduce``)
stand in too, so a rank's wait for its peers shows as communication, not as idle time.
The rest of the analysis then runs unchanged; the report says so in one line."""

from __future__ import annotations

import re

from perfscope.load.model import Kernel, Trace

_COLLECTIVE_ANNOTATION = re.compile(r"^(gloo|nccl|c10d|mpi|ucc):")


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
    for a in trace.annotations:
        if not a.gpu and _COLLECTIVE_ANNOTATION.match(a.name):
            stream = a.tid if isinstance(a.tid, int) else hash(a.tid) & 0xFFFF
            out.append(Kernel(a.name, a.ts, a.dur, stream, -1, -1, None, None, None, "cpu"))
    out.sort(key=lambda k: k.ts)
    return out
