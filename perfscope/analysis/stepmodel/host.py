"""The launching thread's own time per step: from one step's start to the next, less its waits on the GPU."""

from __future__ import annotations

import operator
from collections import Counter
from itertools import chain, compress, repeat
from typing import Optional

from perfscope.analysis.stepmodel.index import WAIT_MIN_US, TraceIndex
from perfscope.analysis.steps import Step
from perfscope.load.model import KERNEL_CORR, KERNEL_KIND, Trace


def host_wait_us(l, copies) -> float:
    """How long runtime call ``l`` blocked the host on the GPU: a synchronize, or a copy to the host
    that returned only when its copy (``copies``: its memcpy activities) was done."""
    if l.dur < WAIT_MIN_US:
        return 0.0
    if "Synchronize" in l.name:
        return l.dur
    if l.name.startswith(("cudaMemcpy", "hipMemcpy", "cuMemcpy")) and copies:
        end = max(k.end for k in copies)
        if l.ts + l.dur >= end - 2.0:  # it returned when its copy ended: it waited for the GPU
            return max(0.0, l.dur - WAIT_MIN_US)
    return 0.0


def host_busy(
    trace: Trace, steps: list[Step], by_corr: Optional[dict] = None, index: Optional[TraceIndex] = None
) -> dict:
    """The host's own time per step: from a step's start to the next step's start on the thread that
    launches the steps' GPU work, less the time it blocked on the GPU (synchronizes, copies to the host
    that waited for their data). With the GPU work gone, a step cannot take less than this: the
    scheduler, input preparation, the graph or kernel launches and the result processing still run.

    Returns {id(step): busy µs} for each step that has a next one (the last step's end is unknown)."""
    index = index or TraceIndex(trace)
    by_corr = by_corr if by_corr is not None else {l.corr: l for l in trace.launches if l.corr is not None}
    kern = trace.kernels
    count: dict = {}
    copies: dict = {}  # corr -> the memcpy activities of that call
    # kernels per launching thread (counted per correlation id first: one launch, one thread)
    per_corr = Counter(map(KERNEL_CORR, map(kern.__getitem__, chain.from_iterable(s.kernels for s in steps))))
    for corr, n in per_corr.items():
        l = by_corr.get(corr)
        if l is not None:
            count[(l.pid, l.tid)] = count.get((l.pid, l.tid), 0) + n
    if not count:
        return {}
    thread = max(count, key=lambda t: count[t])
    for k in compress(kern, map(operator.eq, map(KERNEL_KIND, kern), repeat("memcpy"))):  # the copies, found in C
        if k.corr is not None:
            copies.setdefault(k.corr, []).append(k)
    ordered = sorted((s for s in steps if s.kernels), key=lambda s: s.cpu_start)
    out = {}
    for a, b in zip(ordered, ordered[1:]):
        lo, hi = a.cpu_start, b.cpu_start
        if hi <= lo:
            continue
        wait = 0.0
        for l in index.launches_between(lo, hi):
            if l.dur >= WAIT_MIN_US and (l.pid, l.tid) == thread:  # a shorter call waited for nothing
                wait += host_wait_us(l, copies.get(l.corr))
        out[id(a)] = max(0.0, (hi - lo) - wait)
    return out
