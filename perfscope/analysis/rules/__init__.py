"""The rule registry: every known decode bottleneck, one class each, stable ids."""

from __future__ import annotations

from perfscope.analysis.rules.base import Finding, Rule, RuleContext
from perfscope.analysis.rules.chunked_prefill import ChunkedPrefillInterference
from perfscope.analysis.rules.eager_decode import EagerDecode
from perfscope.analysis.rules.fp8_kv_cast import Fp8KvCast
from perfscope.analysis.rules.host_bubble import HostBubble
from perfscope.analysis.rules.nccl_allreduce import NcclAllReduce
from perfscope.analysis.rules.overlap_off import OverlapOff
from perfscope.analysis.rules.torch_sampling import TorchSampling
from perfscope.analysis.rules.triton_block_fp8_gemm import TritonBlockFp8Gemm
from perfscope.analysis.rules.untuned_fused_moe import UntunedFusedMoe
from perfscope.analysis.rules.warmup import WarmupInWindow

RULES: tuple[Rule, ...] = (
    Fp8KvCast(), EagerDecode(), HostBubble(), OverlapOff(), NcclAllReduce(), UntunedFusedMoe(),
    TritonBlockFp8Gemm(), TorchSampling(), ChunkedPrefillInterference(), WarmupInWindow(),
)


def run_rules(ctx: RuleContext) -> list[Finding]:
    rules = [r for r in RULES if (ctx.gpu_timeline or not r.needs_gpu_timeline) and (ctx.server or r.forwards)]
    found = [f for f in (r.check(ctx) for r in rules) if f is not None]
    for f in found:
        model_prediction(ctx, f)
    found.sort(key=lambda f: -f.ms_per_step)
    return found


def model_prediction(ctx: RuleContext, f: Finding) -> None:
    """Replace a kernel-level prediction (step minus the kernel time saved) by the step replayed on the
    CPU launch timeline (perfscope.analysis.stepmodel): the GPU cannot run ahead of the launches."""
    if f.new_duration is None or not ctx.steps:
        return
    from perfscope.analysis.stepmodel import predict_after, predict_after_serial

    if ctx.gpu_timeline:
        p = predict_after(ctx.trace, ctx.steps, ctx.step_ms, f.new_duration, f.added_us_per_step)
    else:  # CPU-only trace analysed on its ops: no launch timeline, each step's thread is serial
        p = predict_after_serial(ctx.trace, ctx.steps, f.new_duration, f.added_us_per_step)
    if not p:
        return
    if f.assumes:
        p["assumes"] = f.assumes
    if ctx.gpu_timeline:
        # the kernels the fix changes (by name): compare holds the others to the prediction's assumption
        kern = ctx.trace.kernels
        p["changed_kernels"] = sorted({kern[i].name for s in ctx.steps for i in s.kernels
                                       if f.new_duration(i) is not None})[:20]
    if f.alternatives and ctx.gpu_timeline:
        # other outcomes of the same fix (another strategy, kernels it is known to slow down), replayed alike
        alt = {}
        for name, (nd, added, why) in f.alternatives.items():
            q = predict_after(ctx.trace, ctx.steps, ctx.step_ms, nd, added)
            if q:
                alt[name] = {"predicted_step_ms": q["predicted_step_ms"], "bound": q["bound"], "why": why}
        if alt:
            p["alternatives"] = alt
            xs = [p["predicted_step_ms"]] + [a["predicted_step_ms"] for a in alt.values()]
            p["range_ms"] = [round(min(xs), 4), round(max(xs), 4)]
    f.evidence["prediction"] = p
    before = f.predicted_step_ms_after_fix
    f.predicted_step_ms_after_fix = p["predicted_step_ms"]
    if before is not None and f.summary:
        # "~X ms" is the prediction; a bare "X ms" only when that is all there is ("0.0 ms" would
        # also match inside "430.0 ms")
        for old in (f"~{before:.1f} ms", f"{before:.1f} ms"):
            if old in f.summary:
                f.summary = f.summary.replace(old, old[0] * (old[0] == "~") + f"{p['predicted_step_ms']:.1f} ms")
                break
    lo, pr = p.get("lower_bound_ms"), p["predicted_step_ms"]
    if p.get("alternatives") and f.summary:
        for name, a in p["alternatives"].items():
            f.summary += f" {a['why']}: ~{a['predicted_step_ms']:.1f} ms ({name})."
    if p.get("bound") == "host" and f.summary:
        f.summary += (f" Fixed, the step is bound by the host, not the GPU: its GPU work would take ~{p['gpu_prediction_ms']:.1f} ms, "
                      f"but the launching thread is busy {p['host_floor_ms']:.1f} ms per step outside its GPU waits "
                      f"(scheduling, input preparation, launches, result processing) at this profiled run's host speed; "
                      f"unprofiled the host is faster (and its speed varies between runs), so expect between "
                      f"{p['gpu_prediction_ms']:.1f} and {p['host_floor_ms']:.1f} ms.")
    elif lo is not None and pr > 1.3 * lo and f.summary:
        f.summary += (f" The fixed step waits on kernel launches: ~{pr:.1f} ms at this trace's launch rate "
                      f"(a profiled run's), at least {lo:.1f} ms with launches at the runtime's own cost.")


def rule_ids() -> list[str]:
    return [r.id for r in RULES]


__all__ = ["Finding", "Rule", "RuleContext", "RULES", "run_rules", "rule_ids"]
