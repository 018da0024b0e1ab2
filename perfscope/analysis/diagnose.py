"""Diagnose a set of trace files: each rank (file) analysed in its own process, then combined."""

from __future__ import annotations

import os
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Optional

from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.errors import InputError, PerfscopeError
from perfscope.load.discover import TraceFile, TraceSet, discover
from perfscope.load.reader import load_trace


def analyze_file(tf: TraceFile, config: dict, capture: Optional[list] = None) -> RankAnalysis:
    """``capture``: graph-capture trace paths (files or folders) that attribute graph-replayed kernels."""
    trace = load_trace(tf.path)
    if not trace.kernels and not trace.cpu_ops and not trace.annotations:
        raise InputError(f"{tf.path}: no events perfscope can use (no kernels, CPU ops or annotations)")
    rank = tf.rank if tf.rank is not None else trace.meta.rank
    cap = None
    if capture:
        from perfscope.analysis.capture_map import CaptureSet
        cap = CaptureSet.load(capture)
    return analyze_trace(trace, config, rank=rank, stage=tf.stage, capture=cap)


def _worker(args: tuple) -> dict:
    tf, config, capture = args
    try:
        return {"ok": analyze_file(tf, config, capture).to_dict()}
    except PerfscopeError as e:
        return {"error": str(e), "exit_code": e.exit_code}


def straggler(ranks: list[RankAnalysis]) -> Optional[dict]:
    timed = [r for r in ranks if r.steps.get("median_ms")]
    if len(timed) < 2:
        return None
    meds = [r.steps["median_ms"] for r in timed]
    mid = statistics.median(meds)
    slow = max(timed, key=lambda r: r.steps["median_ms"])
    fast = min(timed, key=lambda r: r.steps["median_ms"])
    return {"rank": slow.rank, "stage": slow.stage, "median_ms": slow.steps["median_ms"],
            "ranks_median_ms": round(mid, 4), "slower_than_median": round(slow.steps["median_ms"] / mid, 4) if mid else None,
            "fastest_rank": fast.rank, "spread_ms": round(slow.steps["median_ms"] - fast.steps["median_ms"], 4),
            "significant": bool(mid and slow.steps["median_ms"] > 1.05 * mid)}


def diagnose(paths: list[str | Path], config: Optional[dict] = None, workers: Optional[int] = None,
             on_done: Optional[Callable[[int, int], None]] = None,
             capture: Optional[list[str | Path]] = None) -> Diagnosis:
    """Analyse every trace under ``paths``; several files are parsed in parallel processes."""
    tset: TraceSet = discover(paths)
    cfg = dict(tset.server_info)
    if tset.run_info.get("workload"):
        cfg.setdefault("workload", tset.run_info["workload"])  # batch/context for the floor model
    cfg.update(config or {})
    files = tset.files
    results: list[Optional[RankAnalysis]] = [None] * len(files)
    nproc = workers or min(len(files), os.cpu_count() or 1)
    if len(files) == 1 or nproc <= 1:
        for i, tf in enumerate(files):
            results[i] = analyze_file(tf, cfg, capture)
            if on_done:
                on_done(i + 1, len(files))
    else:
        with ProcessPoolExecutor(max_workers=nproc) as pool:
            futs = {pool.submit(_worker, (tf, cfg, capture)): i for i, tf in enumerate(files)}
            done = 0
            for fut in as_completed(futs):
                out = fut.result()
                if "error" in out:
                    for f in futs:
                        f.cancel()
                    raise InputError(out["error"])
                results[futs[fut]] = RankAnalysis.from_dict(out["ok"])
                done += 1
                if on_done:
                    on_done(done, len(files))
    ranks = [r for r in results if r is not None]
    return Diagnosis(ranks=ranks, run=tset.run_info, straggler=straggler(ranks))
