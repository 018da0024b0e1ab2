"""What an analysis produces: plain data, JSON-ready, no events. Renderers read only this."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional


@dataclass
class RankAnalysis:
    file: str
    rank: Optional[int]
    stage: Optional[str]
    meta: dict
    steps: dict  # {phase, count, median_ms, method, ...}: the analysed phase
    phases: list[dict]  # every phase found: {phase, count, median_ms}
    buckets: dict  # {bucket: {ms_per_step, share}}
    sub_buckets: dict  # {"copy/cast": {ms_per_step, share}}
    kernel_ms_total: float  # plain sum of every kernel's duration in the file
    gpu_ms_total: float  # kernels + memcpy + memset
    kernel_ms_per_step: float
    idle_ms_per_step: float
    ops: list[dict]
    findings: list[dict]
    per_step: list[dict]
    timeline: dict  # one representative step: {step, t0_us, kernels: [[stream, start_ms, dur_ms, short, bucket]]}
    cpu_ops: list[dict] = field(default_factory=list)  # top CPU ops (always; the analysis when no kernels)
    notes: list[str] = field(default_factory=list)
    floor: dict = field(default_factory=dict)  # perfscope.analysis.floor: what a step should cost, gap per bucket
    roofline: dict = field(default_factory=dict)  # perfscope.analysis.roofline: achieved TB/s, TFLOP/s per top op

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RankAnalysis":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class Diagnosis:
    """One or more ranks; the top-level numbers are the slowest rank's (a TP step waits for it)."""

    ranks: list[RankAnalysis]
    run: dict = field(default_factory=dict)  # run.json of a perfscope run folder, when given
    straggler: Optional[dict] = None
    parallel: dict = field(default_factory=dict)  # {files, workers, bound}: how the files were parsed
    warnings: list[str] = field(default_factory=list)  # about the set of files (ranks of different jobs, ...)
    skipped: list = field(default_factory=list)  # [{path, why}]: non-trace JSON found in a given folder

    @property
    def timings(self) -> dict:
        """The client-measured timings of a run folder: `perfscope bench`'s (no profiler running)
        when there are some, else the ones measured during the trace (under the profiler)."""
        t = (self.run or {}).get("timings") or {}
        bench = t.get("bench")
        if isinstance(bench, dict) and bench.get("tpot_ms"):
            return dict(bench, source="bench", under_profiler=False)
        if t.get("tpot_ms"):
            return dict(t, source="trace", under_profiler=bool(t.get("under_profiler", True)))
        return {}

    @property
    def primary(self) -> RankAnalysis:
        """The decode analysis of the slowest rank (else the slowest analysis of any phase)."""
        pool = [r for r in self.ranks if r.steps.get("phase") == "decode"] or self.ranks
        return max(pool, key=lambda r: r.steps.get("median_ms") or 0.0)

    def to_dict(self) -> dict[str, Any]:
        p = self.primary
        d = {
            "tool": "perfscope",
            "schema_version": 1,
            "steps": p.steps,
            "phases": p.phases,
            "buckets": p.buckets,
            "sub_buckets": p.sub_buckets,
            "kernel_ms_total": round(sum(r.kernel_ms_total for r in self.ranks), 4),
            "gpu_ms_total": round(sum(r.gpu_ms_total for r in self.ranks), 4),
            "kernel_ms_per_step": p.kernel_ms_per_step,
            "idle_ms_per_step": p.idle_ms_per_step,
            "findings": p.findings,
            "ops": p.ops,
            "device": {k: p.meta.get(k) for k in ("device_name", "compute_capability", "num_sms", "platform")},
            "notes": p.notes + self.warnings,
            "warnings": self.warnings,
            "floor": p.floor,
            "roofline": p.roofline,
            "primary_rank": p.rank,
            "straggler": self.straggler,
            "parallel": self.parallel,
            "skipped": self.skipped,
            "ranks": [r.to_dict() for r in self.ranks],
        }
        if self.run:
            d["run"] = {k: self.run.get(k) for k in ("host", "hosts", "engine", "versions", "timings", "gpu",
                                                     "server_info", "workload") if k in self.run}
        return d
