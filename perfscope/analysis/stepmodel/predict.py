"""The step after a fix: each step replayed with the fix's kernel durations (:func:`predict_after`), or
shortened by the self time the fix removes on a CPU-only trace (:func:`predict_after_serial`)."""

from __future__ import annotations

import operator
import statistics
from itertools import compress, repeat
from typing import Callable, Optional

from perfscope.analysis.stepmodel.memo import host_busy_once, indexes, replay_once
from perfscope.analysis.stepmodel.replay import StepReplay
from perfscope.analysis.steps import Step
from perfscope.load.model import KERNEL_STREAM, Trace
from perfscope.util.fold import added


def _back_to_back_us(kern, idx, duration) -> float:
    """The GPU work of kernels ``idx`` with ``duration(i)`` µs each, back to back: each stream's kernels
    one after another, streams side by side (the busiest stream's total)."""
    per: dict = {}
    for i in idx:
        per[kern[i].stream] = per.get(kern[i].stream, 0.0) + max(0.0, float(duration(i)))
    return max(per.values(), default=0.0)


def _mostly_graph(r: StepReplay, kern, s: Step, by_corr: dict) -> bool:
    """Whether graph launches ran at least half the step's GPU time (once per replay)."""
    hit = r._mostly_graph
    if hit is None:
        durs = r._plan()[4]
        total = sum(durs)
        # every slot in a graph launch (a CUDA-graph decode step): the graph kernels' time is the total
        graph_k = total if 0 not in r.graph_slots else sum([d for g, d in zip(r.graph_slots, durs) if g])
        hit = r._mostly_graph = graph_k >= 0.5 * total
    return hit


def _streams(r: StepReplay) -> list:
    """The step's slots grouped by stream: [slots of the first stream to run a kernel, ...], once per replay."""
    hit = r._streams
    if hit is None:
        kern = r.trace.kernels
        sl = list(map(KERNEL_STREAM, map(kern.__getitem__, r.step.kernels)))  # each slot's stream
        slots = range(len(sl))
        if sl and sl.count(sl[0]) == len(sl):  # one stream (a CUDA-graph decode step): every slot
            hit = r._streams = [list(slots)]
        else:  # each stream's slots in order, the streams in the order of their first slot (few streams)
            hit = r._streams = [list(compress(slots, map(operator.eq, sl, repeat(st)))) for st in dict.fromkeys(sl)]
    return hit


def _back_to_back_slots(streams: list, nd: list) -> float:
    """:func:`_back_to_back_us` with the durations by slot, each at least 0 (``streams``: :func:`_streams`).
    Each stream's total added up in slot order from 0.0 (perfscope.util.fold.added: one float addition
    after another, as a loop adds them, in C)."""
    return max(
        [added(map(nd.__getitem__, slots)) for slots in streams],
        default=0.0,
    )


def predict_after(
    trace: Trace,
    steps: list[Step],
    step_ms: float,
    new_duration: Callable[[int], Optional[float]],
    added_us_per_step: float = 0.0,
    *,
    lower_bound: bool = True,
) -> dict:
    """The step after a fix that changes kernel durations (``new_duration(i)``: µs, or None = unchanged).

    ``added_us_per_step``: GPU time of kernels the fix adds (e.g. one fused sampling kernel), put
    at the step's end. ``lower_bound``: also replay each step on the runtime calls alone for
    ``lower_bound_ms`` (None without: a replay per step less). Returns the prediction and how it was bound."""
    kern = trace.kernels
    by_corr, index = indexes(trace)
    saved, low_after, kernel_saved, launch_bound = [], [], [], 0
    busy = host_busy_once(trace, steps, by_corr, index)
    host_left = []  # per step with a next one: the host's own time, less the CPU time of ops the fix removes
    host_before, removed = [], []  # the same before the fix, and the CPU time of the ops it removes
    busy_after, graph_steps = [], 0  # the GPU's busy time per step after the fix; steps mostly graph-replayed
    for s in steps:
        if not s.kernels:
            continue
        r, base = replay_once(trace, s, by_corr, index)
        durs = r._plan()[4]
        # the step's new durations by slot (step.kernels order), asked once per kernel: the recorded ones
        # but in the slots the fix changes (found in C: a fix changes few of a step's kernels)
        vals = list(map(new_duration, s.kernels))
        changed = list(compress(range(len(vals)), map(operator.is_not, vals, repeat(None))))
        nd = list(durs)
        for p in changed:
            nd[p] = vals[p]
        prep = r.prepare(nd, changed)
        after = r.run_slots(nd, prepared=prep)
        if id(s) in busy:
            host_left.append(max(0.0, busy[id(s)] - after["removed_cpu_us"]))
            host_before.append(busy[id(s)])
            removed.append(after["removed_cpu_us"])
        ks = sum(map(operator.sub, durs, nd)) - added_us_per_step
        saved.append(base["span_us"] - after["span_us"] - added_us_per_step)
        kernel_saved.append(ks)
        busy_after.append(_back_to_back_slots(_streams(r), prep[0]) + added_us_per_step)
        graph_steps += _mostly_graph(r, kern, s, by_corr)
        gpu_left = s.gpu_us - ks
        if lower_bound:  # the GPU work left, and the runtime calls alone back to back
            low = r.run_slots(nd, timeline="launch-api", prepared=prep)
            low_after.append(max(low["span_us"] + added_us_per_step, gpu_left, 0.0))
        # launch-bound: the replayed step ends within a few launch latencies of its last launch
        if after["last_launch_us"] + 3 * r.latency_us >= after["last_end_us"]:
            launch_bound += 1
    if not saved:
        return {}
    sv = statistics.median(saved) / 1e3
    ks = statistics.median(kernel_saved) / 1e3
    gpu_pred = max(step_ms - sv, 0.0)
    host = statistics.median(host_left) / 1e3 if host_left else None
    lower = min(statistics.median(low_after) / 1e3, gpu_pred) if low_after else None
    return {
        # the GPU side only: perfscope.analysis.hosttime adds the host's unprofiled time (rules.model_prediction)
        "predicted_step_ms": round(gpu_pred, 4),
        "bound": "gpu",
        "gpu_prediction_ms": round(gpu_pred, 4),
        "host_floor_ms": round(host, 4) if host is not None else None,  # profiled: the host's busy time left
        "lower_bound_ms": round(lower, 4) if lower is not None else None,
        "gpu_busy_after_ms": round(statistics.median(busy_after) / 1e3, 4),
        "graph_steps": graph_steps >= len(saved) / 2,
        "host_busy_ms": round(statistics.median(host_before) / 1e3, 4) if host_before else None,
        # the quickest tenth of the steps: the host least disturbed by the profiler (its buffer flushes)
        # and by waking from long waits on a slow GPU; perfscope.analysis.hosttime scales this one
        "host_busy_quick_ms": round(sorted(host_before)[len(host_before) // 10] / 1e3, 4) if host_before else None,
        "removed_cpu_ms": round(statistics.median(removed) / 1e3, 4) if removed else 0.0,
        "kernel_time_saved_ms": round(ks, 4),
        "step_time_saved_ms": round(sv, 4),
        "kernel_only_prediction_ms": round(max(step_ms - ks, 0.0), 4),
        "launch_bound_steps": f"{launch_bound}/{len(saved)}",
        "model": "CPU launch timeline replay (perfscope.analysis.stepmodel): the GPU work on this trace's "
        "recorded launch times; host_floor_ms the profiled host's busy time per step left after the "
        "fix; lower_bound_ms with only the runtime calls' own CPU time",
    }


def predict_after_serial(
    trace: Trace, steps: list[Step], new_duration: Callable[[int], Optional[float]], added_us_per_step: float = 0.0
) -> dict:
    """The step after a fix on a CPU-only trace (ops as kernels, perfscope.analysis.cpu_ops).

    A thread runs its ops one after another, so a step shortens by exactly the self time the fix
    removes from it. Each step is paired with its own saving (median over steps of step - saving):
    subtracting a mean saving from the median step mixes two statistics, and one slow step (a busy
    host) makes the mean saving exceed the median step, predicting 0 ms."""
    kern = trace.kernels
    after, saved = [], []
    for s in steps:
        if not s.kernels:
            continue
        sv = 0.0
        for i in s.kernels:
            v = new_duration(i)
            if v is not None:
                sv += kern[i].dur - max(0.0, float(v))
        sv -= added_us_per_step
        saved.append(sv)
        after.append(max(s.gpu_us - sv, 0.0))
    if not after:
        return {}
    pred = statistics.median(after) / 1e3
    sv = statistics.median(saved) / 1e3
    return {
        "predicted_step_ms": round(pred, 4),
        "kernel_time_saved_ms": round(sv, 4),
        "step_time_saved_ms": round(sv, 4),
        "model": "CPU-only trace: the step's thread runs its ops serially, so each step shortens by the "
        "op self time the fix removes from it (median over steps of the step minus its own saving)",
    }
