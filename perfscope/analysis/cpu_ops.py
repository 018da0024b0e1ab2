"""Traces with no GPU kernels (a CPU-only server, a CPU-side profile) are analysed on their CPU ops.

Each op's *exclusive* (self) time on its own thread stands in for kernel time: the op's interval
minus the intervals of the ops nested directly in it. So ``aten::linear > aten::addmm`` books the
GEMM's time on ``aten::addmm`` (not on the small ``aten::empty`` it calls, as counting only leaf
ops did), an attention op carries its own compute, and the self pieces on one thread never
overlap: a step's op time can never exceed the step. Each op becomes one or more pieces (the gaps
between its children), all carrying the op's id in ``corr`` so that the op tables count the op
once. A thread is a "stream" (:func:`thread_stream`); the step finder keeps to the thread that ran
the step (CPU ops of other threads are not that step's work, and summing overlapping threads
made op time exceed the step).

Collective waits that the backends record as annotations on their own threads (``gloo:all_reduce``)
stand in too, so a rank's wait for its peers shows as communication, not as idle time; the same
collective on several backend threads at once is counted once (the union of their intervals). The rest
of the analysis then runs unchanged; the report says so in one line."""

from __future__ import annotations

import re

from perfscope.load.model import Kernel, Trace

_COLLECTIVE_ANNOTATION = re.compile(r"^(gloo|nccl|c10d|mpi|ucc):")
NOTE = (
    "no GPU kernels in this trace: analysed on its CPU ops (each op's self time on its own thread "
    "stands in for kernel time)"
)


def thread_stream(tid) -> int:
    """The "stream" number a CPU thread's ops get (a thread id, or a hash of a named one)."""
    return tid if isinstance(tid, int) else hash(tid) & 0xFFFF


def is_collective_standin(name: str) -> bool:
    return bool(_COLLECTIVE_ANNOTATION.match(name))


def self_time_pieces(ops: list) -> list[tuple[int, float, float]]:
    """(op index, start, end) of each op's exclusive time, for ops of ONE thread given as objects
    with ``ts`` and ``dur``. A child that runs past its parent's end is cut at it."""
    order = sorted(range(len(ops)), key=lambda i: (ops[i].ts, -ops[i].dur))
    out: list[tuple[int, float, float]] = []
    stack: list[list] = []  # [op index, end, cursor]: the open ops, innermost last

    def close_until(t: float) -> None:
        while stack and stack[-1][1] <= t:
            i, end, cur = stack.pop()
            if end > cur:
                out.append((i, cur, end))
            if stack:
                stack[-1][2] = max(stack[-1][2], end)

    for i in order:
        o = ops[i]
        start, end = o.ts, o.ts + o.dur
        close_until(start)
        if stack:
            parent = stack[-1]
            if start > parent[2]:
                out.append((parent[0], parent[2], start))
            parent[2] = max(parent[2], start)
            end = min(end, parent[1])
        stack.append([i, end, start])
    close_until(float("inf"))
    return out


def cpu_ops_as_kernels(trace: Trace) -> list[Kernel]:
    by_tid: dict = {}
    for o in trace.cpu_ops:
        by_tid.setdefault((o.pid, o.tid), []).append(o)
    out: list[Kernel] = []
    uid = 0
    for (_pid, tid), ops in by_tid.items():
        stream = thread_stream(tid)
        for i, s, e in self_time_pieces(ops):
            o = ops[i]
            out.append(Kernel(o.name, s, e - s, stream, -1, uid + i, None, None, o.ext, "cpu"))
        uid += len(ops)
    # one collective is often recorded on several backend threads at once (HTA's gloo rank: the
    # same all_reduce on two threads, 170 ms each, overlapping): the rank waits for it once, so
    # each stand-in keeps only the time no earlier stand-in already covers
    covered = float("-inf")
    for a in sorted(
        (a for a in trace.annotations if not a.gpu and is_collective_standin(a.name)), key=lambda a: (a.ts, -a.dur)
    ):
        start, end = max(a.ts, covered), a.ts + a.dur
        if end > start:
            out.append(Kernel(a.name, start, end - start, thread_stream(a.tid), -1, uid, None, None, None, "cpu"))
            uid += 1
            covered = end
    out.sort(key=lambda k: k.ts)
    return out
