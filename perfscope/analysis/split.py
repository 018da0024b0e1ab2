"""Diagnose as a map and a reduce: one pure task per rank file, then a reduce over their results.

- :func:`prepare`: the run's files and the configuration every rank is analysed with (the run
  folder's server config, workload, bench and host timing), read where the run folder is.
- :func:`rank_task`: one trace file -> that rank's :class:`RankAnalysis` as a plain dict (steps,
  buckets, ops, idle, communication and its exposed part, per-step metrics, findings: the ~100 KB a
  reduce needs), or the one-line error that stopped it. It reads only its own file, so it runs
  wherever the file is: a worker process here (``diagnose``), or a Ray task pinned to the node that
  wrote the file (``diagnose --ray``, :mod:`perfscope.cluster.ray_diagnose`).
- :func:`reduce`: the ranks' results only -> the :class:`Diagnosis` (ranks of one job or not, the
  straggler, the primary rank whose findings lead, the run folder's warnings)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.errors import PerfscopeError
from perfscope.load.discover import TraceFile, TraceSet, discover


@dataclass
class Plan:
    """What :func:`prepare` found: the files to analyse, the configuration and capture map each rank
    task takes, and the trace set the reduce reports on (run folder, duplicates, skipped files)."""

    tset: TraceSet
    config: dict
    capture: Optional[Sequence]

    @property
    def files(self) -> list[TraceFile]:
        return self.tset.files


def run_config(tset: TraceSet, config: Optional[dict] = None, *, host_timing: bool = True) -> dict:
    """The configuration every rank of ``tset`` is analysed with: the run folder's server config and
    workload, the user's ``config`` on top, and what the run measured beside the trace (the host's
    time from its GPU-only profile, read here when ``host_timing``; the unprofiled TPOT of its bench)."""
    cfg = dict(tset.server_info)
    if tset.run_info.get("workload"):
        cfg.setdefault("workload", tset.run_info["workload"])  # batch/context for the floor model
    cfg.update(config or {})
    # what the run measured beside the trace: the host's time without the CPU profiler (its GPU-only
    # profile) and the TPOT without any profiler (its bench): the predictions' host side
    from perfscope.analysis import hosttime

    if host_timing and tset.host_timing and "host_timing" not in cfg:
        ht = hosttime.of_run(tset.host_timing, tset.run_info.get("workload"))
        if ht:
            cfg["host_timing"] = ht
    if "bench" not in cfg:
        b = hosttime.bench_of_run(tset.run_info)
        if b:
            cfg["bench"] = b
    return cfg


def prepare(paths: Sequence[str | Path], config: Optional[dict] = None,
            capture: Optional[Sequence[str | Path]] = None) -> Plan:
    """The files under ``paths`` and what each rank task needs beside its file."""
    tset = discover(paths)
    cfg = run_config(tset, config)
    if tset.capture:
        capture = list(capture or []) + list(tset.capture)  # a capture_traces/ subfolder: the capture map
    return Plan(tset=tset, config=cfg, capture=capture)


def rank_task(tf: TraceFile, config: dict, capture: Optional[list] = None) -> dict:
    """One rank: ``{"ok": RankAnalysis.to_dict()}`` or ``{"error": one line, "exit_code": n}``.
    Pure: reads only ``tf``'s file (and the capture map), returns plain data."""
    from perfscope.analysis.diagnose import analyze_file

    try:
        return {"ok": analyze_file(tf, config, capture).to_dict()}
    except PerfscopeError as e:
        return {"error": str(e), "exit_code": e.exit_code}


def reduce(tset: TraceSet, ranks: list[RankAnalysis], parallel: dict,
           warnings: Iterable[str] = ()) -> Diagnosis:
    """The diagnosis of these ranks' results (in ``tset``'s file order): the run folder's notes and
    warnings, whether they are ranks of one job, the straggler. ``warnings``: more lines to report
    (ranks that could not be analysed where they are)."""
    from perfscope.analysis.diagnose import not_one_job, straggler
    from perfscope.capture.rundir import FRONTEND_NOTE

    for path in tset.frontend:
        for r in ranks:
            r.notes.append(f"{path.name} not analysed: {FRONTEND_NOTE}")
    out = []
    for dup in tset.duplicates:
        out.append(f"{dup['path']} is {dup['same_as']} again ({dup['how']}): analysed once, not as another rank")
    if tset.capture:
        out.append(f"{len(tset.capture)} graph-capture trace(s) in capture_traces/ used as the capture map "
                   "(they attribute graph-replayed kernels), not as ranks")
    out.extend(warnings)
    mixed = not_one_job(ranks)
    out.extend(mixed)
    strag = None if mixed else straggler(ranks)
    return Diagnosis(ranks=ranks, run=tset.run_info, straggler=strag, warnings=out, parallel=parallel,
                     skipped=tset.skipped)
