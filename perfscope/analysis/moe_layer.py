"""What counts as the MoE layer when the kernel names do not say it.

The bucket table puts a kernel into ``moe`` by its name (routing, align/sort, the expert GEMMs,
combine/sum). Two more facts place a kernel there:

* a GPU-side ``record_function`` range named after the MoE layer (``MoE[...]``, ``expert_ffn[...]``,
  ``...moe...``): a torch-native MoE layer is plain GEMMs, gathers and activations by name; inside that
  range its GEMMs are ``moe/gemm`` and the rest ``moe/other``;
* a torch sort / top-k that a GEMM of the step follows (sampling_path.step_overrides) is expert
  routing, ``moe/routing``, when the step has MoE kernels or ranges; without them it stays
  ``other/topk-mid-step`` (a recommendation model's or another mid-model top-k).
"""

from __future__ import annotations

import bisect
import re

from perfscope.analysis.kernel_table import kernel_table
from perfscope.analysis.steps import Step
from perfscope.load.model import Trace

MOE_RANGE = re.compile(r"(^|[^a-z])moe([^a-z]|$)|expert", re.I)
MOE_ROUTING = ("moe", "routing")
TOPK_ELSEWHERE = ("other", "topk-mid-step")
_KEEP = ("moe", "communication")  # already the MoE layer's, or its dispatch/combine collectives


def moe_ranges(trace: Trace) -> tuple[list[float], list[float], bool]:
    """(starts, ends) of the trace's GPU-side MoE ranges, merged and sorted, and whether any kernel's
    name is the MoE layer's (once per trace, in its memo: a trace with neither costs the steps nothing
    more, and the answer goes with the analysis' memo)."""
    hit = trace.memo.get("moe_ranges")
    if hit is not None and hit[0] is trace.kernels and hit[1] is trace.annotations:
        return hit[2], hit[3], hit[4]
    table = kernel_table(trace)  # each distinct (name, kind) once: its first kernel's bucket
    named = any(table.bucket[i] == "moe" for i in table.first)
    spans = sorted((a.ts, a.ts + a.dur) for a in trace.annotations if a.gpu and MOE_RANGE.search(a.name))
    starts: list[float] = []
    ends: list[float] = []
    for s, e in spans:
        if ends and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    trace.memo["moe_ranges"] = (trace.kernels, trace.annotations, starts, ends, named)
    return starts, ends, named


def _inside(starts: list[float], ends: list[float], ts: float, end: float) -> bool:
    i = bisect.bisect_right(starts, ts) - 1
    return i >= 0 and end <= ends[i] + 0.5


def moe_overrides(trace: Trace, step: Step) -> tuple[bool, dict[int, tuple[str, str]]]:
    """(whether the step runs an MoE layer, {kernel index: (bucket, sub)} of the kernels inside MoE ranges)."""
    kern = trace.kernels
    starts, ends, named = moe_ranges(trace)
    out: dict[int, tuple[str, str]] = {}
    if not starts and not named:
        return False, out
    has = False
    bucket = kernel_table(trace).bucket  # classify(name, kind)[0] of each kernel, once per distinct name
    for i in step.kernels:
        k = kern[i]
        b = bucket[i]
        if b == "moe":
            has = True
            continue
        if starts and b not in _KEEP and _inside(starts, ends, k.ts, k.end):
            out[i] = ("moe", "gemm") if b == "gemm" else ("moe", "other")
    return has or bool(out), out
