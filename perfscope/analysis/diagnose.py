"""Diagnose a set of trace files: each rank (file) analysed in its own process, then combined
(the task and the reduce: :mod:`perfscope.analysis.split`)."""

from __future__ import annotations

import os
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Optional, Sequence

from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.parallel import available_memory, json_bytes, plan_workers
from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.errors import InputError
from perfscope.load.discover import TraceFile
from perfscope.load.reader import load_trace
from perfscope.util.gcpause import collector_paused


def analyze_file(tf: TraceFile, config: dict, capture: Optional[list] = None,
                 on_read: Optional[Callable[[int, int], None]] = None) -> RankAnalysis:
    """``capture``: graph-capture trace paths (files or folders) that attribute graph-replayed kernels;
    ``on_read(bytes_done, bytes_total)`` follows the reading of the file."""
    with collector_paused():  # millions of long-lived tuples: the collector's passes would walk them all
        trace = load_trace(tf.path, progress=on_read)
        if not trace.kernels and not trace.cpu_ops and not trace.annotations:
            raise InputError(f"{tf.path}: no events perfscope can use (no kernels, CPU ops or annotations)")
        rank = tf.rank if tf.rank is not None else trace.meta.rank
        cap = None
        if capture:
            from perfscope.analysis.capture_map import CaptureSet
            cap = CaptureSet.load(capture)
        ra = analyze_trace(trace, config, rank=rank, stage=tf.stage, capture=cap)
        del trace  # freed before the collector is back (else its first pass would walk the whole trace)
    if getattr(tf, "host", None):
        ra.meta["host"] = tf.host  # several hosts: the per-rank table names each rank's host
    return ra


def _worker(args: tuple) -> dict:
    from perfscope.analysis.split import rank_task

    return rank_task(*args)


def _compute_ms(r: RankAnalysis) -> float:
    """Kernel time per step that is not communication: the work a rank must finish before its
    peers can leave their all-reduce (their communication kernels absorb the wait)."""
    return r.kernel_ms_per_step - r.buckets.get("communication", {}).get("ms_per_step", 0.0)


NOISE_SIGMAS = 3.0


def _noise(ranks: list[RankAnalysis], value) -> float:
    """Median over ranks of the median absolute deviation of ``value(step)`` across their steps."""
    mads = []
    for r in ranks:
        xs = [value(m) for m in r.per_step]
        if len(xs) >= 2:
            med = statistics.median(xs)
            mads.append(statistics.median(abs(x - med) for x in xs))
    return statistics.median(mads) if mads else 0.0


def _paired_noise(ranks: list[RankAnalysis], value, cand: RankAnalysis) -> Optional[float]:
    """The noise of ``cand``'s lead when the ranks' steps pair up (the same number of steps each, as
    ranks of one TP group stepping in lockstep): the median absolute deviation, over the steps, of
    ``cand``'s step minus the other ranks' median of the same step. A slow step that slows every
    rank (a bigger batch, a busy host) cancels out; a rank late in every step stands out. None when
    the steps do not pair up."""
    series = {id(r): [value(m) for m in r.per_step] for r in ranks}
    n = {len(v) for v in series.values()}
    if len(n) != 1 or n.pop() < 3:
        return None
    others = [series[id(r)] for r in ranks if r is not cand]
    diffs = [x - statistics.median(o[i] for o in others) for i, x in enumerate(series[id(cand)])]
    med = statistics.median(diffs)
    return statistics.median(abs(d - med) for d in diffs)


def _lead_noise(ranks: list[RankAnalysis], value, cand: RankAnalysis) -> float:
    """The noise a lead must stand above: the ranks' own step-to-step noise, or the paired one when the
    steps pair up and that is smaller (see :func:`_paired_noise`)."""
    plain = _noise(ranks, value)
    paired = _paired_noise(ranks, value, cand)
    return plain if paired is None else min(plain, paired)


CPU_OPS_THRESHOLD = 1.25  # ranks of a CPU-only trace share the host's cores: their timings are noisier


def straggler(ranks: list[RankAnalysis], threshold: float = 1.05) -> Optional[dict]:
    """The slowest rank among comparable ones: same stage and phase, at least two timed steps.

    Two signals: the longest step (a rank that is late after its last collective), and the most
    non-communication kernel time (a rank that is late before a collective: every rank's step grows
    by the same wait, but the late rank's communication kernels wait the least). ``significant``
    when either exceeds the median of the other ranks by ``threshold`` (``CPU_OPS_THRESHOLD`` for CPU-only
    traces, whose ranks share the host's cores, and step time alone there) and by more than ``NOISE_SIGMAS`` times the
    step-to-step noise (median absolute deviation) of the ranks, or of the lead itself step by step
    when the ranks' steps pair up (:func:`_paired_noise`).
    """
    groups: dict = {}
    for r in ranks:
        if (r.steps.get("count") or 0) >= 2 and r.steps.get("median_ms"):
            groups.setdefault((r.stage, r.steps.get("phase")), []).append(r)
    groups = {k: v for k, v in groups.items() if len(v) >= 2}
    if not groups:
        return None
    key = max(groups, key=lambda k: (k[1] == "decode", len(groups[k])))
    timed = groups[key]
    cpu_only = all(r.steps.get("analysed_on") == "cpu-ops" for r in timed)
    if cpu_only:
        threshold = max(threshold, CPU_OPS_THRESHOLD)
    step = {id(r): r.steps["median_ms"] for r in timed}
    comp = {id(r): _compute_ms(r) for r in timed}
    by_step = max(timed, key=lambda r: step[id(r)])
    by_comp = max(timed, key=lambda r: comp[id(r)])
    # the reference is the median of the *other* ranks: with two ranks, a median that includes the
    # candidate itself would halve a straggler's lead
    ref_step = _median_of_others(timed, step, by_step)
    ref_comp = _median_of_others(timed, comp, by_comp)
    # a difference only counts when it stands above the step-to-step noise of the ranks
    step_noise = _lead_noise(timed, lambda m: m.get("gpu_ms") or m.get("cpu_ms") or 0.0, by_step)
    comp_noise = _lead_noise(timed, lambda m: m.get("kernel_ms", 0.0) - (m.get("buckets") or {}).get("communication", 0.0),
                             by_comp)
    step_ratio = step[id(by_step)] / ref_step if ref_step > 0 else 1.0
    comp_ratio = comp[id(by_comp)] / ref_comp if ref_comp > 0 else 1.0
    if step[id(by_step)] - ref_step <= NOISE_SIGMAS * step_noise:
        step_ratio = 1.0
    if comp[id(by_comp)] - ref_comp <= NOISE_SIGMAS * comp_noise or cpu_only:
        # on CPU-only traces an op's wall time includes the time its process was descheduled: a rank
        # that shares a busy core looks "late before the collective" without being the cause
        comp_ratio = 1.0
    use_comp = comp_ratio > step_ratio and comp_ratio > threshold
    slow = by_comp if use_comp else by_step
    fast = min(timed, key=lambda r: (comp if use_comp else step)[id(r)])
    mid_step = statistics.median(step.values())
    if use_comp:
        line = (f"rank {slow.rank}: {comp[id(slow)]:.3g} ms of compute per step, {comp_ratio:.2f}x the other ranks' "
                f"median {ref_comp:.3g} ms (late before its collectives; its step {slow.steps['median_ms']:.3g} ms)")
    elif step_ratio == 1.0 and step[id(slow)] > ref_step:
        # the lead is inside the step-to-step noise: say so, not "1.00x" beside two different numbers
        line = (f"rank {slow.rank} at {step[id(slow)]:.3g} ms/step against the other ranks' median {ref_step:.3g} "
                f"ms/step: within the steps' noise (±{NOISE_SIGMAS * step_noise:.3g} ms), not a straggler")
    else:
        line = (f"rank {slow.rank} at {step[id(slow)]:.3g} ms/step, {step_ratio:.2f}x the other ranks' median "
                f"{ref_step:.3g} ms/step")
    return {"rank": slow.rank, "stage": slow.stage, "phase": key[1], "median_ms": slow.steps["median_ms"],
            "line": line,
            "ranks_median_ms": round(mid_step, 4),
            "others_median_ms": round(_median_of_others(timed, step, slow), 4),
            "slower_than_others": round(max(step_ratio, comp_ratio), 4),
            "slower_than_median": round(step[id(slow)] / mid_step if mid_step else 1.0, 4),
            "signal": "compute-before-collective" if use_comp else "step-time",
            "compute_ms": round(comp[id(slow)], 4), "ranks_median_compute_ms": round(statistics.median(comp.values()), 4),
            "fastest_rank": fast.rank,
            "spread_ms": round(max(step.values()) - min(step.values()), 4),  # step time, slowest - fastest
            "compute_spread_ms": round(max(comp.values()) - min(comp.values()), 4),
            "noise_ms": round(step_noise, 4),
            "threshold": threshold, "significant": bool(max(step_ratio, comp_ratio) > threshold)}


def _median_of_others(timed: list[RankAnalysis], value: dict, rank: RankAnalysis) -> float:
    return statistics.median(value[id(r)] for r in timed if r is not rank)


def diagnose(paths: Sequence[str | Path], config: Optional[dict] = None, workers: Optional[int] = None,
             on_done: Optional[Callable[[int, int], None]] = None,
             capture: Optional[Sequence[str | Path]] = None,
             on_read: Optional[Callable[[int, int], None]] = None) -> Diagnosis:
    """Analyse every trace under ``paths``; several files are parsed in parallel processes.
    ``on_read(bytes_done, bytes_total)`` follows the reading of a file analysed in this process;
    ``on_done(files_done, files_total)`` the files."""
    from perfscope.analysis.split import prepare, reduce

    plan = prepare(paths, config, capture)
    files, cfg, capture = plan.files, plan.config, plan.capture
    results: list[Optional[RankAnalysis]] = [None] * len(files)
    if workers:
        nproc, bound = workers, "option"
    else:
        nproc, bound = plan_workers([json_bytes(tf.path) for tf in files], os.cpu_count() or 1, available_memory())
    if len(files) == 1 or nproc <= 1:
        for i, tf in enumerate(files):
            results[i] = analyze_file(tf, cfg, capture, on_read)
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
    return reduce(plan.tset, ranks, {"files": len(files), "workers": min(nproc, len(files)), "bound": bound})


def not_one_job(ranks: list[RankAnalysis]) -> list[str]:
    """Why these files are not the ranks of one job (empty: they may be). Ranks of one job run on the
    same GPU model, with the same world size, and no two of them are the same rank of the same stage."""
    if len(ranks) < 2:
        return []
    out = []
    gpus = sorted({str(r.meta.get("device_name")) for r in ranks if r.meta.get("device_name")})
    if len(gpus) > 1:
        out.append(f"these {len(ranks)} files ran on different GPUs ({', '.join(gpus)}): not the ranks of one job; "
                   "they are listed side by side, with no straggler")
    ws = sorted({r.meta.get("world_size") for r in ranks if r.meta.get("world_size")})
    if len(ws) > 1:
        out.append(f"these files report different world sizes ({', '.join(map(str, ws))}): not the ranks of one "
                   "job; no straggler")
    seen: dict = {}
    for r in ranks:
        if r.rank is None:
            continue
        key = (r.rank, r.stage, r.meta.get("host"))
        if key in seen:
            out.append(f"{seen[key]} and {r.file} both are rank {r.rank}"
                       f"{' (' + r.stage + ')' if r.stage else ''}: different runs, not ranks of one job; "
                       "no straggler")
            break
        seen[key] = r.file
    return out
