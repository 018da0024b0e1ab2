"""The sampling path of a step: everything a step runs on the logits after its last GEMM (the LM head).

A sampler is a chain of small kernels over a [batch, vocab] tensor: a cast to float, the
temperature divide, softmax over the vocabulary, then either a fused sampling kernel (FlashInfer
``*SamplingFromProbKernel``) or torch's sort / cumsum / mask / multinomial (top-p), topk /
multinomial (top-k), or argmax (greedy). By name alone the softmax, the cumsum
(``tensor_kernel_scan_innermost_dim``) and the multinomial's ``distribution_elementwise`` kernels
are plain elementwise work; by position they are the sampler's. So the kernels that start after
the step's last GEMM ends belong to the sampling path when that tail holds a sampling kernel
(sort, topk, argmax, multinomial, FlashInfer sampling); attention, GEMM, MoE and communication
kernels never do.
"""

from __future__ import annotations

import functools
import re
from typing import Optional

from perfscope.analysis.kernel_table import TORCH_SORT, kernel_table
from perfscope.analysis.moe_layer import MOE_ROUTING, moe_overrides
from perfscope.analysis.steps import Step
from perfscope.load.model import Trace

_NEVER = ("gemm", "attention", "communication", "moe")
_SCAN = re.compile(r"scan_innermost|scan_outer|DeviceScan|cumsum", re.I)
_SOFTMAX = re.compile(r"softmax", re.I)
_MULTINOMIAL = re.compile(r"distribution_elementwise|exponential_|multinomial", re.I)

__all__ = ["TORCH_SORT", "MID_STEP_SORT", "kind_of", "sampling_tail", "step_overrides"]


def _last_gemm(trace: Trace, step: Step) -> Optional[tuple[float, float]]:
    """(latest start, latest end) of the step's GEMM kernels; None when it has none. Once per step and
    trace (the overrides, the sampling rule and the timeline ask it of the same steps)."""
    memo = trace.memo.setdefault("last_gemm", {})
    hit = memo.get(id(step))
    if hit is not None and hit[0] is step:
        return hit[1]
    kern = trace.kernels
    gemm = kernel_table(trace).gemm
    ks = [kern[i] for i in step.kernels if gemm[i]]
    out = (max([k.ts for k in ks]), max([k.ts + k.dur for k in ks])) if ks else None
    memo[id(step)] = (step, out)  # the step held: its id is not reused while the memo lives
    return out


def sampling_tail(trace: Trace, step: Step, last_gemm: Optional[tuple[float, float]] = None) -> list[int]:
    """Kernel indices of the step's sampling path (empty when its tail holds no sampling kernel).
    ``last_gemm``: :func:`_last_gemm` of the step, when the caller has it."""
    kern = trace.kernels
    bucket = kernel_table(trace).bucket
    last_gemm = last_gemm or _last_gemm(trace, step)
    if last_gemm is None:
        return []
    lo = last_gemm[1] - 0.5
    tail = [i for i in step.kernels if kern[i].ts >= lo and bucket[i] not in _NEVER]
    if not any(bucket[i] == "sampling" for i in tail):
        return []
    return tail


@functools.lru_cache(maxsize=4096)
def kind_of(name: str) -> str:
    """What a sampling-path kernel does: sort, scan (cumsum), softmax, multinomial, fused, other (asked
    once per distinct name: every step's sampling path runs the same few kernels)."""
    if "flashinfer::sampling" in name:
        return "fused"
    if TORCH_SORT.search(name):
        return "sort/topk"
    if _SCAN.search(name):
        return "cumsum"
    if _SOFTMAX.search(name):
        return "softmax"
    if _MULTINOMIAL.search(name) or "ArgMax" in name:
        return "multinomial/argmax"
    return "other"


MID_STEP_SORT = ("other", "topk-mid-step")


def step_overrides(trace: Trace, step: Step, serving: bool = True) -> dict[int, tuple[str, str]]:
    """The step's kernels whose (bucket, sub-bucket) is not their name's:

    * on serving traces, the sampling path's softmax / cumsum / casts -> ("sampling", "path-<bucket>");
    * torch sort / top-k kernels that a GEMM of the step follows -> moe/routing in a step with an MoE layer
      (torch-native MoE: router GEMM, top-k, sort, gather, expert GEMMs), else ``MID_STEP_SORT``
      (another mid-model top-k). Sampling runs on the logits, after the step's last GEMM (the LM head),
      so these are not sampling;
    * kernels inside a GPU range named after the MoE layer -> moe (perfscope.analysis.moe_layer).

    Computed once per step and trace (the passes that read it share the answer: do not modify it)."""
    memo = trace.memo.setdefault("step_overrides", {})
    hit = memo.get((id(step), serving))
    if hit is not None and hit[0] is step:
        return hit[1]
    out = _step_overrides(trace, step, serving)
    memo[(id(step), serving)] = (step, out)  # the step held: its id is not reused while the memo lives
    return out


def _step_overrides(trace: Trace, step: Step, serving: bool) -> dict[int, tuple[str, str]]:
    kern = trace.kernels
    table = kernel_table(trace)
    bucket, sort = table.bucket, table.torch_sort
    has_moe, out = moe_overrides(trace, step)
    last = _last_gemm(trace, step)
    if last is None:
        return out  # no GEMM: no sampling path, and no top-k a GEMM follows
    for i in step.kernels:
        if sort[i] and bucket[i] == "sampling" and kern[i].end <= last[0]:
            out[i] = MOE_ROUTING if has_moe else MID_STEP_SORT
    if serving:
        for i in sampling_tail(trace, step, last):
            b = bucket[i]
            if b != "sampling" and i not in out:
                out[i] = ("sampling", f"path-{b}")
    return out
