"""nccl-allreduce: decode communication spent in NCCL all-reduce where a custom one would serve."""

from __future__ import annotations

import re
from typing import Optional

from perfscope.analysis.buckets import classify
from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_ALLREDUCE = re.compile(r"AllReduce", re.I)


class NcclAllReduce(Rule):
    id = "nccl-allreduce"
    title = "Communication-dominated decode on NCCL all-reduce"
    fix = "nccl-allreduce"
    what = (
        "The communication bucket is a large part of each decode step and it is NCCL's ring/tree "
        "all-reduce (`ncclDevKernel_AllReduce*`), not SGLang's custom all-reduce "
        "(`cross_device_reduce*`, one-shot/two-shot, `multimem_all_reduce`, `allreduce_fusion`)."
    )
    why = (
        "Decode all-reduces are small (batch x hidden); NCCL's protocol latency dominates them. The "
        "custom all-reduce over NVLink/IPC buffers finishes them in a fraction of the time, and "
        "works under CUDA graphs."
    )
    evidence = "NCCL all-reduce ms and count per step, their share of step kernel time, absence of custom all-reduce kernels, `disable_custom_all_reduce`."
    remedy = (
        "Drop `--disable-custom-all-reduce`; check that the GPUs are NVLink-connected (custom "
        "all-reduce is disabled on PCIe-only boxes) and that the message size is within its limit."
    )
    false_positives = (
        "Large prefill-size all-reduces where NCCL is the right choice; multi-node TP "
        "where no custom all-reduce exists."
    )

    MIN_SHARE = 0.15

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if not ctx.steps or ctx.kernel_ms_per_step <= 0:
            return None
        ms, nccl_n = ctx.time_of(
            lambda k: classify(k.name, k.kind) == ("communication", "nccl") and _ALLREDUCE.search(k.name) is not None
        )
        custom_ms, _ = ctx.time_of(lambda k: classify(k.name, k.kind) == ("communication", "custom"))
        share = ms / ctx.kernel_ms_per_step
        if share < self.MIN_SHARE or custom_ms > 0.5 * ms:
            return None
        disabled = ctx.config_value("disable_custom_all_reduce")
        # a one-shot custom all-reduce is typically 2-3x faster on decode-size messages; only the part
        # of the collectives that no other kernel hides shortens the step
        comm = sum(m.buckets.get("communication", 0.0) for m in ctx.metrics)
        exposed = (sum(m.comm_exposed_ms for m in ctx.metrics) / comm) if comm > 0 and ctx.gpu_timeline else 1.0
        predicted = max(ctx.step_ms - ms * 0.6 * exposed, 0.0)
        summary = (
            f"NCCL all-reduce takes {ms:.2f} ms per step ({share:.0%} of kernel time, "
            f"{nccl_n:.0f} calls); a custom all-reduce would serve decode-size messages."
        )
        nccl_allreduce = ctx.by_name(
            lambda k: classify(k.name, k.kind) == ("communication", "nccl") and _ALLREDUCE.search(k.name) is not None
        )
        kern = ctx.trace.kernels

        def faster(i):  # a custom all-reduce takes ~40% of NCCL's time on these messages
            return kern[i].dur * 0.4 if nccl_allreduce(i) else None

        return self.finding(
            summary=summary,
            ms_per_step=ms,
            share=share,
            new_duration=faster,
            confidence="high" if disabled else "medium",
            predicted_step_ms_after_fix=predicted,
            evidence={
                "nccl_allreduce_ms_per_step": round(ms, 3),
                "nccl_allreduce_per_step": nccl_n,
                "custom_allreduce_ms_per_step": round(custom_ms, 3),
                "communication_exposed_share": round(exposed, 3),
                "disable_custom_all_reduce": disabled,
                "world_size": ctx.trace.meta.world_size,
                "tp_size": ctx.config_value("tp_size"),
            },
        )
