"""untuned-fused-moe: the Triton fused MoE kernel dominates decode, likely on its default config."""

from __future__ import annotations

import re
from typing import Optional

from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_FUSED_MOE = re.compile(r"fused_moe_kernel")
TUNED_SPEEDUP = 1.3  # measured gains of tuned over default configs on decode shapes are ~1.2-2x


class UntunedFusedMoe(Rule):
    id = "untuned-fused-moe"
    title = "Triton fused MoE kernel dominates (default config?)"
    fix = None
    what = ("The Triton `fused_moe_kernel` takes a large share of each decode step. SGLang/vLLM ship tuned "
            "block-size configs per (experts, intermediate size, dtype, GPU); without one the server logs "
            "'Using default MoE kernel config' and runs a generic tiling.")
    why = ("Decode MoE GEMMs are tiny per expert; the default tile sizes waste most of each tile and the "
           "kernel runs well below memory bandwidth.")
    evidence = "fused_moe_kernel ms and calls per step, share of kernel time and of the GEMM time, device."
    remedy = ("Tune it: SGLang's `benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py` (vLLM: "
              "`benchmarks/kernels/benchmark_moe.py --tune`) for this model, TP size, dtype and GPU, and put the "
              "JSON into the `fused_moe_triton/configs` folder; or use a backend with its own MoE kernels "
              "(e.g. `--moe-runner-backend` flashinfer/cutlass where supported).")
    false_positives = ("A model whose MoE really is most of the work: the rule cannot see the server log that "
                       "tells whether a tuned config was found, so confidence is medium.")

    MIN_SHARE = 0.25

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if not ctx.steps or ctx.kernel_ms_per_step <= 0:
            return None
        ms, calls = ctx.time_of(lambda k: _FUSED_MOE.search(k.name) is not None)
        share = ms / ctx.kernel_ms_per_step
        if share < self.MIN_SHARE:
            return None
        gemm_ms = ctx.buckets_ms.get("gemm", 0.0)
        saved = ms * (1 - 1 / TUNED_SPEEDUP)
        summary = (f"The Triton fused MoE kernel takes {ms:.2f} ms per step ({share:.0%} of kernel time, "
                   f"{calls:.0f} calls); check the server log for 'default MoE kernel config' and tune it.")
        return self.finding(
            summary=summary, ms_per_step=ms, share=share, confidence="medium",
            predicted_step_ms_after_fix=round(max(ctx.step_ms - saved, 0.0), 4),
            new_duration=lambda i: (ctx.trace.kernels[i].dur / TUNED_SPEEDUP
                                    if _FUSED_MOE.search(ctx.trace.kernels[i].name) else None),
            evidence={"fused_moe_ms_per_step": round(ms, 4), "fused_moe_calls_per_step": round(calls, 2),
                      "share_of_gemm": round(ms / gemm_ms, 4) if gemm_ms else None,
                      "assumed_tuned_speedup": TUNED_SPEEDUP, "device": ctx.trace.meta.device_name,
                      "ep_size": ctx.config_value("ep_size"), "tp_size": ctx.config_value("tp_size")})
