"""torch-sampling: top-k/top-p sampling done with torch sort kernels on every decode step."""

from __future__ import annotations

import re
from typing import Optional

from perfscope.analysis.buckets import classify
from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_SORT = re.compile(r"RadixSort|radix_sort|radixSort|bitonicSort|segmented_sort|sort_kernel|SortOnesweep", re.I)
_SORT_OPS = ("aten::sort", "aten::argsort", "aten::topk")


class TorchSampling(Rule):
    id = "torch-sampling"
    title = "Torch-native top-k/top-p sampling every decode step"
    fix = "torch-sampling"
    what = ("Every decode step runs sort kernels (cub radix sort behind `torch.sort` / `torch.topk`) over the "
            "logits: top-k/top-p/min-p sampling done with plain torch ops instead of a fused sampling kernel.")
    why = ("Sorting a [batch, vocab] tensor (vocab 150k+) every token costs several kernels and often a "
           "host sync; FlashInfer's fused sampling kernels (rejection sampling) avoid the sort entirely.")
    evidence = ("Sort kernels found in what fraction of decode steps, their ms per step and share, the whole "
                "sampling bucket, `aten::sort`/`aten::topk` CPU ops when recorded, `sampling_backend`.")
    remedy = ("Use `--sampling-backend flashinfer` (SGLang's default when FlashInfer is installed); avoid "
              "per-request sampling parameters that force the torch path (custom logit processors).")
    false_positives = ("Sorts of other tensors (MoE token sorting, beam search) also use radix sort; the rule "
                       "requires a sort on most decode steps and a noticeable share.")

    MIN_STEP_FRACTION = 0.8
    MIN_SHARE = 0.03

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if ctx.phase != "decode" or not ctx.steps or ctx.kernel_ms_per_step <= 0:
            return None
        kern = ctx.trace.kernels
        sort_us = samp_us = 0.0
        steps_with_sort = 0
        sort_n = 0
        for s in ctx.steps:
            hit = False
            for i in s.kernels:
                k = kern[i]
                b = classify(k.name, k.kind)[0]
                if b == "sampling":
                    samp_us += k.dur
                    if _SORT.search(k.name):
                        sort_us += k.dur
                        sort_n += 1
                        hit = True
            steps_with_sort += hit
        n = ctx.n_steps
        frac = steps_with_sort / n
        ms = samp_us / n / 1e3
        share = ms / ctx.kernel_ms_per_step
        if frac < self.MIN_STEP_FRACTION or share < self.MIN_SHARE:
            return None
        lo = min(s.cpu_start for s in ctx.steps)
        hi = max(s.cpu_end for s in ctx.steps)
        sort_ops = sum(1 for o in ctx.trace.cpu_ops if o.name in _SORT_OPS and lo <= o.ts <= hi)
        backend = ctx.config_value("sampling_backend")
        confidence = "high" if backend == "pytorch" or sort_ops else "medium"
        # a fused sampling kernel replaces the sort and the softmax/cumsum around it: keep ~20%
        saved = ms * 0.8
        summary = (f"Sort kernels run on {frac:.0%} of decode steps ({sort_n / n:.0f} per step): sampling costs "
                   f"{ms:.2f} ms per step ({share:.0%} of kernel time); a fused sampling kernel avoids the sort.")
        return self.finding(
            summary=summary, ms_per_step=ms, share=share, confidence=confidence,
            predicted_step_ms_after_fix=round(max(ctx.step_ms - saved, 0.0), 4),
            evidence={"steps_with_sort_fraction": round(frac, 3), "sort_kernels_per_step": round(sort_n / n, 2),
                      "sort_ms_per_step": round(sort_us / n / 1e3, 4), "sampling_ms_per_step": round(ms, 4),
                      "sort_cpu_ops": sort_ops, "sampling_backend": backend})
