"""Where a GPU kernel gets its bucket: one declarative table (perfscope.analysis.bucket_table), first match wins.

Buckets: ``copy`` (memcpy/memset, dtype casts, gathers, KV-cache writes), ``gemm``, ``attention``,
``communication`` (NCCL/RCCL and the custom all-reduce kernels), ``moe`` (the MoE layer's own kernels:
routing top-k, align/sort, the expert GEMMs, combine/sum; sub-buckets ``moe/gemm`` vs ``moe/routing`` and
``moe/combine``), and the rest: ``sampling``, ``elementwise`` (norms, activations, rope, quant,
reductions) and ``other``.
The ``kind`` of a GPU activity (memcpy/memset) wins over its name. Each row's fourth field says
whose kernels it covers (engine, library, API); ``perfscope rules --markdown`` / docs list them.
Every row is exercised by tests/test_buckets.py on the real kernel names of the traces in
tests/traces/corpus and tests/traces (the H200 kernel-mix traces: FlashInfer 0.6.18 norm, activation,
rope, sampling and MLA kernels, torch sampling, Triton norm/rotary, cuDNN SDPA; DeepSeek's own H800
training trace with its internal DeepEP `dpsk::ep::` kernels).

The table decides by name; one pass decides by place in the step (sampling_path.step_overrides): the
sampling path's softmax / cumsum / casts after the LM head join ``sampling`` (``sampling/path-*``), and
torch's generic sort / top-k kernels that a GEMM of the step follows (torch-native MoE expert routing)
leave it for ``moe/routing``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from perfscope.analysis.bucket_table import TABLE

__all__ = ["BUCKETS", "TABLE", "classify", "without_params"]

BUCKETS = ("copy", "gemm", "attention", "communication", "moe", "sampling", "elementwise", "other")

_COMPILED = tuple((b, s, re.compile(rx, re.I)) for b, s, rx, _covers in TABLE)
_KIND_BUCKET = {"memcpy": ("copy", "memcpy"), "memset": ("copy", "memset")}


def without_params(name: str) -> str:
    """The kernel name without its trailing parameter list: ``foo<T>(int, fbgemm_gpu::X)`` -> ``foo<T>``.

    Parameter types describe the arguments, not the kernel (a cast kernel taking a
    ``flashinfer::QuantizationScale`` is not attention), so the table never sees them."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        c = name[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return name[:i] if i > 0 else name
    return name


@lru_cache(maxsize=65536)
def classify(name: str, kind: str = "kernel") -> tuple[str, str]:
    """(bucket, sub-bucket) of a GPU activity by its name (parameter list left out) and kind."""
    if kind in _KIND_BUCKET:
        return _KIND_BUCKET[kind]
    if name.startswith(("Memcpy", "Memset", "hipMemcpy", "hipMemset")):
        return ("copy", "memset" if "emset" in name else "memcpy")
    head = without_params(name)
    for bucket, sub, rx in _COMPILED:
        if rx.search(head):
            return bucket, sub
    return "other", "other"
