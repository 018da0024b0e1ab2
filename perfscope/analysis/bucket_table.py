"""The bucket table perfscope.analysis.buckets classifies GPU kernels (and the leaf CPU ops of a trace
without kernels) by: one row per family of kernels, first match wins. ``perfscope rules --markdown``
lists the rows; tests/test_buckets.py exercises each on real kernel names."""

from __future__ import annotations

# (bucket, sub-bucket, regex searched in the kernel name without its parameter list (case-insensitive),
#  whose kernels the row covers: engine / library and API). First match wins, so the rows that must
#  beat a broader pattern further down (FlashInfer's non-attention kernels before `flash`, Triton
#  norm/rotary kernels before the `_fwd_kernel` of Triton attention) come first.
TABLE: tuple[tuple[str, str, str, str], ...] = (
    # leaf CPU ops, for traces with no GPU kernels (analysed on their CPU ops, e.g. a CPU server);
    # anchored on op names (`aten::mm`), which no GPU kernel name matches
    ("copy", "copy", r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack)$", "CPU-only traces: torch copy ops"),
    (
        "copy",
        "scatter",
        r"^aten::(index_put_?|scatter_?|scatter_add_?|_index_put_impl_)$",
        "CPU-only traces: torch scatters",
    ),
    ("copy", "gather", r"^aten::(index|index_select|gather|take|embedding)$", "CPU-only traces: torch gathers"),
    (
        "copy",
        "fill",
        r"^aten::(fill_|zero_|zeros|empty|empty_strided|empty_like|full)$",
        "CPU-only traces: torch fills",
    ),
    (
        "gemm",
        "gemm",
        r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|einsum)$",
        "CPU-only traces: torch matmuls",
    ),
    ("attention", "attention", r"^aten::_?scaled_dot_product|^aten::_flash_attention", "CPU-only traces: torch SDPA"),
    ("sampling", "sampling", r"^aten::(sort|topk|argmax|multinomial|argsort)$", "CPU-only traces: torch sampling ops"),
    ("communication", "cpu", r"^(c10d|gloo|nccl):|^record_param_comms$", "CPU-only traces: torch.distributed (gloo)"),
    ("elementwise", "cpu-op", r"^aten::", "CPU-only traces: every other torch op"),
    # vLLM's CPU ops (real vLLM 0.32 on CPU, tests/test_real_vllm.py): its packed-weight GEMM, its
    # attention and KV-cache write, and torch.compile's graph call (self time = its fused C++ code)
    (
        "gemm",
        "gemm",
        r"^_C::(weight_packed_linear|onednn_mm|onednn_scaled_mm|\w*gemm\w*)$",
        "CPU-only traces: vLLM CPU GEMMs",
    ),
    (
        "attention",
        "attention",
        r"^_C::\w*attention\w*$|^vllm::unified_attention",
        "CPU-only traces: vLLM CPU attention",
    ),
    (
        "copy",
        "kv-write",
        r"^vllm::unified_kv_cache_update$|^_C::\w*reshape_and_cache\w*$",
        "CPU-only traces: vLLM KV-cache writes",
    ),
    ("elementwise", "inductor", r"^## Call CompiledFxGraph", "CPU-only traces: torch.compile graphs (vLLM)"),
    # communication: NCCL/RCCL first (the "nccl" sub-bucket is what the all-reduce rule reads)
    (
        "communication",
        "nccl",
        r"^ncclDevKernel|^ncclKernel|\bnccl|^rccl|msccl",
        "NCCL / RCCL / MSCCL collectives (every engine)",
    ),
    (
        "communication",
        "custom",
        r"cross_device_reduce|multimem_all_reduce|allreduce_fusion|"
        r"one_?shot_?all_?reduce|two_?shot_?all_?reduce|custom_?all_?reduce|"
        r"quick_?reduce|lamport|all_?reduce|all_?gather|reduce_?scatter|"
        r"all_?to_?all|deep_?ep|nvshmem|mooncake|symm_mem",
        "SGLang/vLLM custom all-reduce (cross_device_reduce, one/two-shot, quick reduce), FlashInfer/TRT-LLM "
        "allreduce_fusion and lamport, torch symmetric memory (multimem), DeepEP (`deep_ep::`), NVSHMEM, Mooncake",
    ),
    (
        "communication",
        "ep",
        r"dpsk::ep::|\bep::(internode|intranode|internode_ll)::",
        "DeepSeek's internal DeepEP build (`dpsk::ep::internode::{dispatch,combine,notify_dispatch,...}`, "
        "`ep::intranode::`): MoE expert-parallel dispatch/combine",
    ),
    # cuDNN's SDPA engines are named like its convolutions (`..._flash_fprop_...`): attention, before conv
    (
        "attention",
        "attention",
        r"cudnn\w*_sdpa_|native_sdpa|flash_[fb]prop|cudnn::fusion::lean_reduction",
        "torch-native models on cuDNN SDPA (torch `SDPBackend.CUDNN_ATTENTION`: HF transformers, diffusers; not "
        "SGLang/vLLM's own attention backends), seen with cuDNN 9.19 on an H200: "
        "`cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_*` (decode), `..._sm90_flash_fprop_wgmma_*` "
        "(prefill) and the split-KV combine `cudnn::fusion::lean_reduction_kernel` (decode, batch <= 8)",
    ),
    # convolutions (cuDNN, MIOpen, CUTLASS implicit GEMM) are GEMM-like work; cuDNN batch norm is a norm
    (
        "gemm",
        "conv",
        r"scudnn|hcudnn|xmma_(fprop|dgrad|wgrad)|implicit_?gemm|dgrad_engine|wgrad_alg\d|"
        r"winograd|cudnn::cnn::|implicit_convolve|convolve_|fprop_|dgrad2d|wgrad2d|"
        r"kernel_grouped_conv|igemm_(fwd|bwd|wrw)|conv\d?d_",
        "cuDNN / MIOpen / CUTLASS convolutions (`cudnn_infer_volta_scudnn_*`, `sm80_xmma_fprop_*`, winograd, "
        "dgrad/wgrad engines): torchvision, diffusion (xDiT) and other non-LLM models",
    ),
    (
        "elementwise",
        "norm",
        r"cudnn::bn_|bn_fw_|bn_bw_|batch_?norm",
        "cuDNN / torch batch norm (training and CNN inference)",
    ),
    # inductor fusions are named after every op they fused: a fused norm is a norm, not a cast, and
    # a pointwise fusion around SDPA (`triton_poi_fused__scaled_dot_product_flash_attention_cat..`)
    # is not attention; Triton templates (`triton_tem_`) are GEMMs, caught below
    (
        "elementwise",
        "norm",
        r"^triton_\w*fused\w*(norm|rsqrt)",
        "torch.compile (inductor) fused norms: vLLM (compiles by default), SGLang --enable-torch-compile, xDiT",
    ),
    (
        "elementwise",
        "activation",
        r"^triton_(poi|red|per)_\w*(silu|gelu|swiglu|sigmoid|tanh|relu)",
        "torch.compile (inductor) fused activations: vLLM, SGLang --enable-torch-compile, xDiT",
    ),
    (
        "copy",
        "cast",
        r"^triton_poi_fused__to_copy",
        "torch.compile (inductor) dtype casts: vLLM, SGLang --enable-torch-compile, xDiT",
    ),
    (
        "elementwise",
        "inductor",
        r"^triton_(poi|red|per)_|^triton__\d",
        "torch.compile (inductor) pointwise/reductions: vLLM, SGLang --enable-torch-compile, xDiT, training",
    ),
    # SGLang / vLLM batch bookkeeping: positions, future-token ids (overlap scheduler), page indices
    (
        "elementwise",
        "metadata",
        r"resolve_future_token_ids|compute_position|clamp_position|"
        r"create_\w*kv_indices|_copy_page_indices|req_to_token",
        "SGLang / vLLM batch bookkeeping Triton kernels (positions, future token ids, KV indices)",
    ),
    # FlashInfer's kernels that are not attention (they would match `flash` below), and the Triton
    # norm / rotary kernels that would match the `_fwd_kernel` of Triton attention
    (
        "elementwise",
        "norm",
        r"flashinfer::norm::|RMSNormKernel|LayerNormKernel|layer_norm::|ln_fwd_kernel|"
        r"ln_bwd_kernel|_rms_?norm\w*_kernel|_layer_?norm\w*_kernel|_norm_fwd\w*kernel",
        "SGLang/vLLM on CUDA: FlashInfer `rmsnorm` / `fused_add_rmsnorm` / `gemma_*` (`flashinfer::norm::*`), "
        "TransformerEngine/apex `layer_norm::ln_fwd_kernel`, Triton `_rms_norm_fwd_kernel`, `_layer_norm_fwd*`",
    ),
    (
        "elementwise",
        "activation",
        r"flashinfer::activation::|act_and_mul_kernel",
        "SGLang/vLLM on CUDA: FlashInfer / sgl-kernel `silu_and_mul`, `gelu_and_mul` (`act_and_mul_kernel`)",
    ),
    (
        "elementwise",
        "rope",
        r"flashinfer::\w*(Rotary|Rope|Llama31)|BatchQKApplyRotary|_rotary\w*_kernel|"
        r"rotary_embedding|apply_rope|rope_quantize",
        "SGLang/vLLM on CUDA: FlashInfer `apply_rope*` / `apply_rope_with_cos_sin_cache_inplace` "
        "(`BatchQKApplyRotary*`), Triton `_rotary_fwd_kernel`, vLLM `rotary_embedding_kernel`",
    ),
    (
        "sampling",
        "sampling",
        r"flashinfer::sampling::",
        "SGLang/vLLM on CUDA: FlashInfer sampling (`*SamplingFromProbKernel`, `TopKTopPSamplingFromProbKernel`, "
        "renorm, `OnlineSoftmax*` of `flashinfer.sampling.softmax`)",
    ),
    (
        "copy",
        "kv-write",
        r"flashinfer::AppendPagedKVCache|AppendPagedKVMlaCache|append_paged_\w*kv",
        "SGLang/vLLM on CUDA: FlashInfer `append_paged_kv_cache` / `append_paged_mla_kv_cache`",
    ),
    # perfscope's own `fp8-kv-cast --strategy pages` kernels: an FP8 -> BF16 cast of the referenced pages
    ("copy", "cast", r"_perfscope_fp8kv_\w*kernel", "perfscope's `fp8-kv-cast` pages fix (Triton page/row cast)"),
    # the MoE layer: routing / align / dispatch, the expert GEMMs (moe/gemm, further down), combine
    (
        "moe",
        "combine",
        r"moe_sum",
        "SGLang/vLLM fused-MoE combine (`moe_sum_reduce`, `moe_sum` over the top-k outputs)",
    ),
    (
        "moe",
        "routing",
        r"_combined_routing|_topk_forward|_sum_bitmatrix|topk_softmax|grouped_topk|"
        r"moe_align|count_and_sort|ep_scatter|ep_gather|moe_route|"
        r"biased_grouped|topkGating|expert_offsets|moe_permute|moe_unpermute|shuffle_rows|"
        r"moe::dev::routing",
        "SGLang/vLLM fused-MoE routing (topk_softmax, grouped_topk, moe_align), Triton-kernels bitmatrix routing, "
        "TRT-LLM-gen `moe::dev::routing`",
    ),
    (
        "moe",
        "combine",
        r"moe::dev::finalize|_finalize_matmul_scatter|moe_finalize|finalizeMoeRouting",
        "vLLM MoE combine: TRT-LLM-gen `moe::dev::finalize` (B200), Triton-kernels `_finalize_matmul_scatter` (gpt-oss)",
    ),
    # DeepSeek's internal training kernels (deepseek-ai/profile-data train.json, DualPipe EP64): their
    # roles read from their names and the MoE layer around them (no source is public)
    (
        "moe",
        "routing",
        r"^(void )?cuda::(expand_to_fused_with_scales|get_fused_mapping|clean_and_count_expert|"
        r"topk_sum_and_topk_idx|unique_group_indices)",
        "DeepSeek's internal MoE routing (`cuda::get_fused_mapping`, `clean_and_count_expert`, "
        "`expand_to_fused_with_scales_impl`, `topk_sum_and_topk_idx`; profile-data train.json)",
    ),
    (
        "moe",
        "combine",
        r"^(void )?cuda::reduce_fused_impl",
        "DeepSeek's internal MoE combine (`cuda::reduce_fused_impl`: the expert outputs summed back per token)",
    ),
    (
        "elementwise",
        "quant",
        r"^(void )?cuda::per_(channel|token)\w*cast",
        "DeepSeek's internal FP8 casts (`cuda::per_channel_cast_and_transpose`, `per_token_cast_back_*`)",
    ),
    # copy: the FP8 KV cast is a direct_copy with LoadWithCast; keep casts apart from plain copies.
    # `gpu_kernel_impl_nocast` copies keep the dtype (a .contiguous()), so they are plain copies; a
    # strided copy that converts is `..manual_unroll<.., gpu_kernel_impl<direct_copy..` (the traces'
    # CPU ops show int<->long there); `bfloat16_copy_kernel_cuda` & co. are torch's dedicated casts
    (
        "copy",
        "cast",
        r"direct_copy_kernel.*LoadWithCast|_to_copy|to_copy_kernel|"
        r"manual_unroll<\d+, \d+, at::native::gpu_kernel_impl<at::native::direct_copy|"
        r"float\w*_copy_kernel_cuda|float8_copy",
        "torch dtype casts (`.to(dtype)`, every engine)",
    ),
    (
        "copy",
        "copy",
        r"direct_copy_kernel|CatArrayBatchedCopy|copy_kernel|Copy<|recat_copy|"
        r"batched_transpose|transpose_kernel|^copy|_copy_|memcpy|CopyFunctor|permute_\w*kernel",
        "torch copies / cat / transposes (every engine)",
    ),
    (
        "copy",
        "kv-write",
        r"store_kvcache|reshape_and_cache|set_mla_kv_buffer|concat_and_cache|"
        r"set_kv_buffer|cache_kernel",
        "SGLang `store_kvcache` / `set_mla_kv_buffer`, vLLM `reshape_and_cache*` / `concat_and_cache_mla`",
    ),
    # scatters write into a tensor (the KV write of `pool[loc] = kv` is an index_put): not gathers
    (
        "copy",
        "scatter",
        r"scatter_kernel|index_put|indexFuncLarge\w*ReduceAdd|scatter_add",
        "torch scatters / index_put (every engine; SGLang/vLLM torch-native KV writes `pool[loc] = kv`)",
    ),
    (
        "copy",
        "gather",
        r"index_select|indexSelect|indexFunc|gather_kernel|"
        r"index_elementwise|vectorized_gather|index_kernel|(?<!rotary_)embedding",
        "torch gathers / index_select / embedding lookups (every engine)",
    ),
    ("copy", "fill", r"FillFunctor|fill_kernel|memset|zero_", "torch fills / zeroing (every engine)"),
    # attention (vLLM's split-KV Triton attention ends in `reduce_segments`; cuDNN SDPA's engines and
    # its `lean_reduction_kernel` are caught above the conv rows); `flash` but not `flashinfer::` (caught above)
    (
        "attention",
        "attention",
        r"attention|attn|fmha|flash(?!infer::)|\bmha|_mla|mla::|BatchMLA|BatchPrefill|"
        r"BatchDecode|SinglePrefill|SingleDecode|BatchPOD|MergeState|merge_state|paged_|"
        r"decode_kernel|reduce_segments|lean_reduction|_fwd_kernel|sdpa|xformers|"
        r"softmax_kernel_causal|cutlass_.*fmha",
        "FlashInfer (MLA, prefill/decode/POD, merge states), FlashAttention 2/3 (`flash_fwd*`, sgl-kernel fa3), "
        "TRT-LLM-gen fmha, SGLang/vLLM Triton attention (`_fwd_kernel*`, `reduce_segments`), cuDNN SDPA "
        "not caught above, CK/aiter attention (`attn_fwd`), xformers",
    ),
    # the expert GEMMs of MoE layers (routing is above; TRT-LLM-gen batched GEMMs over experts: `bmm_..dynBatch`)
    (
        "moe",
        "gemm",
        r"fused_moe|moe_gemm|grouped_gemm|_matmul_ogs|cutlass_moe|MoeFCGemm|^bmm_\w*dynBatch",
        "SGLang/vLLM Triton `fused_moe_kernel`, CUTLASS / TRT-LLM MoE GEMMs, Triton-kernels `_matmul_ogs`",
    ),
    # sampling
    (
        "sampling",
        "sampling",
        r"RadixSort|radix_sort|radixSort|sort_kernel|bitonicSort|segmented_sort|"
        r"sort_postprocess|fill_index_and_segment|gatherTopK|sbtopk|mbtopk::|topk_kernel|top_?k_?top_?p|TopPRenorm|TopKRenorm|"
        r"SamplingFromProb|sampling|multinomial|argmax|exponential_|"
        r"min_p|TopKMask",
        "torch-native sampling (cub radix sort of `torch.sort`, `torch.topk`'s mbtopk/sbtopk, argmax, "
        "multinomial), sgl-kernel / vLLM top-k/top-p kernels",
    ),
    # GEMM (incl. cuBLAS split-K reductions and epilogues, hipBLASLt Cijk_, DeepGEMM, triton mm,
    # convolutions); fbgemm_gpu's embedding/quant helpers are not GEMMs ("fbgemm" is excluded)
    (
        "gemm",
        "block-fp8-triton",
        r"_w8a8_block_fp8_matmul",
        "SGLang/vLLM Triton block-FP8 GEMM (`_w8a8_block_fp8_matmul`)",
    ),
    (
        "gemm",
        "gemm",
        r"(?<!fb)gemm|gemv|nvjet|cublas|Cijk_|xmma|cutlass|sgemm|hgemm|matmul|splitKreduce|"
        r"\bmm_|_mm_|bmm|wvSplitK|deep_gemm|fp8_gemm|scaled_mm|triton_tem_|"
        r"epilogue::impl|dot_|Kernel2<|igemm|conv(?!ert)|im2(d2)?col|scal_kernel",
        "cuBLAS/cuBLASLt (`nvjet_*`, `sm90_xmma_gemm_*`, split-K reduce), hipBLASLt (`Cijk_*`), CUTLASS, "
        "DeepGEMM, vLLM skinny GEMMs (`wvSplitK`), Triton matmuls and inductor templates",
    ),
    # elementwise: norms, activations, rope, quantisation, reductions, scans, torch pointwise
    (
        "elementwise",
        "norm",
        r"norm(?!al)|rms|layer_?norm|Welford|GammaBeta|RowwiseMoments",
        "torch / vLLM / sgl-kernel norms (`rms_norm_kernel`, `fused_add_rms_norm_kernel`, torch layer_norm)",
    ),
    (
        "elementwise",
        "activation",
        r"silu|gelu|act_and_mul|activation|swiglu|sigmoid|tanh|relu",
        "torch / vLLM / sgl-kernel activations",
    ),
    ("elementwise", "rope", r"rotary|rope", "torch / vLLM / aiter rotary embeddings"),
    (
        "elementwise",
        "quant",
        r"quant|fp8|hfp8|per_token_group",
        "SGLang/vLLM activation quantisation (sgl-kernel `per_token_group_quant_8bit`, vLLM `scaled_fp8_quant`, TRT-LLM `quantize_with_block_size`)",
    ),
    (
        "elementwise",
        "elementwise",
        r"elementwise|Functor|reduce_kernel|multi_tensor_apply|cub::|rocprim::|"
        r"DeviceScan|DeviceReduce|arange|cumsum|softmax|scan_innermost|"
        r"scan_outer|where|clamp|_kernel_with_index|searchsorted|upsample|SubTensorOp|"
        r"_assert_async|distribution_elementwise|pool\w*_(forward|backward)|"
        r"max_pool|avg_pool",
        "torch pointwise / reductions / scans / softmax / pooling (every engine), ROCm rocprim",
    ),
)
