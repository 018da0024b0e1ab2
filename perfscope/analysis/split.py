"""Diagnose as a map and a reduce: one pure task per rank file, then a reduce over their results.

- :func:`prepare`: the run's files and the configuration every rank is analysed with (the run
  folder's server config, workload, bench and host timing), read where the run folder is.
- :func:`rank_task`: one trace file -> that rank's :class:`RankAnalysis` as a plain dict (steps,
  buckets, ops, idle, communication and its exposed part, per-step metrics, findings: the ~100 KB a
  reduce needs), or the one-line error that stopped it. It reads only its own file, so it runs
  wherever the file is: a worker process here (``diagnose``), or a Ray task pinned to the node that
  wrote the file (``diagnose --ray``, :mod:`perfscope.cluster.ray_diagnose`).
- :func:`reduce`: the ranks' results only -> the :class:`Diagnosis` (ranks of one job or not, the
  straggler, the primary rank whose findings lead, the run folder's warnings).

:mod:`perfscope.analysis.diagnose` runs the tasks in worker processes here and reduces."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.errors import InputError, PerfscopeError
from perfscope.load.discover import TraceFile, TraceSet, discover
from perfscope.load.reader import load_trace
from perfscope.util.gcpause import collector_paused


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


def prepare(
    paths: Sequence[str | Path], config: Optional[dict] = None, capture: Optional[Sequence[str | Path]] = None
) -> Plan:
    """The files under ``paths`` and what each rank task needs beside its file."""
    tset = discover(paths)
    cfg = run_config(tset, config)
    if tset.capture:
        capture = list(capture or []) + list(tset.capture)  # a capture_traces/ subfolder: the capture map
    return Plan(tset=tset, config=cfg, capture=capture)


def rank_task(tf: TraceFile, config: dict, capture: Optional[Sequence[str | Path]] = None) -> dict:
    """One rank: ``{"ok": RankAnalysis.to_dict()}`` or ``{"error": one line, "exit_code": n}``.
    Pure: reads only ``tf``'s file (and the capture map), returns plain data."""
    try:
        return {"ok": analyze_file(tf, config, capture).to_dict()}
    except PerfscopeError as e:
        return {"error": str(e), "exit_code": e.exit_code}


def reduce(tset: TraceSet, ranks: list[RankAnalysis], parallel: dict, warnings: Iterable[str] = ()) -> Diagnosis:
    """The diagnosis of these ranks' results (in ``tset``'s file order): the run folder's notes and
    warnings, whether they are ranks of one job, the straggler. ``warnings``: more lines to report
    (ranks that could not be analysed where they are)."""
    from perfscope.rundir import FRONTEND_NOTE

    for path in tset.frontend:
        for r in ranks:
            r.notes.append(f"{path.name} not analysed: {FRONTEND_NOTE}")
    for note in profiled_without(tset.run_info):
        for r in ranks:
            r.notes.append(note)
    out = []
    for dup in tset.duplicates:
        out.append(f"{dup['path']} is {dup['same_as']} again ({dup['how']}): analysed once, not as another rank")
    if tset.capture:
        out.append(
            f"{len(tset.capture)} graph-capture trace(s) in capture_traces/ used as the capture map "
            "(they attribute graph-replayed kernels), not as ranks"
        )
    out.extend(warnings)
    mixed = not_one_job(ranks)
    out.extend(mixed)
    strag = None if mixed else straggler(ranks)
    return Diagnosis(
        ranks=ranks, run=tset.run_info, straggler=strag, warnings=out, parallel=parallel, skipped=tset.skipped
    )


def profiled_without(run_info: dict) -> list[str]:
    """What the run's CPU-op profile left out (``trace --no-stack`` / ``--no-shapes``) and what the
    diagnosis lacks for it; nothing for a GPU-only profile (no CPU ops to attribute)."""
    prof = (run_info or {}).get("profile") or {}
    if "CPU" not in (prof.get("activities") or ["CPU"]):
        return []
    out = []
    if prof.get("with_stack") is False:
        out.append(
            "traced without Python stacks (--no-stack): ops are not attributed to the source line that "
            "launched them (no '@ file.py(line): fn' beside an op), and eager-decode's predicted step is "
            "the kernel time alone (the host's share is read from the model's forward frame); the rest "
            "is diagnosed as usual"
        )
    if prof.get("record_shapes") is False:
        out.append(
            "traced without shapes (--no-shapes): no input dtypes or shapes per op, so no roofline or "
            "FLOP figures, and the rules that read shapes (fp8-kv-cast on a trace without GPU kernels) "
            "cannot match"
        )
    return out


def analyze_file(
    tf: TraceFile,
    config: dict,
    capture: Optional[Sequence[str | Path]] = None,
    on_read: Optional[Callable[[int, int], None]] = None,
) -> RankAnalysis:
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
        if (r.steps.count or 0) >= 2 and r.steps.median_ms:
            groups.setdefault((r.stage, r.steps.phase), []).append(r)
    groups = {k: v for k, v in groups.items() if len(v) >= 2}
    if not groups:
        return None
    key = max(groups, key=lambda k: (k[1] == "decode", len(groups[k])))
    timed = groups[key]
    cpu_only = all(r.steps.cpu_only for r in timed)
    if cpu_only:
        threshold = max(threshold, CPU_OPS_THRESHOLD)
    step = {id(r): r.steps.median_ms for r in timed}
    comp = {id(r): _compute_ms(r) for r in timed}
    by_step = max(timed, key=lambda r: step[id(r)])
    by_comp = max(timed, key=lambda r: comp[id(r)])
    # the reference is the median of the *other* ranks: with two ranks, a median that includes the
    # candidate itself would halve a straggler's lead
    ref_step = _median_of_others(timed, step, by_step)
    ref_comp = _median_of_others(timed, comp, by_comp)
    # a difference only counts when it stands above the step-to-step noise of the ranks
    step_noise = _lead_noise(timed, lambda m: m.get("gpu_ms") or m.get("cpu_ms") or 0.0, by_step)
    comp_noise = _lead_noise(
        timed, lambda m: m.get("kernel_ms", 0.0) - (m.get("buckets") or {}).get("communication", 0.0), by_comp
    )
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
        line = (
            f"rank {slow.rank}: {comp[id(slow)]:.3g} ms of compute per step, {comp_ratio:.2f}x the other ranks' "
            f"median {ref_comp:.3g} ms (late before its collectives; its step {slow.steps.median_ms:.3g} ms)"
        )
    elif step_ratio == 1.0 and step[id(slow)] > ref_step:
        # the lead is inside the step-to-step noise: say so, not "1.00x" beside two different numbers
        line = (
            f"rank {slow.rank} at {step[id(slow)]:.3g} ms/step against the other ranks' median {ref_step:.3g} "
            f"ms/step: within the steps' noise (±{NOISE_SIGMAS * step_noise:.3g} ms), not a straggler"
        )
    else:
        line = (
            f"rank {slow.rank} at {step[id(slow)]:.3g} ms/step, {step_ratio:.2f}x the other ranks' median "
            f"{ref_step:.3g} ms/step"
        )
    return {
        "rank": slow.rank,
        "stage": slow.stage,
        "phase": key[1],
        "median_ms": slow.steps.median_ms,
        "line": line,
        "ranks_median_ms": round(mid_step, 4),
        "others_median_ms": round(_median_of_others(timed, step, slow), 4),
        "slower_than_others": round(max(step_ratio, comp_ratio), 4),
        "slower_than_median": round(step[id(slow)] / mid_step if mid_step else 1.0, 4),
        "signal": "compute-before-collective" if use_comp else "step-time",
        "compute_ms": round(comp[id(slow)], 4),
        "ranks_median_compute_ms": round(statistics.median(comp.values()), 4),
        "fastest_rank": fast.rank,
        "spread_ms": round(max(step.values()) - min(step.values()), 4),  # step time, slowest - fastest
        "compute_spread_ms": round(max(comp.values()) - min(comp.values()), 4),
        "noise_ms": round(step_noise, 4),
        "threshold": threshold,
        "significant": bool(max(step_ratio, comp_ratio) > threshold),
    }


def _median_of_others(timed: list[RankAnalysis], value: dict, rank: RankAnalysis) -> float:
    return statistics.median(value[id(r)] for r in timed if r is not rank)


def not_one_job(ranks: list[RankAnalysis]) -> list[str]:
    """Why these files are not the ranks of one job (empty: they may be). Ranks of one job run on the
    same GPU model, with the same world size, and no two of them are the same rank of the same stage."""
    if len(ranks) < 2:
        return []
    out = []
    gpus = sorted({str(r.meta.get("device_name")) for r in ranks if r.meta.get("device_name")})
    if len(gpus) > 1:
        out.append(
            f"these {len(ranks)} files ran on different GPUs ({', '.join(gpus)}): not the ranks of one job; "
            "they are listed side by side, with no straggler"
        )
    ws = sorted({r.meta["world_size"] for r in ranks if r.meta.get("world_size")})
    if len(ws) > 1:
        out.append(
            f"these files report different world sizes ({', '.join(map(str, ws))}): not the ranks of one "
            "job; no straggler"
        )
    seen: dict = {}
    for r in ranks:
        if r.rank is None:
            continue
        key = (r.rank, r.stage, r.meta.get("host"))
        if key in seen:
            out.append(
                f"{seen[key]} and {r.file} both are rank {r.rank}"
                f"{' (' + r.stage + ')' if r.stage else ''}: different runs, not ranks of one job; "
                "no straggler"
            )
            break
        seen[key] = r.file
    return out
