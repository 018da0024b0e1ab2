"""overlap-off: SGLang's overlap scheduler is off, so the GPU idles between decode forwards."""

from __future__ import annotations

import re
import statistics
from typing import Optional

from perfscope.analysis.rules.base import Finding, Rule, RuleContext

# SGLang's overlap scheduler resolves the previous batch's "future" token ids on the GPU
_OVERLAP_MARKERS = ("resolve_future_token_ids",)
_SCHEDULER_STEPS = ("sglang-annotation",)
# ... but SGLang 0.5.23 has no such kernel (the next input ids are a gather from its FutureMap);
# a trace recorded with Python stacks names the scheduler's loop: `scheduler.py(1482): event_loop_overlap`
# (overlap on) or `event_loop_normal` (off)
_LOOP_FRAME = re.compile(r"managers/scheduler\.py\(\d+\): event_loop_(overlap|normal)\w*$")


def scheduler_loop(trace) -> Optional[str]:
    """"overlap" / "normal": the SGLang scheduler loop the trace's Python frames show; None if none does."""
    seen = {m.group(1) for f in trace.frames for m in [_LOOP_FRAME.search(f.name)] if m}
    if len(seen) == 1:
        return seen.pop()
    return None


def _gaps(ctx: RuleContext) -> list[float]:
    from perfscope.analysis.rules.host_bubble import step_gaps_ms
    return step_gaps_ms(ctx)


class OverlapOff(Rule):
    needs_gpu_timeline = True
    share_of = "the step cycle"
    id = "overlap-off"
    title = "Overlap scheduler off: GPU idle between decode forwards"
    fix = "overlap-off"
    what = ("SGLang runs its scheduler without overlap: after each decode forward the CPU processes the "
            "results and builds the next batch while the GPU waits, so every step starts with an idle gap.")
    why = ("With the overlap scheduler the next batch is scheduled and launched while the current forward "
           "runs; without it the host time (often 1-3 ms) is added to every inter-token latency.")
    evidence = ("Median GPU idle between consecutive SGLang decode steps and its share of the step cycle; "
                "`disable_overlap_schedule` from the server config; else the scheduler loop in the trace's Python "
                "frames (`event_loop_overlap` / `event_loop_normal`, SGLang 0.5.23), else whether the overlap "
                "scheduler's `resolve_future_token_ids` kernel (older SGLang) is present.")
    remedy = ("Drop `--disable-overlap-schedule` (it is on by default). Some features turn it off (e.g. some "
              "speculative-decoding or pipeline-parallel modes, `--enable-mixed-chunk` in older versions): "
              "check the server log for the reason before changing them.")
    false_positives = ("Low load (no request waiting for the next step) leaves the same gap; a trace of a "
                       "single decode step cannot show it.")

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
        gaps = _gaps(ctx)
        if not gaps:
            return None
        gap = statistics.median(gaps)
        cycle = ctx.step_ms + gap
        share_cycle = gap / cycle
        if gap < self.MIN_MS or share_cycle < self.MIN_SHARE:
            return None
        off = ctx.config_value("disable_overlap_schedule")
        loop = scheduler_loop(ctx.trace)
        confidence = "high" if off else "medium" if loop == "normal" else "low"
        summary = (f"The GPU idles {gap:.2f} ms between decode forwards ({share_cycle:.0%} of a {cycle:.2f} ms "
                   f"step cycle): " + ("`disable_overlap_schedule` is set." if off else
                                       "the scheduler runs `event_loop_normal` (no overlap)." if loop == "normal"
                                       else "no overlap-scheduler kernels were seen."))
        return self.finding(
            summary=summary, ms_per_step=gap, share=share_cycle, confidence=confidence,  # idle: of the step cycle
            predicted_step_ms_after_fix=round(ctx.step_ms, 4),
            evidence={"gap_between_steps_ms": round(gap, 4), "step_gpu_ms": round(ctx.step_ms, 4),
                      "step_cycle_ms": round(cycle, 4), "gap_share_of_cycle": round(share_cycle, 4),
                      "gaps_measured": len(gaps), "disable_overlap_schedule": off,
                      "overlap_kernels_seen": self.overlap_markers(ctx), "scheduler_loop": loop})
