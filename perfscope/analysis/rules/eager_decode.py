"""eager-decode: decode runs eagerly, one launch per kernel, and the GPU waits on the CPU."""

from __future__ import annotations

import re
import statistics
from typing import Optional

from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_BS = re.compile(r"\bbs=(\d+)")


class EagerDecode(Rule):
    needs_gpu_timeline = True
    share_of = "the step"
    id = "eager-decode"
    title = "Eager (launch-bound) decode: no CUDA graph"
    fix = "eager-decode"
    what = ("Decode steps launch hundreds of kernels one by one (no `cudaGraphLaunch`) and the GPU sits "
            "idle between them while the CPU issues the next launch.")
    why = ("At decode batch sizes most kernels run for a few microseconds, less than the CPU needs to "
           "launch one; the step is bound by Python and launch overhead, not by the GPU.")
    evidence = ("Kernel launches per step, graph launches per step, GPU idle time inside the step (fires at 20% of "
                "the step) and per launch, median kernel time.")
    remedy = ("Run decode under CUDA graphs: drop `--disable-cuda-graph`, raise `--cuda-graph-max-bs` above "
              "the running batch size (SGLang falls back to eager above it).")
    false_positives = ("Profiling inflates eager steps (the profiler's own per-launch overhead); the "
                       "predicted time assumes the idle time goes away, which graphs deliver only if the "
                       "batch fits the captured sizes. Idle of more than 100 us per kernel launch is host "
                       "work between the launches (Python, pre/post-processing, a profiler recording stacks, "
                       "shapes and memory), not launch cost: no finding. On model forwards outside a serving "
                       "engine (Hugging Face transformers) the finding names no fix command: the launch flags "
                       "are a server's.")
    forwards = True  # a launch-bound forward pass is the same case as a launch-bound decode step

    # the one threshold: the GPU idles this share of the step while the launches trickle in
    MIN_IDLE_SHARE = 0.20
    # what launch cost is: idle per kernel launch up to this (launch-bound eager steps under torch.profiler
    # with stacks and shapes idle 19-62 us per launch; more is host work between the launches)
    LAUNCH_IDLE_MAX_US = 100.0

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        forward = not ctx.server and ctx.phase == "inference"
        if not ctx.metrics or (ctx.phase != "decode" and not forward):
            return None
        m = _launch_idle(ctx)
        if m is None:
            return None
        launches, graphs, idle, idle_share, idle_per_launch_us = m
        if idle_share < self.MIN_IDLE_SHARE or idle_per_launch_us > self.LAUNCH_IDLE_MAX_US:
            return None
        kern = ctx.trace.kernels
        durs = sorted(kern[i].dur for s in ctx.steps for i in s.kernels)
        med_us = durs[len(durs) // 2] if durs else 0.0
        predicted = max(ctx.step_ms - idle, 0.0)
        # SGLang's step[DECODE bs=N] labels: the batch sizes the graphs must cover (--cuda-graph-max-bs)
        sizes = sorted({int(m.group(1)) for s in ctx.steps for m in [_BS.search(s.label or "")] if m})
        what = "The forward pass runs eagerly" if forward else "Decode runs eagerly"
        summary = (f"{what}: {launches:.0f} kernel launches per step and no CUDA graph; the GPU "
                   f"idles {idle:.1f} of {ctx.step_ms:.1f} ms per step ({idle_share:.0%}) waiting for launches.")
        extra = {}
        if not ctx.server:  # a serving engine's launch flags fix nothing in a script's forward
            extra = {"fix": None, "remedy": ("Capture the forward in a CUDA graph (`torch.compile(model, "
                                             "mode=\"reduce-overhead\")` or `torch.cuda.graphs`), or give each "
                                             "launch more work (a larger batch).")}
        return self.finding(
            summary=summary, ms_per_step=idle, share=idle_share,  # idle: a share of the step, not of kernel time
            confidence="high" if idle_share > 0.4 else "medium", predicted_step_ms_after_fix=predicted, **extra,
            evidence={"launches_per_step": launches, "graph_launches_per_step": graphs,
                      "idle_ms_per_step": round(idle, 3), "idle_share": round(idle_share, 3),
                      "idle_per_launch_us": round(idle_per_launch_us, 1), "server": ctx.server,
                      "median_kernel_us": round(med_us, 2), "decode_batch_sizes": sizes,
                      "disable_cuda_graph": ctx.config_value("disable_cuda_graph"),
                      "cuda_graph_max_bs": ctx.config_value("cuda_graph_max_bs")})

    @classmethod
    def host_work_note(cls, ctx: RuleContext) -> Optional[str]:
        """What the idle is when it is too much per launch to be launch cost (no finding then)."""
        m = _launch_idle(ctx) if ctx.metrics else None
        if m is None:
            return None
        _, _, idle, share, per_launch = m
        if share < cls.MIN_IDLE_SHARE or per_launch <= cls.LAUNCH_IDLE_MAX_US:
            return None
        return (f"the GPU idles {idle:.1f} of {ctx.step_ms:.1f} ms per step ({share:.0%}), "
                f"{per_launch:.0f} us per kernel launch: host work between the launches (Python, pre- and "
                "post-processing, a profiler recording stacks, shapes or memory), not launch cost; CUDA graphs "
                f"would not remove it (eager-decode fires up to {cls.LAUNCH_IDLE_MAX_US:.0f} us per launch)")


def _launch_idle(ctx: RuleContext):
    """(launches, graph launches, idle ms, idle share of the step, idle us per launch) per step, medians;
    None for graph-replay steps or steps without launches."""
    launches = statistics.median(m.launches for m in ctx.metrics)
    graphs = statistics.median(m.graph_launches for m in ctx.metrics)
    idle = statistics.median(m.idle_ms for m in ctx.metrics)
    if graphs > 0 or launches < 1 or ctx.step_ms <= 0:
        return None
    return launches, graphs, idle, idle / ctx.step_ms, idle * 1e3 / launches
