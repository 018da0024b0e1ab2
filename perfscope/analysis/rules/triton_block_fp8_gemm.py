"""triton-block-fp8-gemm: block-FP8 GEMMs run in Triton instead of DeepGEMM."""

from __future__ import annotations

from typing import Optional

from perfscope.analysis.buckets import classify
from perfscope.analysis.rules.base import Finding, Rule, RuleContext

DEEPGEMM_SPEEDUP = 1.5  # DeepGEMM vs the Triton block-FP8 kernel on Hopper decode shapes (conservative)


class TritonBlockFp8Gemm(Rule):
    id = "triton-block-fp8-gemm"
    title = "Block-FP8 GEMMs in Triton instead of DeepGEMM"
    fix = None
    what = (
        "Most GEMM time is the Triton `_w8a8_block_fp8_matmul` kernel: a block-quantised FP8 model "
        "(DeepSeek-V3/R1 style, 128x128 weight scales) running its linear layers on the generic Triton "
        "path instead of DeepGEMM (or CUTLASS block-scale GEMMs)."
    )
    why = "The Triton kernel reaches a fraction of what DeepGEMM's Hopper/Blackwell kernels do on the same shapes."
    evidence = "Triton block-FP8 GEMM ms per step, its share of GEMM and of kernel time, the GPU's compute capability."
    remedy = (
        "On SM90/SM100 enable DeepGEMM (`SGL_ENABLE_JIT_DEEPGEMM=1`, the default in recent SGLang when "
        "`deep_gemm` is installed) and let it pre-compile its kernels at start-up; elsewhere use the "
        "CUTLASS/aiter block-scale GEMM backend if the version has one."
    )
    false_positives = "Shapes DeepGEMM does not support fall back to Triton by design."

    MIN_GEMM_FRACTION = 0.5
    MIN_SHARE = 0.15

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if not ctx.steps or ctx.kernel_ms_per_step <= 0:
            return None
        ms, calls = ctx.time_of(lambda k: classify(k.name, k.kind) == ("gemm", "block-fp8-triton"))
        gemm_ms = ctx.buckets_ms.get("gemm", 0.0)
        share = ms / ctx.kernel_ms_per_step
        if not gemm_ms or ms / gemm_ms < self.MIN_GEMM_FRACTION or share < self.MIN_SHARE:
            return None
        cc = ctx.trace.meta.compute_capability
        deepgemm_ok = deepgemm_supported(ctx.trace.meta)
        saved = ms * (1 - 1 / DEEPGEMM_SPEEDUP)
        summary = (
            f"Triton block-FP8 GEMMs take {ms:.2f} ms per step ({ms / gemm_ms:.0%} of GEMM time, "
            f"{share:.0%} of kernel time)" + ("; DeepGEMM runs these on this GPU." if deepgemm_ok else ".")
        )
        block_fp8 = ctx.by_name(lambda k: classify(k.name) == ("gemm", "block-fp8-triton"))
        kern = ctx.trace.kernels
        return self.finding(
            summary=summary,
            ms_per_step=ms,
            share=share,
            confidence="high" if deepgemm_ok else "medium",
            predicted_step_ms_after_fix=round(max(ctx.step_ms - saved, 0.0), 4),
            new_duration=lambda i: kern[i].dur / DEEPGEMM_SPEEDUP if block_fp8(i) else None,
            evidence={
                "triton_block_fp8_ms_per_step": round(ms, 4),
                "calls_per_step": round(calls, 2),
                "share_of_gemm": round(ms / gemm_ms, 4),
                "compute_capability": cc,
                "deepgemm_supported_gpu": deepgemm_ok,
                "assumed_deepgemm_speedup": DEEPGEMM_SPEEDUP,
                "quantization": ctx.config_value("quantization"),
            },
        )


# DeepGEMM's kernels: SM90 (H100/H200/H20/H800) and SM100-family Blackwell (B200 10.0, GB300/B300 10.3)
DEEPGEMM_CC = ("9.0", "10.0", "10.3")


def deepgemm_supported(meta) -> bool:
    """Whether DeepGEMM runs on the trace's GPU: an NVIDIA GPU (an AMD MI210 reports "9.0" too) of a
    compute capability it has kernels for."""
    name = (meta.device_name or "").upper()
    if meta.platform != "cuda" or "AMD" in name or "INSTINCT" in name or "RADEON" in name:
        return False
    return meta.compute_capability in DEEPGEMM_CC
