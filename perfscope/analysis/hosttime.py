"""The host's own time per decode step as the server spends it without the profiler.

A fix that removes GPU work leaves the host's work (scheduling, input preparation, launches, result
processing): the fixed step takes the larger of the GPU work left and that host time (SGLang's
overlap scheduler runs the two side by side; without it the replayed step holds the host's work). The host time read off a
profiled trace is the profiled host's: the torch profiler records every op and Python call, and CUPTI
intercepts every CUDA runtime call, so the same loop runs slower while traced. Measured on the H200
(real SGLang 0.5.13.post1, DeepSeek-V2-shaped MLA models, FP8 KV pool, CUDA graphs, overlap
scheduler; ``examples/gpu_loop/results/h200-2026-12-0{1,2}-predict``), the launching thread's busy
time per decode step (step start to the next step's start, less its waits on the GPU) against the
TPOT the same server measured without the profiler once its GPU work was fixed (host-bound; the
median over every bench of the fixed process taken before it was traced):

=================================  =========================  ===============================
the trace                          busy per step (quickest    unprofiled / profiled
                                   tenth of the steps)
=================================  =========================  ===============================
full (CPU ops, stacks, shapes)     2.9-6.7 ms                 0.27-0.47 (median 0.41)
GPU only (``trace --gpu-only``)    1.8-4.0 ms                 0.43-1.11 (median 0.60)
=================================  =========================  ===============================

(the dense model's host-bound pairs: eight over two days, two pools x concurrency 1 and 16, and three of a
third day on another machine, ``h200-2026-12-05-predict{,-nostack}``, 0.43-0.60, measured after the
constants were first set: they lowered the range's end from 0.45 to 0.42 and left the point; for the full
trace also the two fix loops of ``results/h200-2026-12-01-sglang``, 0.26 and 0.30, and the eager
stepbench pair of ``tests/traces/corpus/h200-mla-fp8-kv``, 0.40). The ratio is not one number
because the host is not: a host-bound fixed server's own benches differ by up to 1.7x within one
process with nothing else sent (bench medians 1.16-1.97 ms), pinned to a block of CPUs or not
(``examples/gpu_loop/sglang/starts_run.py``), and the second day's fixed servers ran their host as
slowly unprofiled as the bug's did profiled (0.93, 1.11). The GPU-only profile is preferred: over
the twelve runs of ``examples/gpu_loop/sglang/predict_table.py`` (with the MoE model's four) its
point, 0.60 (the median error's minimum over them: in-sample), and range put every measurement inside the range, where the full trace's overshoots the MoE host
(+13-41%: its many small ops cost the profiler most). The quickest steps are used because a host
that waited milliseconds on a slow GPU runs slower after each wait (the same Python took 2x longer
per step in the 3M-token pool's bug trace than in the 495k one's). So the host time after a fix is
estimated from the least-profiled trace the run has, scaled by that ratio, with the ratio's measured
range as the estimate's range; and it is reconciled with what was measured without the profiler: a
bench TPOT above the trace's GPU work is the host's own time (measured, it replaces the estimate), a
bench TPOT at the GPU work bounds the host time from above.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Optional

from perfscope.load.model import Trace


@dataclass(frozen=True)
class HostScale:
    """Unprofiled host time / profiled host time for one kind of trace: point estimate and range."""

    point: float
    lo: float
    hi: float


SCALE = {"gpu-only": HostScale(0.60, 0.42, 1.11), "full": HostScale(0.38, 0.25, 0.47)}  # see the module doc
GPU_WORK_ERROR = 0.08  # the replay's GPU work after a fix against the fixed trace's, measured: +8-9%
BENCH_NOISE = 0.05  # a bench TPOT within 5% of the GPU work is GPU-bound: it says nothing of the host
ANCHOR_MAX_SAVED = 0.5  # anchor_to_bench: only for fixes that leave most of the measured step


def profile_kind(trace: Trace) -> str:
    """ "gpu-only" when the trace recorded CUDA runtime calls and nothing of the CPU side (no CPU ops,
    Python frames or CPU annotations: ``trace --gpu-only``), else "full"."""
    cpu = trace.cpu_ops or trace.frames or any(not a.gpu for a in trace.annotations)
    return "gpu-only" if trace.launches and not cpu else "full"


@dataclass
class HostEstimate:
    """The host's own time per step without the profiler, in ms: ``point`` and its range."""

    point: float
    lo: float
    hi: float
    source: str  # "bench" (measured), "gpu-only" / "full" (a trace, scaled)
    profiled_ms: Optional[float]  # what the trace said before scaling
    how: str

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def host_timing(trace: Trace, steps) -> Optional[dict]:
    """The launching thread's busy time per step of a trace (``stepmodel.host_busy``), as a run
    folder's host-timing profile gives it to every rank's analysis."""
    from perfscope.analysis.stepmodel import host_busy

    busy = sorted(host_busy(trace, [s for s in steps if s.kernels]).values())
    if not busy:
        return None
    g = [s.gpu_us for s in steps if s.kernels]
    return {
        "kind": profile_kind(trace),
        "host_ms": round(busy[len(busy) // 10] / 1e3, 4),
        "host_median_ms": round(statistics.median(busy) / 1e3, 4),
        "steps": len(busy),
        "gpu_ms": round(statistics.median(g) / 1e3, 4) if g else None,
    }


def estimate(
    full_ms: Optional[float],
    trace_kind: str = "full",
    removed_ms: float = 0.0,
    host_timing_run: Optional[dict] = None,
    bench_tpot_ms: Optional[float] = None,
    gpu_ms: Optional[float] = None,
) -> Optional[HostEstimate]:
    """The unprofiled host time per step after a fix.

    ``full_ms``: the analysed trace's host busy time per step before the fix (``trace_kind``: its
    ``profile_kind``); ``removed_ms``: the
    profiled CPU time per step of the torch ops whose kernels the fix removes (their host time goes
    too); ``host_timing_run``: the run's GPU-only profile (``host_timing``), preferred over the full
    trace; ``bench_tpot_ms``: the TPOT the run measured without the profiler, before it was traced;
    ``gpu_ms``: the trace's GPU work per step before the fix."""
    cut = removed_ms * SCALE["full"].point  # the removed ops' time, as profiled in the full trace
    est = None
    if host_timing_run and host_timing_run.get("host_ms"):
        kind, base = "gpu-only", float(host_timing_run["host_ms"])
    elif full_ms is not None:
        kind, base = trace_kind, full_ms
    else:
        kind, base = "", None
    if base is not None:
        sc = SCALE[kind]
        est = HostEstimate(
            max(base * sc.point - cut, 0.0),
            max(base * sc.lo - cut, 0.0),
            max(base * sc.hi - cut, 0.0),
            kind,
            round(base, 4),
            f"the {'GPU-only profile' if kind == 'gpu-only' else 'trace'}'s {base:.2f} ms of host work "
            f"per step x {sc.point:.2f} (the profiler's measured slow-down of the host, range "
            f"{sc.lo:.2f}-{sc.hi:.2f})" + (f", less {cut:.2f} ms of removed ops" if cut > 0.005 else ""),
        )
    if (
        est is not None
        and gpu_ms
        and est.profiled_ms is not None
        and est.profiled_ms >= 0.98 * gpu_ms
        and not bench_tpot_ms
        and kind == "full"
    ):
        # the profiled host already took the whole step or more: its time per step holds host-only work
        # between steps (input pipeline, other ranks) that the trace's GPU-timed step leaves out, not
        # the time a GPU-side fix hands back to the host
        return None
    if bench_tpot_ms and gpu_ms:
        if bench_tpot_ms > gpu_ms * (1 + BENCH_NOISE):
            # the host held the step back before the fix: the bench measured its time, unprofiled
            pt = max(bench_tpot_ms - cut, 0.0)
            return HostEstimate(
                pt,
                pt * (1 - BENCH_NOISE),
                pt * (1 + BENCH_NOISE),
                "bench",
                est.profiled_ms if est else None,
                f"the bench's {bench_tpot_ms:.2f} ms TPOT without the profiler, above the "
                f"{gpu_ms:.2f} ms of GPU work per step: the host's own time"
                + (f", less {cut:.2f} ms of removed ops" if cut > 0.005 else ""),
            )
        cap = bench_tpot_ms * (1 + BENCH_NOISE)
        if est is not None and est.hi > cap:
            # GPU-bound without the profiler: the host took no longer than the measured step
            est = HostEstimate(
                min(est.point, cap),
                min(est.lo, cap),
                cap,
                est.source,
                est.profiled_ms,
                est.how + f"; at most the bench's {bench_tpot_ms:.2f} ms TPOT (GPU-bound)",
            )
    return est


def gpu_work_ms(replay: dict) -> float:
    """The GPU side of a fixed step from ``stepmodel.predict_after``: the replay's span (CUDA-graph
    steps keep the graph's own spacing; GPU-bound eager steps their waits), except for eager steps the
    replay finds launch-bound: those wait on the profiled host's launches, so their GPU side is the
    kernels back to back and the host's unprofiled time bounds the rest."""
    lb = str(replay.get("launch_bound_steps") or "0/1").split("/")
    launch_bound = len(lb) == 2 and lb[1] != "0" and int(lb[0]) * 2 > int(lb[1])
    if replay.get("graph_steps") or not launch_bound:
        return replay["gpu_prediction_ms"]
    return replay.get("gpu_busy_after_ms") or replay["gpu_prediction_ms"]


ITL_COALESCED = 0.5  # a median inter-token latency under half the TPOT: the stream delivers tokens in bursts


def step_itl_ms(bench: Optional[dict]) -> Optional[float]:
    """The bench's median inter-token latency as a measure of the decode step, or None when it is not
    one: a stream that delivers several tokens at once (the real SGLang on the H200 at 16 requests,
    host-bound: ITL p50 0.08-0.12 ms against a 1.7-2.1 ms TPOT) has a median gap far below its step."""
    if not bench:
        return None
    itl, tpot = bench.get("itl_p50_ms"), bench.get("tpot_ms")
    if not isinstance(itl, (int, float)) or itl <= 0:
        return None
    if isinstance(tpot, (int, float)) and itl < ITL_COALESCED * tpot:
        return None
    return float(itl)


def bench_step_ms(bench: Optional[dict]) -> Optional[tuple[float, str]]:
    """The decode step the bench measured without the profiler and what timed it: its median
    inter-token latency where that times a step (``step_itl_ms``), else its TPOT; None without one."""
    itl = step_itl_ms(bench)
    if itl:
        return itl, "itl"
    tpot = (bench or {}).get("tpot_ms")
    return (float(tpot), "tpot") if isinstance(tpot, (int, float)) and tpot > 0 else None


def decode_tail_ms(bench: Optional[dict]) -> float:
    """What a request's TPOT holds beyond its decode steps, as the bench measured it: its median TPOT
    minus its median inter-token latency (prefill chunks of other requests interrupting decode, at
    concurrency > 1). A GPU-side fix leaves it; 0 without a bench, or when its ITL is not a step
    (``step_itl_ms``)."""
    itl = step_itl_ms(bench)
    if itl is None or not bench or not bench.get("tpot_ms"):
        return 0.0
    return max(0.0, float(bench["tpot_ms"]) - itl)


def cycle(gpu_ms: float, host: Optional[HostEstimate], tail_ms: float = 0.0) -> tuple[float, float, float, str]:
    """(point, lo, hi, bound) of the TPOT from the GPU work and the host time per step: the larger of
    the two, plus ``tail_ms`` (``decode_tail_ms``; not in the low end: the fix may shorten the prefill
    chunks too)."""
    g_lo, g_hi = gpu_ms * (1 - GPU_WORK_ERROR), gpu_ms * (1 + GPU_WORK_ERROR)
    if host is None:
        return gpu_ms + tail_ms, g_lo, g_hi + tail_ms, "gpu"
    # with the overlap scheduler the host prepares a step while the GPU runs the previous one; without
    # it the replayed step already holds the host's launches and waits inside it (the repro server's
    # serial loop on the H200: replay 10.50 ms, measured 9.53-10.15 ms): the larger of the two either way
    pt = max(gpu_ms, host.point)
    lo, hi = max(g_lo, host.lo), max(g_hi, host.hi)
    return pt + tail_ms, lo, hi + tail_ms, "host" if host.point > gpu_ms else "gpu"


def of_run(paths: list, workload: Optional[dict] = None) -> Optional[dict]:
    """The host timing of a run folder's GPU-only profile (``host-timing/``): each decode file's
    ``host_timing``, the median over its ranks. A file that does not parse is left out (the profile
    is an extra: the diagnosis stands without it)."""
    from perfscope.analysis.steps import find_steps
    from perfscope.errors import PerfscopeError
    from perfscope.load.reader import load_trace

    got = []
    for p in paths:
        if getattr(p, "stage", None) not in (None, "DECODE"):
            continue
        try:
            t = load_trace(p.path if hasattr(p, "path") else p)
        except PerfscopeError:
            continue
        ss = find_steps(t)
        h = host_timing(t, [s for s in ss.steps if s.phase == "decode"])
        if h:
            got.append(h)
    if not got:
        return None
    out = dict(got[len(got) // 2] if len(got) % 2 else got[0])
    out["host_ms"] = round(statistics.median(g["host_ms"] for g in got), 4)
    out["files"] = len(got)
    if workload:
        out["concurrency"] = workload.get("concurrency")
    return out


def bench_of_run(run_info: dict) -> Optional[dict]:
    """The run's unprofiled TPOT (``timings.bench``) when it was measured at the traced concurrency."""
    t = (run_info or {}).get("timings") or {}
    b = t.get("bench")
    if not isinstance(b, dict) or not isinstance(b.get("tpot_ms"), (int, float)):
        return None
    traced = (run_info.get("workload") or {}).get("concurrency")
    benched = (
        ((b.get("workload") or {}).get("concurrency")) if isinstance(b.get("workload"), dict) else b.get("concurrency")
    )
    if traced and benched and int(traced) != int(benched):
        return None
    itl = b.get("itl_p50_ms")
    return {
        "tpot_ms": float(b["tpot_ms"]),
        "concurrency": benched or traced,
        "itl_p50_ms": float(itl) if isinstance(itl, (int, float)) else None,
        "taken": b.get("taken") or ("after the trace" if t.get("bench_after_trace") else None),
    }


def anchor_to_bench(
    bench: Optional[dict], step_ms: float, replay: dict, host: Optional[HostEstimate], tail_ms: float = 0.0
) -> Optional[dict]:
    """The prediction read off the measured step when the profiled one is longer than the server
    measured without the profiler: the trace's step (``step_ms``) more than BENCH_NOISE above the
    bench's median inter-token latency means the profiler stretched the GPU timeline itself (the
    kernels between CUDA-graph replays wait on the profiled host's launches), so a replay of it
    predicts a step the server never takes (the H200 MoE server at 16 requests: a 2.8 ms profiled step,
    1.66 ms measured, and a replayed "after" of 2.78 ms, slower than before). The fixed step is then
    the measured one less the GPU kernel time the fix removes per step (those kernels run back to
    back inside the graph), no shorter than the kernels left or the host's own time, with the range
    from all of that time saved (plus the replay's GPU-work error) to none of it (the host holding
    the step). None when the trace's step agrees with the bench, there is no bench, or the fix removes
    more than half of the measured step (ANCHOR_MAX_SAVED)."""
    if not bench or not step_ms:
        return None
    got = bench_step_ms(bench)
    if got is None or step_ms <= got[0] * (1 + BENCH_NOISE):
        return None
    meas = got[0]
    saved = max(float(replay.get("kernel_time_saved_ms") or 0.0), 0.0)
    if saved > ANCHOR_MAX_SAVED * meas:
        # the fix removes most of the measured step: what is left is not measured, and the profiled
        # kernel time saved is itself the profiler's (a 16.5 ms profiled step of 7.7 ms measured);
        # the replay with the host's unprofiled time predicts it (examples/gpu_loop/sglang/predict_table.py)
        return None
    left = float(replay.get("gpu_busy_after_ms") or 0.0)
    floor = min(max(left, host.point if host else 0.0), meas)  # neither takes longer than the measured step
    pt = max(meas - saved, floor)
    lo = max(meas - saved * (1 + GPU_WORK_ERROR), min(left, meas), min(host.lo, meas) if host else 0.0)
    return {
        "point_ms": round(pt + tail_ms, 4),
        "range_ms": [round(min(lo, pt) + tail_ms, 4), round(meas + tail_ms, 4)],
        "bound": "host" if host is not None and host.point >= meas - saved else "gpu",
        "measured_step_ms": round(float(meas), 4),
        "profiled_step_ms": round(step_ms, 4),
        "kernel_time_saved_ms": round(saved, 4),
        "how": f"the trace's {step_ms:.2f} ms step is longer than the {meas:.2f} ms the server measured without "
        f"the profiler (its median inter-token latency): the step measured less the fix's "
        f"{saved:.2f} ms of GPU kernel time per step",
    }


def unprofiled_cycle(trace: Trace, steps, config: dict, gpu_ms: float) -> Optional[dict]:
    """The step cycle without the profiler, for the idle findings: the bench's median inter-token
    latency (TPOT when it has none) when the run has a bench at the traced concurrency, else the
    larger of the GPU work and the host's time estimated as for a prediction (``estimate``). Returns
    {cycle_ms, idle_ms (cycle - GPU work), source, how} or None when nothing tells."""
    b = config.get("bench") or {}
    if b.get("tpot_ms"):
        c, src = bench_step_ms(b) or (float(b["tpot_ms"]), "tpot")
        return {
            "cycle_ms": round(c, 4),
            "idle_ms": round(max(0.0, c - gpu_ms), 4),
            "source": "bench",
            "how": f"the bench's {'median inter-token latency' if src == 'itl' else 'TPOT'} without the "
            f"profiler, {c:.2f} ms, against {gpu_ms:.2f} ms of GPU work per step",
        }
    from perfscope.analysis.stepmodel import host_busy_of

    busy = sorted(host_busy_of(trace, steps).values())
    h = estimate(busy[len(busy) // 10] / 1e3 if busy else None, profile_kind(trace), 0.0, config.get("host_timing"))
    if h is None:
        return None
    c = max(gpu_ms, h.point)
    return {
        "cycle_ms": round(c, 4),
        "idle_ms": round(max(0.0, c - gpu_ms), 4),
        "source": h.source,
        "how": f"{h.how}, against {gpu_ms:.2f} ms of GPU work per step",
    }


def unprofiled_step(steps, bench: Optional[dict]) -> Optional[dict]:
    """The decode step as the bench measured it without the profiler (its median inter-token latency
    where that times a step, else its TPOT: ``bench_step_ms``) against the profiled one: the
    median time from one decode step's start to the next's in the trace. None without a bench or two
    consecutive decode steps."""
    if not bench or not isinstance(bench.get("tpot_ms"), (int, float)) or bench["tpot_ms"] <= 0:
        return None
    got = bench_step_ms(bench)
    dec = sorted((s for s in steps if s.phase == "decode"), key=lambda s: s.cpu_start)
    gaps = [b.cpu_start - a.cpu_start for a, b in zip(dec, dec[1:]) if b.index == a.index + 1]
    if not gaps or got is None:
        return None
    meas, src = got
    cyc = statistics.median(gaps) / 1e3
    return {
        "tpot_ms": round(float(bench["tpot_ms"]), 4),
        "step_ms": round(meas, 4),
        "step_source": src,
        "profiled_cycle_ms": round(cyc, 4),
        "profiler_slowdown": round(cyc / meas, 3),
    }
