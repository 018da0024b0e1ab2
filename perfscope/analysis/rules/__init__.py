"""The rule registry: every known decode bottleneck, one class each, stable ids."""

from __future__ import annotations

from typing import Optional

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
    Fp8KvCast(),
    EagerDecode(),
    HostBubble(),
    OverlapOff(),
    NcclAllReduce(),
    UntunedFusedMoe(),
    TritonBlockFp8Gemm(),
    TorchSampling(),
    ChunkedPrefillInterference(),
    WarmupInWindow(),
)

# Precedence: a rule is not checked where one it yields to applies (that one names the cause). The GPU idle
# between CUDA-graph replays is overlap-off's, not host-bubble's, when SGLang's overlap scheduler is off.
YIELDS_TO: dict[str, tuple[type[Rule], ...]] = {HostBubble.id: (OverlapOff,)}


def _yields(rule: Rule, ctx: RuleContext) -> bool:
    return any(other.applies(ctx) for other in YIELDS_TO.get(rule.id, ()))


def run_rules(ctx: RuleContext) -> list[Finding]:
    rules = [
        r
        for r in RULES
        if (ctx.gpu_timeline or not r.needs_gpu_timeline) and (ctx.server or r.forwards) and not _yields(r, ctx)
    ]
    found = [f for f in (r.check(ctx) for r in rules) if f is not None]
    for f in found:
        model_prediction(ctx, f)
    found.sort(key=lambda f: -f.ms_per_step)
    return found


def _bench_tpot(ctx: RuleContext) -> Optional[float]:
    """The TPOT the run measured without the profiler at the traced concurrency (``perfscope bench``
    or ``trace --bench``), when it came with the trace."""
    b = ctx.config.get("bench") or {}
    v = b.get("tpot_ms")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def model_prediction(ctx: RuleContext, f: Finding) -> None:
    """Replace a kernel-level prediction (step minus the kernel time saved) by the step replayed on the
    CPU launch timeline (perfscope.analysis.stepmodel), with the host's own time as the server spends
    it without the profiler (perfscope.analysis.hosttime): the fixed step is the larger of the GPU work
    left and that host time."""
    if not ctx.steps:
        return
    from perfscope.analysis import cpuhost, hosttime
    from perfscope.analysis.stepmodel import predict_after, predict_after_serial

    # a server on the CPU with a bench: its steps are host work, held to the bench's unprofiled step
    cpu = dict(ctx.cpu_host) if ctx.cpu_host is not None else None  # each finding's evidence its own copy
    if f.new_duration is None:
        if cpu is not None and f.predicted_step_ms_after_fix is not None:
            _on_cpu_host(f, cpu, ctx.step_ms - f.predicted_step_ms_after_fix, 0.0, None)
        return
    if ctx.gpu_timeline:
        p = predict_after(ctx.trace, ctx.steps, ctx.step_ms, f.new_duration, f.added_us_per_step)
    else:  # CPU-only trace analysed on its ops: no launch timeline, each step's thread is serial
        p = predict_after_serial(ctx.trace, ctx.steps, f.new_duration, f.added_us_per_step)
    if not p:
        return
    if cpu is not None:
        _on_cpu_host(f, cpu, p["kernel_time_saved_ms"], cpuhost.changed_ops(ctx.trace, ctx.steps, f.new_duration), p)
        return
    if f.assumes:
        p["assumes"] = f.assumes
    host, tail = None, hosttime.decode_tail_ms(ctx.config.get("bench"))
    if ctx.gpu_timeline:
        # the kernels the fix changes (by name): compare holds the others to the prediction's assumption
        kern = ctx.trace.kernels
        p["changed_kernels"] = sorted(
            {kern[i].name for s in ctx.steps for i in s.kernels if f.new_duration(i) is not None}
        )[:20]
        host = hosttime.estimate(
            p.get("host_busy_quick_ms"),
            hosttime.profile_kind(ctx.trace),
            p.get("removed_cpu_ms") or 0.0,
            ctx.config.get("host_timing"),
            _bench_tpot(ctx),
            ctx.step_ms,
        )
        gpu = hosttime.gpu_work_ms(p)
        p["gpu_work_ms"] = round(gpu, 4)
        pt, lo, hi, bound = hosttime.cycle(gpu, host, tail)
        anchored = hosttime.anchor_to_bench(ctx.config.get("bench"), ctx.step_ms, p, host, tail)
        if anchored is not None:
            pt, lo, hi, bound = (
                anchored["point_ms"],
                anchored["range_ms"][0],
                anchored["range_ms"][1],
                anchored["bound"],
            )
            p["anchored"] = anchored
        if tail > 0.005:
            p["decode_tail_ms"] = round(tail, 4)
        p.update(
            predicted_step_ms=round(pt, 4),
            bound=bound,
            range_ms=[round(lo, 4), round(hi, 4)],
            host=host.to_dict() if host else None,
            model=p["model"] + "; the host's time per step as unprofiled (perfscope.analysis.hosttime: "
            "a GPU-only profile or the trace, scaled by the profiler's measured slow-down "
            "of the host, or the bench's TPOT where it measured the host)",
        )
    if f.alternatives and ctx.gpu_timeline:
        # other outcomes of the same fix (another strategy, kernels it is known to slow down), replayed alike
        alt = {}
        for name, (nd, added, why) in f.alternatives.items():
            q = predict_after(ctx.trace, ctx.steps, ctx.step_ms, nd, added, lower_bound=False)  # its GPU work only
            if q:
                qp, qlo, qhi, qb = hosttime.cycle(hosttime.gpu_work_ms(q), host, tail)
                alt[name] = {
                    "predicted_step_ms": round(qp, 4),
                    "bound": qb,
                    "why": why,
                    "range_ms": [round(qlo, 4), round(qhi, 4)],
                }
        if alt:
            p["alternatives"] = alt
            lo = min([p["range_ms"][0]] + [a["range_ms"][0] for a in alt.values()])
            hi = max([p["range_ms"][1]] + [a["range_ms"][1] for a in alt.values()])
            p["range_ms"] = [round(lo, 4), round(hi, 4)]
    f.evidence["prediction"] = p
    f.predicted_step_ms_after_fix = p["predicted_step_ms"]
    if f.summary:
        f.summary = (f.summary_at(p["predicted_step_ms"]) if f.summary_at else f.summary) + _prediction_said(p, host)


def _prediction_said(p: dict, host) -> str:
    """The sentences a summary ends with about the step model's prediction ``p``: the fix's other
    outcomes, the step measured without the profiler, or the host that bounds the fixed step."""
    out = "".join(
        f" {a['why']}: ~{a['predicted_step_ms']:.1f} ms ({name})." for name, a in (p.get("alternatives") or {}).items()
    )
    if p.get("anchored"):
        a = p["anchored"]
        out += (
            f" Without the profiler the step takes {a['measured_step_ms']:.2f} ms (the trace's "
            f"{a['profiled_step_ms']:.2f} ms is the profiler's): fixed, ~{p['predicted_step_ms']:.2f} ms "
            f"(the measured step less the {a['kernel_time_saved_ms']:.2f} ms of kernel time the fix saves; "
            f"expect {p['range_ms'][0]:.2f}-{p['range_ms'][1]:.2f} ms)."
        )
    elif host is not None and p.get("bound") == "host":
        out += (
            f" Fixed, the host bounds the step: its GPU work would take ~{p['gpu_work_ms']:.1f} ms, the "
            f"host's own work ~{host.point:.2f} ms per step without the profiler ({host.how}); expect "
            f"{p['range_ms'][0]:.2f}-{p['range_ms'][1]:.2f} ms."
        )
    elif host is not None and host.source != "bench" and host.profiled_ms and host.profiled_ms > p["predicted_step_ms"]:
        out += (
            f" The profiled host looks busier ({host.profiled_ms:.2f} ms per step) than the fixed GPU work, but "
            f"the profiler slows the host: without it, ~{host.point:.2f} ms ({host.how}), so the GPU "
            f"bounds the step; expect {p['range_ms'][0]:.2f}-{p['range_ms'][1]:.2f} ms."
        )
    return out


def _on_cpu_host(f: Finding, cost: dict, saved_ms: float, ops: float, p: Optional[dict]) -> None:
    """A finding's prediction on a server that runs on the CPU, from the bench's unprofiled step
    (perfscope.analysis.cpuhost.after_fix); ``p``: the profiled timeline's prediction, kept beside it."""
    from perfscope.analysis import cpuhost

    a = cpuhost.after_fix(cost, saved_ms, ops, p["predicted_step_ms"] if p else None)
    before = f.predicted_step_ms_after_fix
    a["profiled"] = (
        {k: p[k] for k in ("predicted_step_ms", "kernel_time_saved_ms") if k in p}
        if p
        else {"predicted_step_ms": before}
    )
    if p:
        a["model"] = p["model"] + "; " + "held to the bench's step without the profiler (perfscope.analysis.cpuhost)"
        if f.assumes:
            a["assumes"] = f.assumes
    f.evidence["prediction"] = a
    f.predicted_step_ms_after_fix = a["predicted_step_ms"]
    if before is not None and f.summary:
        for old in (f"~{before:.1f} ms", f"{before:.1f} ms"):
            if old in f.summary:
                f.summary = f.summary.replace(old, old[0] * (old[0] == "~") + f"{a['predicted_step_ms']:.1f} ms")
                break
    if f.summary:
        f.summary += (
            f" Without the profiler a token takes {cost['tpot_ms']:.2f} ms (the bench; the trace's step "
            f"cycle: {cost['profiled_cycle_ms']:.2f} ms): fixed, ~{a['predicted_step_ms']:.2f} ms "
            f"(expect {a['range_ms'][0]:.2f}-{a['range_ms'][1]:.2f} ms)."
        )


def rule_ids() -> list[str]:
    return [r.id for r in RULES]


__all__ = ["Finding", "Rule", "RuleContext", "RULES", "YIELDS_TO", "run_rules", "rule_ids"]
