"""chunked-prefill-interference: prefill (EXTEND) forwards run between decode steps and stall them."""

from __future__ import annotations

import statistics
from typing import Optional

from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_PREFILL = ("prefill", "mixed")


class ChunkedPrefillInterference(Rule):
    id = "chunked-prefill-interference"
    title = "Prefill chunks interleaved with decode steps"
    fix = "chunked-prefill-interference"
    what = (
        "EXTEND (prefill) forwards run between DECODE forwards: every running request waits for each "
        "prefill chunk, so inter-token latency has a tail of one chunk's duration."
    )
    why = (
        "A scheduler serves new requests by prefilling them between decode steps; with large chunks a "
        "decode token now and then waits tens of milliseconds, and P99 ITL is far above the median."
    )
    evidence = (
        "Prefill/mixed steps found between the first and last decode step, their median GPU time, the "
        "decode-to-decode interval median and maximum (an ITL proxy), `chunked_prefill_size`."
    )
    remedy = (
        "Bound the stall with a smaller `--chunked-prefill-size`; run prefill chunks together with decode "
        "(`--enable-mixed-chunk`); or separate them (prefill-decode disaggregation) when the ITL tail "
        "matters more than throughput."
    )
    false_positives = (
        "Every serving trace with new arrivals has some prefill: the rule fires only when the "
        "interleaved prefills stretch decode intervals to at least twice the median."
    )

    MIN_TAIL_RATIO = 2.0

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if ctx.phase != "decode" or len(ctx.steps) < 2:
            return None
        dec = sorted(s.gpu_start for s in ctx.steps if s.gpu_start is not None)  # the decode steps' GPU starts
        if len(dec) < 2:
            return None
        lo, hi = dec[0], dec[-1]
        pre = [
            s for s in ctx.stepset.steps if s.phase in _PREFILL and s.gpu_start is not None and lo < s.gpu_start < hi
        ]
        if not pre:
            return None
        itl = [(b - a) / 1e3 for a, b in zip(dec, dec[1:])]
        med = statistics.median(itl)
        worst = max(itl)
        if med <= 0 or worst < self.MIN_TAIL_RATIO * med:
            return None
        pre_ms = [s.gpu_us / 1e3 for s in pre]
        starts = [s.gpu_start for s in pre if s.gpu_start is not None]
        stalled = sum(1 for a, b in zip(dec, dec[1:]) if any(a < t < b for t in starts))
        ms = sum(pre_ms) / len(dec)  # prefill time amortised over the decode steps it interrupted
        summary = (
            f"{len(pre)} prefill forward(s) ran between {len(dec)} decode steps (median {statistics.median(pre_ms):.1f} ms "
            f"each): decode intervals reach {worst:.1f} ms against a median of {med:.1f} ms."
        )
        return self.finding(
            summary=summary,
            ms_per_step=ms,
            share=ms / max(ctx.kernel_ms_per_step, 1e-9),
            confidence="high" if worst >= 4 * med else "medium",
            predicted_step_ms_after_fix=round(ctx.step_ms, 4),
            evidence={
                "prefill_steps_between_decodes": len(pre),
                "decode_steps": len(dec),
                "prefill_median_ms": round(statistics.median(pre_ms), 4),
                "decode_interval_median_ms": round(med, 4),
                "decode_interval_max_ms": round(worst, 4),
                "tail_ratio": round(worst / med, 3),
                "stalled_intervals": stalled,
                "chunked_prefill_size": ctx.config_value("chunked_prefill_size"),
                "enable_mixed_chunk": ctx.config_value("enable_mixed_chunk"),
            },
        )
