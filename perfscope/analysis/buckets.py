"""Where a GPU kernel gets its bucket: one declarative table, first match wins.

Buckets: ``copy`` (memcpy/memset, dtype casts, gathers, KV-cache writes), ``gemm``, ``attention``,
``communication`` (NCCL/RCCL and the custom all-reduce kernels), and the rest: ``moe`` (routing),
``sampling``, ``elementwise`` (norms, activations, rope, quant, reductions) and ``other``.
The ``kind`` of a GPU activity (memcpy/memset) wins over its name. Every row is exercised by
tests/test_buckets.py on the real kernel names of every trace in shared/traces.
"""

from __future__ import annotations

import re
from functools import lru_cache

BUCKETS = ("copy", "gemm", "attention", "communication", "moe", "sampling", "elementwise", "other")

# (bucket, sub-bucket, regex searched in the raw kernel name, case-insensitive)
TABLE: tuple[tuple[str, str, str], ...] = (
    # leaf CPU ops, for traces with no GPU kernels (analysed on their CPU ops, e.g. a CPU server);
    # anchored on op names (`aten::mm`), which no GPU kernel name matches
    ("copy", "copy", r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack)$"),
    ("copy", "gather", r"^aten::(index|index_select|gather|take|embedding|index_put_?)$"),
    ("copy", "fill", r"^aten::(fill_|zero_|zeros|empty|empty_strided|empty_like|full)$"),
    ("gemm", "gemm", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|einsum)$"),
    ("attention", "attention", r"^aten::_?scaled_dot_product|^aten::_flash_attention"),
    ("sampling", "sampling", r"^aten::(sort|topk|argmax|multinomial|argsort)$"),
    ("communication", "cpu", r"^(c10d|gloo|nccl):|^record_param_comms$"),
    ("elementwise", "cpu-op", r"^aten::"),
    # communication: NCCL/RCCL first (the "nccl" sub-bucket is what the all-reduce rule reads)
    ("communication", "nccl", r"^ncclDevKernel|^ncclKernel|\bnccl|^rccl|msccl"),
    ("communication", "custom", r"cross_device_reduce|multimem_all_reduce|allreduce_fusion|"
                                r"one_?shot_?all_?reduce|two_?shot_?all_?reduce|custom_?all_?reduce|"
                                r"quick_?reduce|lamport|all_?reduce|all_?gather|reduce_?scatter|"
                                r"all_?to_?all|deep_?ep|nvshmem|mooncake|symm_mem"),
    # inductor fusions are named after every op they fused: a fused norm is a norm, not a cast
    ("elementwise", "norm", r"^triton_\w*fused\w*(norm|rsqrt)"),
    ("moe", "routing", r"_combined_routing|_topk_forward|_sum_bitmatrix|topk_softmax|grouped_topk|"
                       r"moe_align|moe_sum|count_and_sort|ep_scatter|ep_gather|moe_route|"
                       r"biased_grouped|topkGating|expert_offsets|moe_permute|moe_unpermute|shuffle_rows"),
    # copy: the FP8 KV cast is a direct_copy with LoadWithCast; keep casts apart from plain copies
    ("copy", "cast", r"direct_copy_kernel.*LoadWithCast|_to_copy|to_copy_kernel|"
                     r"direct_copy_kernel_cuda.*\{lambda\(c10::\w+\)"),
    ("copy", "copy", r"direct_copy_kernel|CatArrayBatchedCopy|copy_kernel|Copy<|recat_copy|"
                     r"batched_transpose|transpose_kernel|^copy|_copy_|memcpy"),
    ("copy", "kv-write", r"store_kvcache|reshape_and_cache|set_mla_kv_buffer|concat_and_cache|"
                         r"set_kv_buffer|write_req_to_token|cache_kernel"),
    ("copy", "gather", r"index_select|indexSelect|gather_kernel|scatter_kernel|index_put|"
                       r"index_elementwise|vectorized_gather|index_kernel|embedding"),
    ("copy", "fill", r"FillFunctor|fill_kernel|memset|zero_"),
    # attention
    ("attention", "attention", r"attention|attn|fmha|flash|\bmha|_mla|mla::|BatchMLA|BatchPrefill|"
                               r"BatchDecode|MergeState|merge_state|paged_|decode_kernel|"
                               r"_fwd_kernel|sdpa|xformers|softmax_kernel_causal|cutlass_.*fmha"),
    # the expert GEMMs of MoE layers (routing is above)
    ("gemm", "moe", r"fused_moe|moe_gemm|grouped_gemm|_matmul_ogs|cutlass_moe|MoeFCGemm"),
    # sampling
    ("sampling", "sampling", r"RadixSort|radix_sort|radixSort|sort_kernel|bitonicSort|segmented_sort|"
                             r"gatherTopK|sbtopk|topk_kernel|top_?k_?top_?p|TopPRenorm|TopKRenorm|"
                             r"SamplingFromProb|sampling|multinomial|argmax|exponential_|"
                             r"min_p|TopKMask"),
    # GEMM (incl. cuBLAS split-K reductions and epilogues, hipBLASLt Cijk_, DeepGEMM, triton mm)
    ("gemm", "block-fp8-triton", r"_w8a8_block_fp8_matmul"),
    ("gemm", "gemm", r"gemm|gemv|nvjet|cublas|Cijk_|xmma|cutlass|sgemm|hgemm|matmul|splitKreduce|"
                     r"\bmm_|_mm_|bmm|wvSplitK|deep_gemm|fp8_gemm|scaled_mm|triton_tem_|"
                     r"epilogue::impl|dot_|Kernel2<|igemm|conv"),
    # elementwise: norms, activations, rope, quantisation, reductions, inductor fusions
    ("elementwise", "norm", r"norm|rms|layer_?norm|Welford|GammaBeta|RowwiseMoments"),
    ("elementwise", "activation", r"silu|gelu|act_and_mul|activation|swiglu|sigmoid|tanh|relu"),
    ("elementwise", "rope", r"rotary|rope"),
    ("elementwise", "quant", r"quant|fp8|hfp8|per_token_group"),
    ("elementwise", "elementwise", r"elementwise|Functor|reduce_kernel|triton_poi|triton_red|"
                                   r"triton_per|multi_tensor_apply|cub::|DeviceScan|DeviceReduce|"
                                   r"arange|cumsum|softmax|where|clamp|_kernel_with_index"),
)

_COMPILED = tuple((b, s, re.compile(rx, re.I)) for b, s, rx in TABLE)
_KIND_BUCKET = {"memcpy": ("copy", "memcpy"), "memset": ("copy", "memset")}


@lru_cache(maxsize=65536)
def classify(name: str, kind: str = "kernel") -> tuple[str, str]:
    """(bucket, sub-bucket) of a GPU activity by its name and kind."""
    if kind in _KIND_BUCKET:
        return _KIND_BUCKET[kind]
    if name.startswith(("Memcpy", "Memset", "hipMemcpy", "hipMemset")):
        return ("copy", "memset" if "emset" in name else "memcpy")
    for bucket, sub, rx in _COMPILED:
        if rx.search(name):
            return bucket, sub
    return "other", "other"
