"""host-bubble: the GPU waits for the host at every graph-replay decode step."""

from __future__ import annotations

import statistics
from typing import Optional

from perfscope.analysis.rules.base import Finding, Rule, RuleContext
from perfscope.analysis.rules.shared import scheduler_loop, step_gaps_ms


def launch_to_gpu_ms(ctx: RuleContext) -> list[float]:
    """Per step: from the graph-launch call to the first kernel it ran (the launch latency)."""
    out = []
    kern = ctx.trace.kernels
    for s in ctx.steps:
        first: dict[int, float] = {}
        for i in s.kernels:
            k = kern[i]
            first[k.corr] = min(first.get(k.corr, k.ts), k.ts)
        for corr, ts in sorted(first.items(), key=lambda kv: kv[1]):
            l = ctx.attributor.by_corr.get(corr)
            if l is not None and l.name.endswith("GraphLaunch"):
                out.append(max(0.0, (ts - l.ts) / 1e3))
                break
    return out


def graph_fraction(ctx: RuleContext) -> float:
    """Share of the analysed steps' kernel time that graph launches replayed."""
    kern = ctx.trace.kernels
    graph = total = 0.0
    by_corr = ctx.attributor.by_corr
    replayed: dict = {}  # correlation id -> whether its launch is a graph launch
    for s in ctx.steps:
        for i in s.kernels:
            k = kern[i]
            total += k.dur
            g = replayed.get(k.corr)
            if g is None:
                l = by_corr.get(k.corr)
                g = replayed[k.corr] = l is not None and l.name.endswith("GraphLaunch")
            if g:
                graph += k.dur
    return graph / total if total else 0.0


class HostBubble(Rule):
    needs_gpu_timeline = True
    share_of = "the step cycle"
    id = "host-bubble"
    title = "Host bubble around CUDA-graph replay"
    fix = "overlap-off"  # the overlap scheduler prepares the next batch while the GPU runs
    what = (
        "Decode runs as CUDA-graph replays, yet the GPU sits idle between one step's last kernel and the "
        "next step's first: the host prepares the next batch (scheduling, input and metadata copies, "
        "sampling bookkeeping) while the GPU waits."
    )
    why = (
        "A graph replay is fast to launch, but nothing is queued behind it: each step's GPU work starts only "
        "when the CPU has finished the previous step's bookkeeping, so the host time adds to every token "
        "(sglang#5593, #29960)."
    )
    evidence = (
        "Median GPU idle between consecutive decode steps and inside them, the graph launch to first "
        "kernel latency, and their share of the step cycle (GPU step + bubble)."
    )
    remedy = (
        "Keep SGLang's overlap scheduler on (no `--disable-overlap-schedule`), so the next batch is "
        "prepared while the GPU runs the current one; move per-step host work (metadata building, "
        ".item()/.tolist() syncs, logging) off the critical path; check that `--cuda-graph-max-bs` covers "
        "the batch so no step falls back to eager."
    )
    false_positives = (
        "A benchmark loop that synchronises after every step (torch.profiler schedules, "
        "CUDA-event timing) shows the same gap; so does a server that simply has no next request "
        "queued (low load). The prediction assumes the bubble can be hidden entirely: the step becomes its GPU "
        "work back to back (the step minus its idle inside). With the overlap scheduler already on "
        "(server config, or SGLang's `event_loop_overlap` in the trace's Python frames) the finding "
        "names no fix command: the remedy's other steps are the user's."
    )

    MIN_SHARE = 0.10  # of the step cycle
    MIN_MS = 0.05
    MIN_GRAPH_FRACTION = 0.5  # of the step's kernel time replayed from graphs

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if ctx.phase != "decode" or len(ctx.steps) < 2 or ctx.step_ms <= 0:
            return None
        if statistics.median(m.graph_launches for m in ctx.metrics) < 1:
            return None  # eager decode: eager-decode reports launch-bound steps
        replayed = graph_fraction(ctx)
        if replayed < self.MIN_GRAPH_FRACTION:
            return None  # mostly eager work around a few graphs: not a graph-replay decode step
        # where the scheduler's overlap is off, overlap-off names the cause: the registry does not
        # check this rule there (perfscope.analysis.rules.YIELDS_TO)
        gaps = step_gaps_ms(ctx)
        gap = statistics.median(gaps) if gaps else 0.0
        inside = statistics.median(m.idle_ms for m in ctx.metrics)
        bubble = gap + inside
        cycle = ctx.step_ms + gap
        share_cycle = bubble / cycle if cycle > 0 else 0.0
        if bubble < self.MIN_MS or share_cycle < self.MIN_SHARE:
            return None
        # the profiler slows the host, and a slower host leaves the GPU idle longer: the bubble that
        # counts is the unprofiled one (the bench's step cycle, else the host's time scaled as for a
        # prediction, perfscope.analysis.hosttime) minus the GPU work; a fixed real SGLang on the H200
        # profiled 1.4-2.7 ms of bubble per step where its bench TPOT equalled its GPU work
        from perfscope.analysis import hosttime

        gpu_work = max(ctx.step_ms - inside, 0.0)
        real = hosttime.unprofiled_cycle(ctx.trace, ctx.steps, ctx.config, gpu_work)
        profiled = {"profiled_bubble_ms": round(bubble, 4), "profiled_cycle_ms": round(cycle, 4)}
        if real is not None:
            bubble, cycle = real["idle_ms"], real["cycle_ms"]
            share_cycle = bubble / cycle if cycle > 0 else 0.0
            if bubble < self.MIN_MS or share_cycle < self.MIN_SHARE:
                return None
        lat = launch_to_gpu_ms(ctx)
        # the overlap scheduler is already on (the server's config, or its loop in the trace's Python frames):
        # `perfscope fix overlap-off` has nothing to change, so no fix command, the remedy's other steps stay
        overlap_on = ctx.config_value("disable_overlap_schedule") is False or scheduler_loop(ctx.trace) == "overlap"
        if real is None:
            summary = (
                f"CUDA-graph decode, but the GPU idles {bubble:.2f} ms per step waiting for the host "
                f"({gap:.2f} ms between steps, {inside:.2f} ms inside): {share_cycle:.0%} of a {cycle:.2f} ms "
                f"step cycle."
            )
        else:
            summary = (
                f"CUDA-graph decode, but the GPU idles ~{bubble:.2f} ms per step waiting for the host without "
                f"the profiler ({real['how']}): {share_cycle:.0%} of a {cycle:.2f} ms step cycle (profiled: "
                f"{profiled['profiled_bubble_ms']:.2f} ms, {gap:.2f} ms between steps, {inside:.2f} ms inside)."
            )
        return self.finding(
            summary=summary,
            ms_per_step=bubble,
            share=share_cycle,  # idle: a share of the step cycle
            confidence="high" if share_cycle > 0.25 else "medium",
            # hidden, the bubble leaves the GPU's own work: the step without its idle inside, back to back
            predicted_step_ms_after_fix=round(gpu_work, 4),
            **({"fix": None} if overlap_on else {}),
            evidence={
                "gap_between_steps_ms": round(gap, 4),
                "idle_inside_step_ms": round(inside, 4),
                "bubble_ms_per_step": round(bubble, 4),
                "step_gpu_ms": round(ctx.step_ms, 4),
                "step_cycle_ms": round(cycle, 4),
                "bubble_share_of_cycle": round(share_cycle, 4),
                "graph_launch_to_first_kernel_ms": round(statistics.median(lat), 4) if lat else None,
                "gaps_measured": len(gaps),
                "step_method": ctx.stepset.method,
                "graph_replayed_fraction": round(replayed, 4),
                "disable_overlap_schedule": ctx.config_value("disable_overlap_schedule"),
                **profiled,
                "unprofiled": real,
                "overlap_scheduler_on": overlap_on,
            },
        )
