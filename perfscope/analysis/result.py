"""What an analysis produces: no events; typed findings (:class:`perfscope.analysis.finding.Finding`), ops
(:class:`perfscope.analysis.ops.Op`) and steps (:class:`perfscope.analysis.step_summary.StepSummary`), the
rest plain data. Renderers read only this; ``to_dict`` is the JSON (``--json``, a run folder's
ranks.json.gz, what a worker, a Ray task or a host sends back), ``from_dict`` reads it back."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from perfscope.analysis.finding import Finding, FixCommand
from perfscope.analysis.ops import Op
from perfscope.analysis.step_summary import StepSummary


@dataclass
class RankAnalysis:
    file: str
    rank: Optional[int]
    stage: Optional[str]
    meta: dict
    steps: StepSummary  # the analysed phase
    phases: list[dict]  # every phase found: {phase, count, median_ms}
    buckets: dict  # {bucket: {ms_per_step, share}}
    sub_buckets: dict  # {"copy/cast": {ms_per_step, share}}
    kernel_ms_total: float  # plain sum of every kernel's duration in the file
    gpu_ms_total: float  # kernels + memcpy + memset
    kernel_ms_per_step: float
    idle_ms_per_step: float
    ops: list[Op]  # the dominant ops of the analysed steps, largest first
    findings: list[Finding]
    per_step: list[dict]
    timeline: dict  # one representative step: {step, t0_us, kernels: [[stream, start_ms, dur_ms, short, bucket]]}
    cpu_ops: list[dict] = field(default_factory=list)  # top CPU ops (always; the analysis when no kernels)
    notes: list[str] = field(default_factory=list)
    floor: dict = field(default_factory=dict)  # perfscope.analysis.floor: what a step should cost, gap per bucket
    roofline: dict = field(default_factory=dict)  # perfscope.analysis.roofline: achieved TB/s, TFLOP/s per top op

    def to_dict(self) -> dict:
        d = asdict(replace(self, steps=StepSummary(), ops=[], findings=[]))
        d["steps"] = copy.deepcopy(self.steps.to_dict())
        d["ops"] = copy.deepcopy([o.to_dict() for o in self.ops])
        d["findings"] = copy.deepcopy([f.to_dict() for f in self.findings])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RankAnalysis":
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["steps"] = StepSummary.from_dict(d.get("steps") or {})
        kw["ops"] = [Op.from_dict(o) for o in d.get("ops") or []]
        kw["findings"] = [Finding.from_dict(f) for f in d.get("findings") or []]
        return cls(**kw)


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
        pool = [r for r in self.ranks if r.steps.phase == "decode"] or self.ranks
        return max(pool, key=lambda r: r.steps.median_ms or 0.0)

    def fix_command(self, f: Finding) -> Optional[FixCommand]:
        """The command that fixes finding ``f``, as every renderer prints it: aimed at the run's inputs
        (:meth:`aim`), else at the host and port its run folder recorded."""
        if not f.fix:
            return None
        return f.command or FixCommand.for_run(f.fix, self.run or {})

    def aim(self, paths: Sequence[str | Path]) -> None:
        """Aim every finding's fix command at the run (its recorded host and port) and at the one input
        given (``--trace``): what ``--json`` and every renderer then carry."""
        trace = str(paths[0]) if len(paths) == 1 else None
        for r in self.ranks:
            for f in r.findings:
                if f.fix:
                    f.command = FixCommand.for_run(f.fix, self.run or {}, trace)

    def to_dict(self) -> dict[str, Any]:
        p = self.primary
        d = {
            "tool": "perfscope",
            "schema_version": 1,
            "steps": p.steps.to_dict(),
            "phases": p.phases,
            "buckets": p.buckets,
            "sub_buckets": p.sub_buckets,
            "kernel_ms_total": round(sum(r.kernel_ms_total for r in self.ranks), 4),
            "gpu_ms_total": round(sum(r.gpu_ms_total for r in self.ranks), 4),
            "kernel_ms_per_step": p.kernel_ms_per_step,
            "idle_ms_per_step": p.idle_ms_per_step,
            "findings": [f.to_dict() for f in p.findings],
            "ops": [o.to_dict() for o in p.ops],
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
            d["run"] = {
                k: self.run.get(k)
                for k in ("host", "hosts", "engine", "versions", "timings", "gpu", "server_info", "workload")
                if k in self.run
            }
        return d
