"""warmup-in-window: lazy module loading, JIT builds or a cold first step inside the profiled window."""

from __future__ import annotations

import statistics
from typing import Optional

from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_WARMUP_CALLS = (
    "Lazy Function Loading",
    "cuModuleLoad",
    "cuLibraryLoad",
    "cudaFuncGetAttributes",
    "hipModuleLoad",
    "cuModuleGetFunction",
    "cuLibraryGetKernel",
)
_WARMUP_OPS = ("autotune", "Autotune", "jit", "compile", "triton_compile", "load_module")


class WarmupInWindow(Rule):
    id = "warmup-in-window"
    title = "Warm-up inside the profiled window"
    fix = None
    what = (
        "The profiled decode steps include one-off work: lazy CUDA module/function loading, JIT or "
        "Triton autotuning, or a first step far slower than the rest."
    )
    why = "One-off costs inflate the measured step time and hide the steady-state bottleneck."
    evidence = "Module-loading runtime calls inside steps, JIT/autotune CPU ops, the slowest step against the median."
    remedy = (
        "Send warm-up requests before profiling (perfscope trace does), or start the profile "
        "later (`start_step`); set CUDA_MODULE_LOADING=EAGER to load modules up front."
    )
    false_positives = "A genuinely variable workload (batch size changing between steps) also spreads step times."

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if not ctx.steps:
            return None
        lo = min(s.cpu_start for s in ctx.steps)
        hi = max(max(s.cpu_end, s.gpu_end or 0) for s in ctx.steps)
        loads = [l for l in ctx.trace.launches if l.name.startswith(_WARMUP_CALLS) and lo <= l.ts <= hi]
        is_jit: dict = {}  # per distinct op name
        for o in ctx.trace.cpu_ops:
            if o.name not in is_jit:
                is_jit[o.name] = any(w in o.name for w in _WARMUP_OPS)
        jit = [o for o in ctx.trace.cpu_ops if lo <= o.ts <= hi and is_jit[o.name]]
        gpu = [m.gpu_ms for m in ctx.metrics if m.gpu_ms > 0]
        slow_ms = 0.0
        slow_steps = []
        if len(gpu) >= 3:
            med = statistics.median(gpu)
            slow_steps = [m.index for m in ctx.metrics if m.gpu_ms > 3 * med]
            slow_ms = sum(m.gpu_ms - med for m in ctx.metrics if m.gpu_ms > 3 * med)
        load_ms = sum(l.dur for l in loads) / 1e3 + sum(o.dur for o in jit) / 1e3
        if not loads and not jit and not slow_steps:
            return None
        if not slow_steps and load_ms < 0.05 * max(ctx.step_ms, 1e-9) * ctx.n_steps:
            return None
        ms = max(load_ms, slow_ms) / ctx.n_steps
        summary = (
            f"Warm-up inside the profiled window: {len(loads)} module loads, {len(jit)} JIT/autotune ops"
            f"{', and slow outlier steps ' + str(slow_steps) if slow_steps else ''}; "
            "profile after warm-up to see the steady state."
        )
        return self.finding(
            summary=summary,
            ms_per_step=ms,
            share=ms / max(ctx.kernel_ms_per_step, 1e-9),
            confidence="high" if loads or jit else "medium",
            predicted_step_ms_after_fix=None,
            evidence={
                "module_loads": len(loads),
                "jit_ops": len(jit),
                "outlier_steps": slow_steps,
                "warmup_ms_total": round(max(load_ms, slow_ms), 3),
            },
        )
