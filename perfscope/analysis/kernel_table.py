"""Each distinct kernel name of a trace classified once: a table per trace, read by index.

A decode trace launches a few hundred distinct kernels hundreds of thousands of times; the passes
ask the same questions of every instance (its bucket, whether it is a GEMM, a torch sort / top-k).
:func:`kernel_table` answers them once per (name, kind) and keeps the answers per kernel index, in
the trace's memo, so every pass of one analysis shares one table.
"""

from __future__ import annotations

import re

from perfscope.analysis.buckets import classify
from perfscope.load.model import Trace

# torch-native sort/topk kernels (not FlashInfer's fused sampling)
TORCH_SORT = re.compile(
    r"RadixSort|radix_sort|radixSort|bitonicSort|segmented_sort|sort_kernel|SortOnesweep|"
    r"mbtopk::|sbtopk|gatherTopK|sort_postprocess",
    re.I,
)


class KernelTable:
    """Per kernel index of ``trace.kernels``: ``pair`` (bucket, sub-bucket), ``bucket``, ``gemm`` (1: a kernel
    whose bucket is gemm; memcpy/memset never), ``torch_sort`` (1: its name is a torch sort / top-k),
    ``key`` (its distinct (name, kind), numbered); ``first``: the first kernel of each key."""

    __slots__ = ("pair", "bucket", "gemm", "torch_sort", "key", "first")

    def __init__(self, trace: Trace):
        seen: dict = {}
        pair: list = []
        bucket: list = []
        gemm: list = []
        sort: list = []
        keys: list = []
        first: list = []
        for n, k in enumerate(trace.kernels):
            key = (k.name, k.kind)
            row = seen.get(key)
            if row is None:
                bs = classify(k.name, k.kind)
                row = seen[key] = (
                    bs,
                    bs[0],
                    k.kind == "kernel" and bs[0] == "gemm",
                    TORCH_SORT.search(k.name) is not None,
                    len(first),
                )
                first.append(n)
            pair.append(row[0])
            bucket.append(row[1])
            gemm.append(row[2])
            sort.append(row[3])
            keys.append(row[4])
        # the yes/no answers a byte per kernel (read as 0 or 1)
        self.pair, self.bucket, self.gemm, self.torch_sort = pair, bucket, bytes(gemm), bytes(sort)
        # the distinct (name, kind) of each kernel as a number, and the first kernel of each: a question
        # of the name is asked once per number (RuleContext.time_of)
        self.key, self.first = keys, first


def kernel_table(trace: Trace) -> KernelTable:
    """The trace's :class:`KernelTable`, built on first use."""
    t = trace.memo.get("kernel_table")
    if t is None or len(t.pair) != len(trace.kernels):
        t = trace.memo["kernel_table"] = KernelTable(trace)
    return t


def launches_by_corr(trace: Trace) -> dict:
    """The trace's runtime calls by correlation id (the later of two with one id wins), built once per
    trace and shared (the attributor, the step model): read only."""
    m = trace.memo.get("launches_by_corr")
    if m is None or m[0] != len(trace.launches):
        m = trace.memo["launches_by_corr"] = (
            len(trace.launches),
            {l.corr: l for l in trace.launches if l.corr is not None},
        )
    return m[1]
