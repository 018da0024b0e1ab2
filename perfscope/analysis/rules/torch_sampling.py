"""torch-sampling: top-k/top-p sampling done with torch sort/topk kernels on every decode step."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Optional

from perfscope.analysis.rules.base import Finding, Rule, RuleContext
from perfscope.analysis.sampling_path import TORCH_SORT, kind_of, sampling_tail

_SORT_OPS = ("aten::sort", "aten::argsort", "aten::topk")
_SHAPE_OPS = ("aten::sort", "aten::topk", "aten::softmax", "aten::_softmax", "aten::argsort")
FUSED_KERNELS = 2  # a fused sampler: softmax over the vocabulary + one sampling kernel
FUSED_PASS_GB_S = 2000.0  # what one pass over [batch, vocab] float32 achieves in those kernels


class TorchSampling(Rule):
    id = "torch-sampling"
    title = "Torch-native top-k/top-p sampling every decode step"
    fix = "torch-sampling"
    what = (
        "Every decode step samples with plain torch ops over the logits: a sort (cub radix sort behind "
        "`torch.sort`, top-p) or `torch.topk` (top-k), with the softmax over the vocabulary, cumsum, "
        "masks and `torch.multinomial` around it, instead of a fused sampling kernel."
    )
    why = (
        "Sorting or top-k over a [batch, vocab] tensor (vocab 150k+) every token costs dozens of small "
        "kernels and, for top-p's boolean mask, a host sync; FlashInfer's fused sampling kernels "
        "(rejection sampling) avoid the sort entirely."
    )
    evidence = (
        "The sampling path of each decode step (the kernels after the LM-head GEMM: softmax over the "
        "vocabulary, sort/topk, cumsum, multinomial), its kernel time and its span on the GPU, "
        "the fraction of steps with a torch sort/topk, `aten::sort`/`aten::topk` CPU ops when "
        "recorded, `sampling_backend`. The saving is the step replayed without the path plus a "
        "fused sampler (perfscope.analysis.stepmodel)."
    )
    remedy = (
        "Use `--sampling-backend flashinfer` (SGLang's default when FlashInfer is installed); avoid "
        "per-request sampling parameters that force the torch path (custom logit processors)."
    )
    false_positives = (
        "Sorts of other tensors (MoE token sorting, beam search) also use radix sort; the rule "
        "requires a torch sort/topk after the LM head on most decode steps and a noticeable share."
    )

    MIN_STEP_FRACTION = 0.8
    MIN_SHARE = 0.03

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if ctx.phase != "decode" or not ctx.steps or ctx.kernel_ms_per_step <= 0:
            return None
        kern = ctx.trace.kernels
        path_us = sort_us = span_us = 0.0
        steps_with_sort = 0
        sort_n = 0
        kinds: dict[str, float] = defaultdict(float)
        path: set[int] = set()
        for s in ctx.steps:
            tail = sampling_tail(ctx.trace, s)
            hit = False
            for i in tail:
                k = kern[i]
                kd = kind_of(k.name)
                kinds[kd] += k.dur
                path_us += k.dur
                if kd == "sort/topk" and TORCH_SORT.search(k.name):
                    sort_us += k.dur
                    sort_n += 1
                    hit = True
            if tail:
                span_us += max(kern[i].end for i in tail) - min(kern[i].ts for i in tail)
            if hit:
                path.update(tail)
            steps_with_sort += hit
        n = ctx.n_steps
        frac = steps_with_sort / n
        ms = path_us / n / 1e3
        share = ms / ctx.kernel_ms_per_step
        if frac < self.MIN_STEP_FRACTION or share < self.MIN_SHARE:
            return None
        lo = min(s.cpu_start for s in ctx.steps)
        hi = max(s.cpu_end for s in ctx.steps)
        ops = [o for o in ctx.trace.cpu_ops if lo <= o.ts <= hi and o.name in _SHAPE_OPS]
        sort_ops = sum(1 for o in ops if o.name in _SORT_OPS)
        batch_vocab = None
        for o in ops:
            dims = _first_dims(o)
            if dims and len(dims) >= 2 and all(isinstance(x, int) for x in dims) and dims[-1] >= 1000:
                batch_vocab = (math.prod(dims[:-1]), dims[-1])
                break
        backend = ctx.config_value("sampling_backend")
        confidence = "high" if backend == "pytorch" or sort_ops else "medium"
        mode = "top-p" if kinds.get("cumsum") else "top-k"
        # the fused sampler that replaces the path: two kernels, one pass each over [batch, vocab] fp32
        per_pass_us = 10.0
        if batch_vocab:
            per_pass_us = max(5.0, batch_vocab[0] * batch_vocab[1] * 4 / (FUSED_PASS_GB_S * 1e3))
        added = FUSED_KERNELS * per_pass_us
        removed = frozenset(path)
        saved_naive = max(ms - added / 1e3, 0.0)
        summary = (
            f"Torch {mode} sampling on {frac:.0%} of decode steps ({sort_n / n:.0f} sort/topk kernels per "
            f"step): the sampling path after the LM head costs {ms:.2f} ms of kernels per step "
            f"({share:.0%} of kernel time, {span_us / n / 1e3:.2f} ms on the GPU); a fused sampling "
            f"kernel avoids the sort."
        )
        return self.finding(
            summary=summary,
            ms_per_step=ms,
            share=share,
            confidence=confidence,
            predicted_step_ms_after_fix=round(max(ctx.step_ms - saved_naive, 0.0), 4),
            evidence={
                "mode": mode,
                "steps_with_sort_fraction": round(frac, 3),
                "sort_kernels_per_step": round(sort_n / n, 2),
                "sort_ms_per_step": round(sort_us / n / 1e3, 4),
                "sampling_path_ms_per_step": round(ms, 4),
                "sampling_path_span_ms_per_step": round(span_us / n / 1e3, 4),
                "sampling_path_ms_by_kind": {
                    k: round(v / n / 1e3, 4) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
                },
                "batch_vocab": list(batch_vocab) if batch_vocab else None,
                "fused_sampler_us_assumed": round(added, 2),
                "sort_cpu_ops": sort_ops,
                "sampling_backend": backend,
            },
            new_duration=lambda i: 0.0 if i in removed else None,
            added_us_per_step=added,
        )


def _first_dims(op) -> Optional[list]:
    from perfscope.load.shapes import input_dims

    d = input_dims(op.input_dims)
    if isinstance(d, list) and d and isinstance(d[0], list):
        return d[0]
    return None
