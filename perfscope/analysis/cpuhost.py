"""The decode step of a server that runs on the CPU, as it takes without the profiler.

On a CPU server every step is host work: its ops and the Python around them run on the scheduler's
thread one after another, and the torch profiler adds its own cost to each event it records (a CPU
op, and with ``with_stack`` a Python frame). The real SGLang 0.5.23 on CPU (the tests' tiny Qwen2,
``perfscope trace --bench``, a full profile with stacks and shapes) records ~3,300 events per decode
step (~660 CPU ops, ~1,500 Python frames in the forward alone) and its profiled step cycle was
1.3-10x the TPOT the bench measured before the profile on a quiet and a loaded 2-core machine.
A GPU-only host-timing profile cannot be taken there (there is no GPU), so:

* the host's own time per step is the bench's step (``hosttime.bench_step_ms``: its median
  inter-token latency where that times a step, else its TPOT), measured before any profile;
* the profiler's cost per recorded event is the profiled step cycle (the median time from one decode
  step's start to the next's) less that step, over the events recorded per cycle;
* a fix that removes ops takes their profiled self time less the profiler's cost of their events off
  the bench's TPOT (``after_fix``; the TPOT, which the fixed server's bench is held to, not the step:
  at concurrency 1 their medians differed by -17% to +33% over ten runs on a loaded machine): a few
  large ops (a cast of the whole KV pool) keep nearly all of their time, many small ones lose most of
  it. The range runs from the whole profiled saving (the removed ops cost the profiler nothing) to
  the saving scaled as the whole cycle is (they cost it as much as the average), +-BENCH_NOISE;
* a fix that removes more than half of the bench's step (``hosttime.ANCHOR_MAX_SAVED``) leaves a step
  the bench did not measure, and the bench's spread would swamp it (the demo's reproduction server on
  a loaded 2-core machine: TPOT 1,278 ms, its requests 966-1,448 ms, less a 1,104 ms cast predicted
  174 ms where the fixed server measured 50 ms): the profiled step left is taken at the bench's pace
  instead (x TPOT / profiled cycle: 49.7 ms there), its range from that ratio capped at 1 to 1.

Without a bench (a bare trace) the step stays the profiled one: nothing measured the host unprofiled.
"""

from __future__ import annotations

import bisect
import statistics
from typing import Optional

from perfscope.analysis.hosttime import ANCHOR_MAX_SAVED, BENCH_NOISE, bench_step_ms


def on_cpu(config: dict) -> bool:
    """The server runs on the CPU (its server info says ``device: cpu``): every step is host work."""
    return str((config or {}).get("device") or "").lower() == "cpu"


def _cycles(steps) -> list[tuple]:
    dec = sorted((s for s in steps if s.phase == "decode"), key=lambda s: s.cpu_start)
    return [(a, b) for a, b in zip(dec, dec[1:]) if b.index == a.index + 1]


def profiler_cost(trace, steps, bench: Optional[dict]) -> Optional[dict]:
    """What separates the profiled decode step from the bench's: {step_ms (the bench's), step_source,
    profiled_cycle_ms, events_per_cycle (CPU ops and Python frames recorded on the step's thread from
    one decode step's start to the next's, median), profiler_us_per_event}. None without a bench or
    two consecutive decode steps."""
    got = bench_step_ms(bench)
    pairs = _cycles(steps)
    if got is None or bench is None or not pairs:
        return None
    by_tid: dict = {}
    for e in list(trace.cpu_ops) + list(trace.frames):
        by_tid.setdefault(e.tid, []).append(e.ts)
    for ts in by_tid.values():
        ts.sort()
    counts, cyc = [], []
    for a, b in pairs:
        ts = by_tid.get(a.tid, [])
        counts.append(bisect.bisect_left(ts, b.cpu_start) - bisect.bisect_left(ts, a.cpu_start))
        cyc.append(b.cpu_start - a.cpu_start)
    step, src = got
    cycle_ms = statistics.median(cyc) / 1e3
    n = statistics.median(counts)
    per = max(cycle_ms - step, 0.0) * 1e3 / n if n else 0.0
    return {
        "tpot_ms": round(float(bench["tpot_ms"]), 4),
        "step_ms": round(step, 4),
        "step_source": src,
        "profiled_cycle_ms": round(cycle_ms, 4),
        "events_per_cycle": round(n, 1),
        "profiler_us_per_event": round(per, 4),
    }


def changed_ops(trace, steps, new_duration) -> float:
    """The recorded ops per step (median) whose time a fix changes: ``new_duration`` of one of their
    self-time pieces (``cpu_ops.cpu_ops_as_kernels``: an op's pieces share its ``corr``) is not None."""
    kern = trace.kernels
    n = [len({kern[i].corr for i in s.kernels if new_duration(i) is not None}) for s in steps if s.kernels]
    return statistics.median(n) if n else 0.0


def after_fix(cost: dict, saved_ms: float, removed_ops: float, profiled_after_ms: Optional[float] = None) -> dict:
    """The TPOT after a fix that removes ``removed_ops`` recorded ops per step holding ``saved_ms`` of
    profiled self time per step (``profiled_after_ms``: the profiled step left, median): point, range
    and how (see the module doc). ``cost``: ``profiler_cost``."""
    tpot, step, cycle, per = cost["tpot_ms"], cost["step_ms"], cost["profiled_cycle_ms"], cost["profiler_us_per_event"]
    saved_ms = max(saved_ms, 0.0)
    host = {
        "point": tpot,
        "lo": round(tpot * (1 - BENCH_NOISE), 4),
        "hi": round(tpot * (1 + BENCH_NOISE), 4),
        "source": "bench",
        "profiled_ms": cycle,
        "how": f"the bench's {tpot:.2f} ms TPOT without the profiler: on the CPU the step is the host's work",
    }
    out = {"bound": "host", "host": host, "removed_ops_per_step": removed_ops, "cpu_host": cost}
    # "host": a prediction of the unprofiled TPOT (compare holds it to AFTER's bench), as hosttime's are
    if profiled_after_ms is not None and cycle > 0 and saved_ms > ANCHOR_MAX_SAVED * step:
        # most of the step goes: what is left was not measured, and the bench's own spread (the demo's CPU
        # server: requests 966-1448 ms) would swamp it; the profiled step left, at the bench's pace
        r = tpot / cycle
        pt = profiled_after_ms * r
        return {
            **out,
            "predicted_step_ms": round(pt, 4),
            "unprofiled_saved_ms": round(tpot - pt, 4),
            "range_ms": [
                round(profiled_after_ms * min(r, 1.0) * (1 - BENCH_NOISE), 4),
                round(profiled_after_ms * max(r, 1.0) * (1 + BENCH_NOISE), 4),
            ],
            "how": f"the fix removes {saved_ms:.2f} ms of the bench's {step:.2f} ms step (the server runs on the "
            f"CPU: the step is host work): the profiled step left, {profiled_after_ms:.2f} ms, x {r:.2f} (the "
            f"bench's {tpot:.2f} ms TPOT over the profiled cycle of {cycle:.2f} ms)",
        }
    unprof = max(saved_ms - removed_ops * per / 1e3, 0.0)  # the removed ops' time less the profiler's
    scaled = saved_ms * min(step / cycle, 1.0) if cycle > 0 else saved_ms  # as much as the whole cycle's
    pt = max(tpot - unprof, 0.0)
    lo = max(tpot - max(saved_ms, unprof, scaled), 0.0) * (1 - BENCH_NOISE)
    hi = max(tpot - min(unprof, scaled), pt) * (1 + BENCH_NOISE)
    return {
        **out,
        "predicted_step_ms": round(pt, 4),
        "range_ms": [round(lo, 4), round(hi, 4)],
        "unprofiled_saved_ms": round(tpot - pt, 4),
        "how": f"the bench's {tpot:.2f} ms TPOT without the profiler (the server runs on the CPU: the step is "
        f"host work) less the {saved_ms:.2f} ms of profiled op time the fix removes per step, "
        f"less the profiler's {per:.2f} us per recorded event on its {removed_ops:g} ops (the profiled "
        f"cycle of {cycle:.2f} ms over {cost['events_per_cycle']:g} events)",
    }
