"""The waits a step replay follows between streams: kernels of one CUDA-graph launch ordered across
its streams, and eager kernels that waited on another stream (an event, or the SMs it held)."""

from __future__ import annotations

import bisect

from perfscope.analysis.steps import is_graph_launch


def graph_stream_joins(kern, launched) -> dict:
    """Inside one CUDA-graph launch, kernels on a second stream (SGLang's shared experts and MoE
    routing on an alternate stream) are ordered by the graph's event edges, which Kineto does not
    record: a kernel waits in the replay for the kernel of the same launch, on another stream, that
    ended last before it started (when that is later than its own stream's previous kernel ended),
    with the recorded gap. Without this the second stream's kernels kept their recorded times, and
    a fix that shortens the first stream's kernels saved nothing (a 10-layer MoE decode step: 10 ms
    of casts removed, 0.04 ms saved). Returns {kernel index: (the kernel it follows, gap µs)}."""
    out: dict = {}
    for l, ks in launched.values():
        if not is_graph_launch(l.name) or len({kern[i].stream for i in ks}) < 2:
            continue
        order = sorted(ks, key=lambda i: kern[i].ts)
        ends: list = []  # (end, index), sorted by end: the launch's kernels seen so far
        prev_on: dict = {}
        for i in order:
            k = kern[i]
            n = bisect.bisect_right(ends, (k.ts + 1.0, float("inf")))
            own = prev_on.get(k.stream)
            for m in range(n - 1, -1, -1):
                e, j = ends[m]
                if kern[j].stream != k.stream:
                    if own is None or e > kern[own].end:
                        out[i] = (j, max(0.0, k.ts - e))
                    break
            bisect.insort(ends, (k.end, i))
            prev_on[k.stream] = i
    return out


def cross_stream_waits(lk, latency_us, kern, by_corr, step, index, launched) -> dict:
    """Kernels that waited on another stream (cudaStreamWaitEvent on an event recorded there: an
    NCCL stream waiting for the compute that produced its buffer, compute waiting for the
    collective's result). Kineto does not say which stream an event was recorded on (its
    cuda_sync events, where enabled, carry ``wait_on_stream`` = -1 in torch 2.11), so a kernel
    that started later than its launch and its own stream allow (``lk``: the replay's kernels by
    start with their launches, ``latency_us``: its launch latency) is matched, first that applies:

    1. on the CPU: its thread called cudaStreamWaitEvent after that stream's previous launch, and
       before that cudaEventRecord: the event marks the last kernel the thread had launched on
       another stream before the record (``e.record(); s.wait_event(e)``, torch's pattern);
    2. on the GPU timeline: a kernel on another stream ended a few microseconds before it started
       (the wait was issued by another thread, or not recorded);
    3. held back by the SMs of another stream's kernel that was running all along and ended just
       after it started (two GEMMs on two streams run one after the other).

    Returns {kernel index: (the kernel it waited for, its start minus that kernel's end)}."""
    kernels_of = {id(l): ks for l, ks in launched.values()}
    prev_launch: dict = {}  # stream -> CPU time of the previous launch on it
    paired: dict = {}
    for i, k, l, g in lk:
        if l is None:
            continue
        lo = prev_launch.get(k.stream, l.ts - 2e4)
        prev_launch[k.stream] = l.ts
        if g:
            continue
        w = index.last_wait((l.pid, l.tid), lo, l.ts)
        if w is None:
            continue
        before = [c for c in index.launches_between(w.ts - 2e4, w.ts) if (c.pid, c.tid) == (l.pid, l.tid)]
        rec = next((c for c in reversed(before) if c.name.startswith("cudaEventRecord")), None)
        if rec is None:
            continue
        for c in reversed([c for c in before if c.ts < rec.ts]):
            ks = [j for j in kernels_of.get(id(c), ()) if kern[j].stream != k.stream]
            if ks:
                j = max(ks, key=lambda x: kern[x].end)
                if kern[j].end <= k.ts + 1.0:
                    paired[i] = (j, max(0.0, k.ts - kern[j].end))
                break
            if kernels_of.get(id(c)):
                break  # the last launch before the record was on its own stream: not this pattern

    # the step's kernel ends, sorted (end, kernel) and their times: built when a kernel needs them
    ends: list[tuple[float, int]] | None = None
    end_ts: list[float] = []
    tol = 3 * latency_us + 5.0
    # a kernel can also wait for the SMs another stream's kernel holds: it starts as that kernel's
    # last wave drains, before its end (two GEMMs on two streams run one after the other)
    tail = 0.25
    dep: dict = {}
    prev_end: dict = {}
    for i, k, l, g in lk:
        pe = prev_end.get(k.stream)
        prev_end[k.stream] = k.ts + k.dur
        if l is None or g:
            continue
        expl = max(l.ts + latency_us, pe if pe is not None else float("-inf"))
        if k.ts - expl <= 3 * latency_us:
            continue  # its launch or its stream explains its start
        if i in paired:
            dep[i] = paired[i]
            continue
        if ends is None:
            ends = sorted((kern[j].end, j) for j in step.kernels)
            end_ts = [e for e, _ in ends]
        n = bisect.bisect_right(end_ts, k.ts + 1.0)
        for m in range(n - 1, -1, -1):  # the latest end on another stream before it started
            e, j = ends[m]
            if k.ts - e > tol:
                break
            if kern[j].stream != k.stream and e > expl:
                dep[i] = (j, max(0.0, k.ts - e))
                break
        if i in dep:
            continue
        # held back by a kernel of another stream that was running all along and ended just after
        best = None
        for m in range(n, min(n + 64, len(ends))):
            e, j = ends[m]
            kj = kern[j]
            if e - k.ts > tail * kj.dur:
                break
            if kj.stream != k.stream and kj.ts <= expl and kj.dur > 0:
                best = (j, k.ts - e)
        if best is not None:
            dep[i] = best
    return dep
