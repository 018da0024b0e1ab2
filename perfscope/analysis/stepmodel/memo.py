"""What every prediction of one analysis shares, built once per trace (``trace.memo["stepmodel"]``): the
launches by correlation id, the :class:`TraceIndex`, each step's replay with its recorded durations, the
host's busy time per step. Read only once built."""

from __future__ import annotations

from perfscope.analysis.kernel_table import launches_by_corr
from perfscope.analysis.stepmodel.host import host_busy
from perfscope.analysis.stepmodel.index import TraceIndex
from perfscope.analysis.stepmodel.replay import StepReplay
from perfscope.analysis.steps import Step
from perfscope.load.model import Trace


def indexes(trace: Trace) -> tuple[dict, TraceIndex]:
    """The trace's launches by correlation id and its :class:`TraceIndex`, built once per trace (every
    finding and alternative of one analysis replays the same steps)."""
    m = trace.memo.get("stepmodel")
    if m is None:
        m = trace.memo["stepmodel"] = {
            "by_corr": launches_by_corr(trace),
            "index": TraceIndex(trace),
            "replay": {},
            "busy": {},
        }
    return m["by_corr"], m["index"]


def host_busy_once(trace: Trace, steps: list[Step], by_corr: dict, index: TraceIndex) -> dict:
    """:func:`host_busy` of these steps, computed once per trace (read only)."""
    memo = trace.memo["stepmodel"]["busy"]
    key = tuple(map(id, steps))
    hit = memo.get(key)
    if hit is None or any(a is not b for a, b in zip(hit[0], steps)):
        hit = memo[key] = (list(steps), host_busy(trace, steps, by_corr, index))  # the steps held: ids stay theirs
    return hit[1]


def host_busy_of(trace: Trace, steps: list[Step]) -> dict:
    """:func:`host_busy` of these steps with the analysis' shared indexes, once per trace (read only):
    the idle rules and the predictions read the same numbers."""
    by_corr, index = indexes(trace)
    return host_busy_once(trace, steps, by_corr, index)


def replay_once(trace: Trace, step: Step, by_corr: dict, index: TraceIndex) -> tuple[StepReplay, dict]:
    """The step's :class:`StepReplay` and its replay with the recorded durations, built once per trace."""
    memo = trace.memo["stepmodel"]["replay"]
    hit = memo.get(id(step))
    if hit is None or hit[0] is not step:
        r = StepReplay(trace, step, by_corr, index)
        durs = r._plan()[4]
        hit = memo[id(step)] = (step, r, r.run_slots(durs, prepared=r.prepare(durs, [])))  # nothing changed
    return hit[1], hit[2]
