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
    rules = [r for r in RULES if ctx.gpu_timeline or not r.needs_gpu_timeline]
    found = [f for f in (r.check(ctx) for r in rules) if f is not None]
    found.sort(key=lambda f: -f.ms_per_step)
    return found


def rule_ids() -> list[str]:
    return [r.id for r in RULES]


__all__ = ["Finding", "Rule", "RuleContext", "RULES", "run_rules", "rule_ids"]
