"""What the analysed steps add up to, apart from the passes that need the whole analysis: the window
analysed (the steps, or the whole trace), the analysed phase's :class:`StepSummary`, each phase's steps,
the timeline of the median step and the top CPU ops."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from itertools import chain
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from perfscope.analysis.buckets import classify
from perfscope.analysis.metrics import StepMetrics
from perfscope.analysis.names import short_name
from perfscope.analysis.sampling_path import step_overrides
from perfscope.analysis.steps import Step, StepSet
from perfscope.load.model import KERNEL_DUR, Trace

TIMELINE_MAX_KERNELS = 6000


@dataclass
class StepSummary:
    """The analysed phase's steps: how many, their times, how they were found, what the trace is. The
    JSON (``to_dict``: the ``steps`` of ``--json`` and of each rank) has the fields in this order,
    ``unprofiled`` only when a bench measured the step without the profiler."""

    phase: str = "unknown"
    count: int = 0
    median_ms: Optional[float] = None  # by the GPU work of each step (CPU ranges on a CPU-only trace)
    method: str = ""  # perfscope.analysis.steps: which markers found the steps
    how: str = ""  # the same, in words
    window: dict = field(default_factory=dict)  # analysed_window: the steps, or the whole trace
    workload: Optional[str] = None  # perfscope.analysis.workload: serving, training, ...
    workload_how: Optional[str] = None
    workload_model: Optional[str] = None
    workload_evidence: Any = None
    analysed_on: str = "gpu-kernels"  # or "cpu-ops": a trace without GPU kernels
    mean_ms: Optional[float] = None
    min_ms: Optional[float] = None
    max_ms: Optional[float] = None
    cpu_median_ms: Optional[float] = None  # the steps' CPU ranges
    idle_median_ms: Optional[float] = None  # GPU idle inside a step
    launches_per_step: float = 0
    graph_launches_per_step: float = 0
    unprofiled: Optional[dict] = None  # perfscope.analysis.hosttime.unprofiled_step: the bench's step

    @property
    def cpu_only(self) -> bool:
        return self.analysed_on == "cpu-ops"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.unprofiled is None:
            del d["unprofiled"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepSummary":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


STEPS_MIN_GPU_SHARE = 0.05  # steps holding less of the trace's GPU time than this: the whole trace is analysed


def analysed_window(trace: Trace, stepset: StepSet) -> dict:
    """Which window the analysis reads: the steps found, or the whole trace when they hold almost none of
    its GPU work (e.g. profiled steps around a few kernels, the copies outside them)."""
    kern = trace.kernels
    total = sum(map(KERNEL_DUR, kern))  # the same sums, the durations read in C
    held = sum(map(KERNEL_DUR, map(kern.__getitem__, chain.from_iterable(s.kernels for s in stepset.steps))))
    share = held / total if total else 1.0
    out = {"analysed": "steps", "steps_gpu_share": round(share, 4), "gpu_ms_total": round(total / 1e3, 4)}
    if (
        total
        and share < STEPS_MIN_GPU_SHARE
        and stepset.method != "whole-trace"
        and any(k.kind != "cpu" for k in trace.kernels)
    ):
        inside = {i for s in stepset.steps for i in s.kernels}
        by: defaultdict[str, float] = defaultdict(float)
        for i, k in enumerate(trace.kernels):
            if i not in inside:
                by[classify(k.name, k.kind)[0]] += k.dur
        b, us = max(by.items(), key=lambda kv: kv[1])
        out.update(analysed="whole-trace", outside_top=f"{us / (total - held):.0%} {b}")
    return out


def phase_rows(stepset: StepSet) -> list[dict]:
    """{phase, count, median_ms} of every phase found. Each phase is timed as the analysed steps are: by
    the GPU work of its steps that launched some, else (no GPU work in the phase) by the CPU ranges;
    steps without GPU work are counted apart."""
    phases: dict = defaultdict(lambda: {"gpu": [], "cpu": []})
    for s in stepset.steps:
        phases[s.phase]["gpu" if s.kernels else "cpu"].append(s.gpu_us / 1e3 if s.kernels else s.cpu_us / 1e3)
    rows = []
    for p, v in phases.items():
        xs = v["gpu"] or v["cpu"]
        row = {"phase": p, "count": len(xs), "median_ms": round(statistics.median(xs), 4)}
        if v["gpu"] and v["cpu"]:
            row["steps_without_gpu_work"] = len(v["cpu"])
        rows.append(row)
    return rows


def median_step_timeline(
    trace: Trace, metrics: list[StepMetrics], steps: list[Step], step_ms: float, serving: bool
) -> dict:
    """The kernels of the step whose time is the median (``{}`` when no step has any): what the report draws."""
    with_k = [(m, s) for m, s in zip(metrics, steps) if s.kernels]
    if not with_k:
        return {}
    m, s = min(with_k, key=lambda ms: abs(ms[0].gpu_ms - step_ms))
    kern = trace.kernels
    t0 = s.gpu_start if s.gpu_start is not None else min(kern[i].ts for i in s.kernels)  # set: it has kernels
    rows = []
    over = step_overrides(trace, s, serving=serving)
    for i in s.kernels[:TIMELINE_MAX_KERNELS]:
        k = kern[i]
        rows.append(
            [
                k.stream,
                round((k.ts - t0) / 1e3, 5),
                round(k.dur / 1e3, 5),
                short_name(k.name),
                (over.get(i) or classify(k.name, k.kind))[0],
            ]
        )
    return {
        "step": s.index,
        "label": s.label,
        "gpu_ms": round(m.gpu_ms, 4),
        "truncated": len(s.kernels) > TIMELINE_MAX_KERNELS,
        "kernels": rows,
    }


def top_cpu_ops(trace: Trace, steps: list[Step], limit: int = 15) -> list[dict]:
    """Top CPU ops by total time in the window of ``steps`` (the whole trace without steps)."""
    if steps:
        lo = min(s.cpu_start for s in steps)
        hi = max(s.cpu_end for s in steps)
    else:
        lo, hi = float("-inf"), float("inf")
    tot: defaultdict[str, float] = defaultdict(float)
    cnt: Counter[str] = Counter()
    for o in trace.cpu_ops:
        if lo <= o.ts <= hi:
            tot[o.name] += o.dur
            cnt[o.name] += 1
    n = max(len(steps), 1)
    return [
        {"name": k, "ms_per_step": round(v / n / 1e3, 4), "count_per_step": cnt[k] / n}
        for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:limit]
    ]
