"""A trace's runtime calls and torch ops sorted by start, for the step model's per-step windows."""

from __future__ import annotations

import bisect
import operator
from typing import Optional

from perfscope.load.model import Trace, by_start_longest_first

_TS = operator.attrgetter("ts")
WAIT_MIN_US = 5.0  # a runtime call this long that returns when the GPU work before it ends: a host wait


def is_wait_candidate(name: str) -> bool:
    return (
        "Synchronize" in name
        or name.startswith(("cudaMemcpy", "hipMemcpy", "cuMemcpy"))
        or name in ("cudaStreamWaitEvent",)
    )


class TraceIndex:
    """Runtime calls and torch ops of a trace sorted by start, for per-step windows by bisection."""

    def __init__(self, trace: Trace):
        self.launches = sorted(trace.launches, key=_TS)
        self.l_ts = [l.ts for l in self.launches]
        # by start, the longer first at one start: each thread's ops in the order StepReplay reads them
        self.ops = by_start_longest_first([o for o in trace.cpu_ops if o.name.startswith("aten::")])
        self.o_ts = [o.ts for o in self.ops]
        self._waits: Optional[dict] = None

    def launches_between(self, lo: float, hi: float):
        return self.launches[bisect.bisect_left(self.l_ts, lo) : bisect.bisect_right(self.l_ts, hi)]

    def aten_ops_between(self, lo: float, hi: float):
        return self.ops[bisect.bisect_left(self.o_ts, lo) : bisect.bisect_right(self.o_ts, hi)]

    def last_wait(self, thread, lo: float, hi: float):
        """The last cudaStreamWaitEvent call of ``thread`` (pid, tid) that started in [lo, hi], or None."""
        if self._waits is None:
            waits: dict = {}
            for l in self.launches:
                if l.name == "cudaStreamWaitEvent":
                    w = waits.setdefault((l.pid, l.tid), ([], []))
                    w[0].append(l)
                    w[1].append(l.ts)
            self._waits = waits
        w = self._waits.get(thread)
        if w is None:
            return None
        j = bisect.bisect_right(w[1], hi) - 1
        return w[0][j] if j >= 0 and w[1][j] >= lo else None
