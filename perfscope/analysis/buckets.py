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

# (bucket, sub-bucket, regex searched in the kernel name without its parameter list, case-insensitive)
TABLE: tuple[tuple[str, str, str], ...] = (
    # leaf CPU ops, for traces with no GPU kernels (analysed on their CPU ops, e.g. a CPU server);
    # anchored on op names (`aten::mm`), which no GPU kernel name matches
    ("copy", "copy", r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack)$"),
    ("copy", "scatter", r"^aten::(index_put_?|scatter_?|scatter_add_?|_index_put_impl_)$"),
    ("copy", "gather", r"^aten::(index|index_select|gather|take|embedding)$"),
    ("copy", "fill", r"^aten::(fill_|zero_|zeros|empty|empty_strided|empty_like|full)$"),
    ("gemm", "gemm", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|einsum)$"),
    ("attention", "attention", r"^aten::_?scaled_dot_product|^aten::_flash_attention"),
    ("sampling", "sampling", r"^aten::(sort|topk|argmax|multinomial|argsort)$"),
    ("communication", "cpu", r"^(c10d|gloo|nccl):|^record_param_comms$"),
    ("elementwise", "cpu-op", r"^aten::"),
    # vLLM's CPU ops (real vLLM 0.32 on CPU, tests/test_real_vllm.py): its packed-weight GEMM, its
    # attention and KV-cache write, and torch.compile's graph call (self time = its fused C++ code)
    ("gemm", "gemm", r"^_C::(weight_packed_linear|onednn_mm|onednn_scaled_mm|\w*gemm\w*)$"),
    ("attention", "attention", r"^_C::\w*attention\w*$|^vllm::unified_attention"),
    ("copy", "kv-write", r"^vllm::unified_kv_cache_update$|^_C::\w*reshape_and_cache\w*$"),
    ("elementwise", "inductor", r"^## Call CompiledFxGraph"),
    # communication: NCCL/RCCL first (the "nccl" sub-bucket is what the all-reduce rule reads)
    ("communication", "nccl", r"^ncclDevKernel|^ncclKernel|\bnccl|^rccl|msccl"),
    ("communication", "custom", r"cross_device_reduce|multimem_all_reduce|allreduce_fusion|"
                                r"one_?shot_?all_?reduce|two_?shot_?all_?reduce|custom_?all_?reduce|"
                                r"quick_?reduce|lamport|all_?reduce|all_?gather|reduce_?scatter|"
                                r"all_?to_?all|deep_?ep|nvshmem|mooncake|symm_mem"),
    # inductor fusions are named after every op they fused: a fused norm is a norm, not a cast, and
    # a pointwise fusion around SDPA (`triton_poi_fused__scaled_dot_product_flash_attention_cat..`)
    # is not attention; Triton templates (`triton_tem_`) are GEMMs, caught below
    ("elementwise", "norm", r"^triton_\w*fused\w*(norm|rsqrt)"),
    ("elementwise", "activation", r"^triton_(poi|red|per)_\w*(silu|gelu|swiglu|sigmoid|tanh|relu)"),
    ("copy", "cast", r"^triton_poi_fused__to_copy"),
    ("elementwise", "inductor", r"^triton_(poi|red|per)_|^triton__\d"),
    # SGLang / vLLM batch bookkeeping: positions, future-token ids (overlap scheduler), page indices
    ("elementwise", "metadata", r"resolve_future_token_ids|compute_position|clamp_position|"
                                r"create_\w*kv_indices|_copy_page_indices|req_to_token"),
    # MoE routing / dispatch / combine (the expert GEMMs are under gemm/moe)
    ("moe", "routing", r"_combined_routing|_topk_forward|_sum_bitmatrix|topk_softmax|grouped_topk|"
                       r"moe_align|moe_sum|count_and_sort|ep_scatter|ep_gather|moe_route|"
                       r"biased_grouped|topkGating|expert_offsets|moe_permute|moe_unpermute|shuffle_rows|"
                       r"moe::dev::routing"),
    ("moe", "combine", r"moe::dev::finalize|_finalize_matmul_scatter|moe_finalize|finalizeMoeRouting"),
    # copy: the FP8 KV cast is a direct_copy with LoadWithCast; keep casts apart from plain copies.
    # `gpu_kernel_impl_nocast` copies keep the dtype (a .contiguous()), so they are plain copies; a
    # strided copy that converts is `..manual_unroll<.., gpu_kernel_impl<direct_copy..` (the traces'
    # CPU ops show int<->long there); `bfloat16_copy_kernel_cuda` & co. are torch's dedicated casts
    ("copy", "cast", r"direct_copy_kernel.*LoadWithCast|_to_copy|to_copy_kernel|"
                     r"manual_unroll<\d+, \d+, at::native::gpu_kernel_impl<at::native::direct_copy|"
                     r"float\w*_copy_kernel_cuda|float8_copy"),
    ("copy", "copy", r"direct_copy_kernel|CatArrayBatchedCopy|copy_kernel|Copy<|recat_copy|"
                     r"batched_transpose|transpose_kernel|^copy|_copy_|memcpy|CopyFunctor|permute_\w*kernel"),
    ("copy", "kv-write", r"store_kvcache|reshape_and_cache|set_mla_kv_buffer|concat_and_cache|"
                         r"set_kv_buffer|cache_kernel"),
    # scatters write into a tensor (the KV write of `pool[loc] = kv` is an index_put): not gathers
    ("copy", "scatter", r"scatter_kernel|index_put|indexFuncLarge\w*ReduceAdd|scatter_add"),
    ("copy", "gather", r"index_select|indexSelect|indexFunc|gather_kernel|"
                       r"index_elementwise|vectorized_gather|index_kernel|(?<!rotary_)embedding"),
    ("copy", "fill", r"FillFunctor|fill_kernel|memset|zero_"),
    # attention (vLLM's split-KV Triton attention ends in `reduce_segments`)
    ("attention", "attention", r"attention|attn|fmha|flash|\bmha|_mla|mla::|BatchMLA|BatchPrefill|"
                               r"BatchDecode|MergeState|merge_state|paged_|decode_kernel|reduce_segments|"
                               r"_fwd_kernel|sdpa|xformers|softmax_kernel_causal|cutlass_.*fmha"),
    # the expert GEMMs of MoE layers (routing is above; TRT-LLM-gen batched GEMMs over experts: `bmm_..dynBatch`)
    ("gemm", "moe", r"fused_moe|moe_gemm|grouped_gemm|_matmul_ogs|cutlass_moe|MoeFCGemm|^bmm_\w*dynBatch"),
    # sampling
    ("sampling", "sampling", r"RadixSort|radix_sort|radixSort|sort_kernel|bitonicSort|segmented_sort|"
                             r"gatherTopK|sbtopk|topk_kernel|top_?k_?top_?p|TopPRenorm|TopKRenorm|"
                             r"SamplingFromProb|sampling|multinomial|argmax|exponential_|"
                             r"min_p|TopKMask"),
    # GEMM (incl. cuBLAS split-K reductions and epilogues, hipBLASLt Cijk_, DeepGEMM, triton mm,
    # convolutions); fbgemm_gpu's embedding/quant helpers are not GEMMs ("fbgemm" is excluded)
    ("gemm", "block-fp8-triton", r"_w8a8_block_fp8_matmul"),
    ("gemm", "gemm", r"(?<!fb)gemm|gemv|nvjet|cublas|Cijk_|xmma|cutlass|sgemm|hgemm|matmul|splitKreduce|"
                     r"\bmm_|_mm_|bmm|wvSplitK|deep_gemm|fp8_gemm|scaled_mm|triton_tem_|"
                     r"epilogue::impl|dot_|Kernel2<|igemm|conv(?!ert)|im2(d2)?col|scal_kernel"),
    # elementwise: norms, activations, rope, quantisation, reductions, scans, torch pointwise
    ("elementwise", "norm", r"norm(?!al)|rms|layer_?norm|Welford|GammaBeta|RowwiseMoments"),
    ("elementwise", "activation", r"silu|gelu|act_and_mul|activation|swiglu|sigmoid|tanh|relu"),
    ("elementwise", "rope", r"rotary|rope"),
    ("elementwise", "quant", r"quant|fp8|hfp8|per_token_group"),
    ("elementwise", "elementwise", r"elementwise|Functor|reduce_kernel|multi_tensor_apply|cub::|rocprim::|"
                                   r"DeviceScan|DeviceReduce|arange|cumsum|softmax|where|clamp|"
                                   r"_kernel_with_index|searchsorted|upsample|SubTensorOp"),
)

_COMPILED = tuple((b, s, re.compile(rx, re.I)) for b, s, rx in TABLE)
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
