"""overlap-off: SGLang's overlap scheduler is off, so the GPU idles between decode forwards."""

from __future__ import annotations

import statistics
from typing import Optional

from perfscope.analysis import hosttime
from perfscope.analysis.rules.base import Finding, Rule, RuleContext
from perfscope.analysis.rules.shared import scheduler_loop, step_gaps_ms

# SGLang's overlap scheduler resolves the previous batch's "future" token ids on the GPU
_OVERLAP_MARKERS = ("resolve_future_token_ids",)
_SCHEDULER_STEPS = ("sglang-annotation",)
# ... but SGLang 0.5.23 has no such kernel: its scheduler loop in the trace's Python frames says
# (perfscope.analysis.rules.shared.scheduler_loop)


class OverlapOff(Rule):
    needs_gpu_timeline = True
    share_of = "the step cycle"
    id = "overlap-off"
    title = "Overlap scheduler off: GPU idle between decode forwards"
    fix = "overlap-off"
    what = (
        "SGLang runs its scheduler without overlap: after each decode forward the CPU processes the "
        "results and builds the next batch while the GPU waits, so every step starts with an idle gap."
    )
    why = (
        "With the overlap scheduler the next batch is scheduled and launched while the current forward "
        "runs; without it the host time (often 1-3 ms) is added to every inter-token latency."
    )
    evidence = (
        "The GPU idle per step that the host's serial work leaves: between consecutive SGLang decode "
        "steps, and inside CUDA-graph steps (input preparation before the replay, the read-back after "
        "it). Without the profiler: the bench's median inter-token latency (else TPOT) less the step's "
        "GPU work when the run has a bench (`trace --bench`, `perfscope bench`), else the profiled idle "
        "x the profiler's measured slow-down of the host (0.38, range 0.25-0.47, for a full trace: "
        "`perfscope.analysis.hosttime`). `disable_overlap_schedule` from the server config; else the "
        "scheduler loop in the trace's Python frames (`event_loop_overlap` / `event_loop_normal`, SGLang "
        "0.5.23), else whether the overlap scheduler's `resolve_future_token_ids` kernel (older SGLang) "
        "is present. Predicted step with overlap on: the larger of the GPU work and that host time (the "
        "H200 reproduction server: 7.72-7.90 ms predicted, 7.81-7.93 ms measured with the overlap "
        "scheduler on)."
    )
    remedy = (
        "Drop `--disable-overlap-schedule` (it is on by default). Some features turn it off (e.g. some "
        "speculative-decoding or pipeline-parallel modes, `--enable-mixed-chunk` in older versions): "
        "check the server log for the reason before changing them."
    )
    false_positives = (
        "Low load (no request waiting for the next step) leaves the same gap; a trace of a "
        "single decode step cannot show it. Without a bench the idle is the profiled one scaled: "
        "a host that the profiler slows more or less than SGLang's is mis-sized (bench first: "
        "`perfscope trace --bench N`). The overlap scheduler's own host cost is not modelled."
    )

    MIN_SHARE = 0.08  # of the step cycle
    MIN_MS = 0.05

    @staticmethod
    def overlap_markers(ctx: RuleContext) -> bool:
        kern = ctx.trace.kernels
        return any(any(m in kern[i].name for m in _OVERLAP_MARKERS) for s in ctx.steps for i in s.kernels)

    @classmethod
    def applies(cls, ctx: RuleContext) -> bool:
        """Scheduler steps whose overlap is off (config), or unknown with no overlap markers."""
        if ctx.phase != "decode" or ctx.stepset.method not in _SCHEDULER_STEPS:
            return False
        off = ctx.config_value("disable_overlap_schedule")
        if off is not None:
            return bool(off)
        loop = scheduler_loop(ctx.trace)
        if loop is not None:
            return loop == "normal"
        return not cls.overlap_markers(ctx)

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if len(ctx.steps) < 2 or ctx.step_ms <= 0 or not self.applies(ctx):
            return None
        gaps = step_gaps_ms(ctx)
        if not gaps:
            return None
        gap = statistics.median(gaps)
        # graph-replay steps: idle inside the step is the serial host's too (input preparation before the
        # replay, the read-back and sampling after it); eager steps idle inside on their launches
        # (eager-decode's case), which the overlap scheduler does not hide
        graphs = statistics.median(m.graph_launches for m in ctx.metrics) >= 1
        inside = statistics.median(m.idle_ms for m in ctx.metrics) if graphs else 0.0
        gpu_work = max(ctx.step_ms - inside, 0.0)
        profiled = gap + inside
        serial = _serial_host(ctx, profiled, gpu_work)
        if serial is None:
            return None
        idle = serial.point
        cycle = gpu_work + idle
        share_cycle = idle / cycle if cycle > 0 else 0.0
        if idle < self.MIN_MS or share_cycle < self.MIN_SHARE:
            return None
        off = ctx.config_value("disable_overlap_schedule")
        loop = scheduler_loop(ctx.trace)
        confidence = "high" if off else "medium" if loop == "normal" else "low"
        # with the overlap scheduler the host prepares step N+1 while the GPU runs step N: the step takes the
        # larger of the GPU work and the host's serial work, which no longer adds to it
        pt, lo, hi, bound = hosttime.cycle(gpu_work, serial)
        measured = serial.source == "bench"
        summary = (
            f"The GPU idles {'' if measured else '~'}{idle:.2f} ms per step waiting for the host "
            f"({share_cycle:.0%} of a {cycle:.2f} ms step cycle"
            + (f", {serial.how}" if measured else f" without the profiler; profiled: {profiled:.2f} ms")
            + "): "
            + (
                "`disable_overlap_schedule` is set."
                if off
                else "the scheduler runs `event_loop_normal` (no overlap)."
                if loop == "normal"
                else "no overlap-scheduler kernels were seen."
            )
            + f" With the overlap scheduler the step takes the larger of its {gpu_work:.2f} ms of GPU "
            f"work and the host's {idle:.2f} ms: ~{pt:.2f} ms (expect {lo:.2f}-{hi:.2f} ms)."
        )
        return self.finding(
            summary=summary,
            ms_per_step=round(idle, 4),
            share=round(share_cycle, 4),
            confidence=confidence,
            predicted_step_ms_after_fix=round(pt, 4),
            evidence={
                "gap_between_steps_ms": round(gap, 4),
                "idle_inside_step_ms": round(inside, 4),
                "step_gpu_ms": round(ctx.step_ms, 4),
                "gpu_work_ms": round(gpu_work, 4),
                "profiled_idle_ms": round(profiled, 4),
                "profiled_cycle_ms": round(ctx.step_ms + gap, 4),
                "step_cycle_ms": round(cycle, 4),
                "gap_share_of_cycle": round(share_cycle, 4),
                "host_serial": serial.to_dict(),
                "gaps_measured": len(gaps),
                "prediction": {
                    "predicted_step_ms": round(pt, 4),
                    "range_ms": [round(lo, 4), round(hi, 4)],
                    "bound": bound,
                    "gpu_work_ms": round(gpu_work, 4),
                    "model": "overlap on: max(GPU work, the host's serial work per step without the profiler)",
                },
                "disable_overlap_schedule": off,
                "overlap_kernels_seen": self.overlap_markers(ctx),
                "scheduler_loop": loop,
            },
        )


def _serial_host(ctx: RuleContext, profiled_ms: float, gpu_work_ms: float) -> Optional["hosttime.HostEstimate"]:
    """The host's serial work per step (the GPU idle of a loop without overlap) as unprofiled: the bench's
    step (its median inter-token latency, else TPOT) less the GPU work when the run measured one, else the
    profiled idle scaled by the profiler's measured slow-down of the host (``hosttime.SCALE``)."""
    got = hosttime.bench_step_ms(ctx.config.get("bench"))
    if got is not None:
        meas, src = got
        v = max(meas - gpu_work_ms, 0.0)
        n = hosttime.BENCH_NOISE * meas  # the bench's own noise, in ms of the step
        return hosttime.HostEstimate(
            v,
            max(v - n, 0.0),
            v + n,
            "bench",
            round(profiled_ms, 4),
            f"the bench's {'median inter-token latency' if src == 'itl' else 'TPOT'} without the profiler, "
            f"{meas:.2f} ms, less {gpu_work_ms:.2f} ms of GPU work",
        )
    return hosttime.estimate(profiled_ms, hosttime.profile_kind(ctx.trace))
