"""The bucket table on the real kernel names of every trace in tests/traces/corpus (NVIDIA and AMD).

Each expectation names a kernel that really occurs in a shared trace (the test fails if the name
is no longer found there, so the table is never tested on invented names), and the bucket it must
land in. The coverage test asserts that "other" stays a small share of kernel time per trace.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from paths import GPU_LOOP, H200, HTA, KERNEL_MIX, REPO, TRACELENS, TRACES, raw_json
from perfscope.analysis.buckets import BUCKETS, TABLE, classify, without_params
from realtraces import real_diagnosis, real_trace

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

SKIP = ("mla_pool_eager_120steps", "benchmark_simple_add_et", "908_results")  # a duplicate of a smaller file; not Kineto (x2)
DEEPSEEK_TRAIN = REPO / "tests/traces/deepseek-profile-data/train.json.gz"  # DeepSeek's H800 DualPipe trace
ALL = sorted(p for p in list(TRACES.rglob("*.json.xz")) + list(KERNEL_MIX.glob("*.json.xz")) + [DEEPSEEK_TRAIN]
             if not any(s in p.name for s in SKIP))

# Inference traces (and the inference-like public ones): "other" must stay below this share of kernel time
OTHER_MAX_SHARE = 0.01


@lru_cache(maxsize=None)
def names_of(path: Path) -> dict[tuple[str, str], float]:
    """{(kernel name, kind): summed duration in us} of one trace."""
    out: Counter = Counter()
    for k in real_trace(path).kernels:
        out[(k.name, k.kind)] += k.dur
    return dict(out)


def find(path: Path, pattern: str) -> list[tuple[str, str]]:
    rx = re.compile(pattern)
    hits = [nk for nk in names_of(path) if rx.search(nk[0])]
    assert hits, f"no kernel matching {pattern!r} in {path.name}: the expectation is stale"
    return hits


SGL_DECODE = TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz"
SGL_PD = TRACELENS / "inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.xz"
VLLM_FULL = TRACELENS / "inference/vllm_decode_full/graph_execution.json.xz"
VLLM_PIECE = TRACELENS / "inference/vllm_prefilldecode_piecewise/graph_execution.json.xz"
B200 = TRACELENS / "b200/eager_trace.json.xz"
H100 = TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"
MI300 = TRACELENS / "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"
XDIT = TRACELENS / "inference/xdit_sd_3.5/profile_trace_rank_0.json.xz"
V100 = HTA / "df_index_resolver/df_index_resolver.json.xz"
MI250 = HTA / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.xz"
A100 = HTA / "negative_queue_length_values_check/rank0.json.xz"
CONTROL = HTA / "trace_diff/control/control.json.xz"
SAMPLED = HTA / "trace_filter/sampled_rank-0.json.xz"
CONV = HTA / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.xz"  # V100 cuDNN CNN training
FI_EAGER = KERNEL_MIX / "fi_decode_eager.json.gz"  # FlashInfer 0.6.18 on an H200 (make_traces.py)
FI_GRAPH = KERNEL_MIX / "fi_decode_graph.json.gz"
TORCH_TOPP = KERNEL_MIX / "sample_topp.json.gz"
TORCH_TOPK = KERNEL_MIX / "sample_topk.json.gz"
TRITON_NORM = KERNEL_MIX / "triton_norm_rope_eager.json.gz"
SDPA_CUDNN = KERNEL_MIX / "sdpa_cudnn.json.gz"  # torch SDPA on cuDNN, H200 (make_sdpa_traces.py)
# real SGLang 0.5.x on an H200 (FlashInfer MLA backend, FP8 KV), traced by perfscope (h15, 2026-12-01)
SGL_H200 = next(iter(sorted((GPU_LOOP / "h200-2026-12-01-sglang/pool495000/runs/495000-bug/traces").glob(
    "*DECODE*.json.xz"))))
PAGES_FIX = next(iter(sorted((GPU_LOOP / "h200-2026-11-29/runs/pages/traces").glob("*DECODE*.json.xz"))))

# (trace, regex on the real kernel name, expected "bucket/sub" or "bucket")
EXPECT = [
    # the FP8 KV cast and its fix's kernels
    (H200 / "mla_pool_eager.json.xz", r"direct_copy_kernel_cuda.*LoadWithCast", "copy/cast"),
    (H200 / "mla_pool_graph.json.xz", r"direct_copy_kernel_cuda.*LoadWithCast", "copy/cast"),
    (H200 / "mla_pages_graph.json.xz", r"vectorized_gather_kernel", "copy/gather"),
    # attention, NVIDIA and AMD
    (H200 / "mla_fp8_graph.json.xz", r"flashinfer::mla::BatchMLAPagedAttentionKernel", "attention"),
    (SGL_PD, r"^_ZN7ck_tile.*Fmha", "attention"),
    (SGL_DECODE, r"paged_attention_ll4mi_QKV_mfma16_kernel", "attention"),
    (SGL_DECODE, r"paged_attention_ll4mi_reduce_kernel", "attention"),
    (XDIT, r"^attn_fwd$", "attention"),
    (VLLM_FULL, r"^kernel_unified_attention_2d$", "attention"),
    (VLLM_FULL, r"^kernel_unified_attention_3d$", "attention"),
    (VLLM_FULL, r"^reduce_segments$", "attention"),
    (B200, r"^fmhaSm100aKernel", "attention"),
    (H100, r"pytorch_flash::flash_fwd_kernel", "attention"),
    # GEMMs: cuBLAS(Lt), nvjet, hipBLASLt, volta/ampere sgemm, cutlass, gemv, convolutions
    (H200 / "mla_fp8_graph.json.xz", r"^nvjet_sm90_tst", "gemm/gemm"),
    (H200 / "mla_fp8_graph.json.xz", r"cublasLt::splitKreduce_kernel", "gemm/gemm"),
    (SGL_DECODE, r"^Cijk_Alik_Bljk", "gemm/gemm"),
    (MI250, r"^Cijk_Ailk_Bjlk", "gemm/gemm"),
    (H100, r"^sm90_xmma_gemm", "gemm/gemm"),
    (V100, r"^volta_sgemm_128x32_nt$", "gemm/gemm"),
    (V100, r"epilogue::impl::globalKernel", "gemm/gemm"),
    (A100, r"cutlass::Kernel<cutlass_80_tensorop_s1688gemm", "gemm/gemm"),
    (CONTROL, r"^ampere_sgemm", "gemm/gemm"),
    (XDIT, r"^igemm_fwd_gtcx3", "gemm/conv"),
    (XDIT, r"kernel_grouped_conv_fwd", "gemm/conv"),
    (XDIT, r"^Im2d2Col", "gemm/gemm"),
    # MoE: expert GEMMs, routing and combine
    (VLLM_FULL, r"^_matmul_ogs_", "moe/gemm"),
    (B200, r"^bmm_MxE4m3_MxE2m1.*dynBatch", "moe/gemm"),
    (VLLM_FULL, r"^_topk_forward$", "moe/routing"),
    (VLLM_FULL, r"^_combined_routing_compute$", "moe/routing"),
    (B200, r"moe::dev::routing::routingIndicesHistogramKernel", "moe/routing"),
    (B200, r"moe::dev::finalize::finalizeKernel", "moe/combine"),
    (VLLM_FULL, r"^_finalize_matmul_scatter", "moe/combine"),
    # communication: NCCL (V100 HTA trace, ring all-reduce; A100 send/recv) and custom all-reduce (B200)
    (V100, r"^ncclKernel_AllReduce_RING_LL_Sum_float", "communication/nccl"),
    (A100, r"^ncclKernel_SendRecv", "communication/nccl"),
    (B200, r"multimem_all_reduce_kernel", "communication/custom"),
    # copies: memcpy/memset activities, torch copies, casts, concatenations, KV-cache writes
    (V100, r"^Memcpy DtoD", "copy/memcpy"),
    (MI250, r"^Memcpy HtoD", "copy/memcpy"),
    (A100, r"^Memset", "copy/memset"),
    (SGL_DECODE, r"gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda", "copy/copy"),
    (H100, r"bfloat16_copy_kernel_cuda", "copy/cast"),
    # strided converting copy: its CPU op in this trace is aten::copy_(int -> long)
    (SGL_DECODE, r"manual_unroll<128, 4, at::native::gpu_kernel_impl<at::native::direct_copy", "copy/cast"),
    (H100, r"CatArrayBatchedCopy", "copy/copy"),
    (XDIT, r"^batched_transpose_32x32_half$", "copy/copy"),
    (SGL_DECODE, r"store_kvcache", "copy/kv-write"),
    (B200, r"vllm::reshape_and_cache_flash_kernel", "copy/kv-write"),
    (V100, r"FillFunctor<float>", "copy/fill"),
    (CONTROL, r"indexSelectLargeIndex", "copy/gather"),
    (SAMPLED, r"fbgemm_gpu::permute_2D_data_kernel", "copy/copy"),  # "fbgemm" is not a GEMM
    # elementwise: norms, activations, rope, quant, inductor fusions, torch pointwise
    (SGL_DECODE, r"aiter.*add_rmsnorm_quant_kernel", "elementwise/norm"),
    (VLLM_FULL, r"ck_tile.*Rmsnorm2dFwd", "elementwise/norm"),
    (B200, r"vllm::fused_add_rms_norm_kernel", "elementwise/norm"),  # not "conv" (in `_typeConvert`)
    (XDIT, r"triton_red_fused.*native_layer_norm", "elementwise/norm"),
    (SGL_DECODE, r"sgl_hip10activation18act_and_mul_kernel", "elementwise/activation"),
    (H100, r"silu_kernel", "elementwise/activation"),
    (SGL_DECODE, r"rotary_embedding_kernel", "elementwise/rope"),
    (B200, r"vllm::rotary_embedding_kernel", "elementwise/rope"),  # not a gather ("embedding")
    (B200, r"vllm::scaled_fp8_quant_kernel", "elementwise/quant"),
    (B200, r"tensorrt_llm::kernels::quantize_with_block_size", "elementwise/quant"),  # flashinfer:: only in its params
    (XDIT, r"^triton_poi_fused__scaled_dot_product_flash_attention_cat", "elementwise/inductor"),
    (A100, r"^triton__0d1d", "elementwise/inductor"),
    (V100, r"CUDAFunctor_add<float>", "elementwise/elementwise"),
    (CONTROL, r"cub::DeviceScanKernel", "elementwise/elementwise"),
    (SGL_PD, r"rocprim::", "elementwise/elementwise"),
    (XDIT, r"distribution_elementwise_grid_stride_kernel.*normal_and_transform", "elementwise/elementwise"),
    (SGL_DECODE, r"resolve_future_token_ids_kernel", "elementwise/metadata"),
    # sampling: cub radix sort (torch.sort / topk), argmax (greedy)
    (CONTROL, r"cub::DeviceRadixSortOnesweepKernel", "sampling"),
    (CONTROL, r"cub::DeviceRadixSortHistogramKernel", "sampling"),
    (SGL_DECODE, r"ArgMaxOps", "sampling"),
    # FlashInfer's non-attention kernels (SGLang on CUDA's default norm, activation, rope, sampling):
    # none of them is attention although every name starts with `flashinfer::`
    (FI_EAGER, r"flashinfer::norm::FusedAddRMSNormKernel", "elementwise/norm"),
    (FI_EAGER, r"flashinfer::norm::RMSNormKernel", "elementwise/norm"),
    (FI_EAGER, r"flashinfer::activation::act_and_mul_kernel", "elementwise/activation"),
    (FI_EAGER, r"flashinfer::BatchQKApplyRotaryPosIdsCosSinCache", "elementwise/rope"),
    (FI_EAGER, r"flashinfer::sampling::TopKTopPSamplingFromProbKernel", "sampling"),
    (FI_EAGER, r"flashinfer::mla::BatchMLAPagedAttentionKernel", "attention"),
    (FI_GRAPH, r"flashinfer::sampling::TopPSamplingFromProbKernel", "sampling"),
    (FI_GRAPH, r"flashinfer::sampling::TopKSamplingFromProbKernel", "sampling"),
    (FI_GRAPH, r"flashinfer::sampling::OnlineSoftmax(Map|Reduce)Kernel", "sampling"),
    # Triton norm / rotary kernels named as SGLang/vLLM's: not the `_fwd_kernel` of Triton attention
    (TRITON_NORM, r"^_rms_norm_fwd_kernel$", "elementwise/norm"),
    (TRITON_NORM, r"^_rotary_fwd_kernel$", "elementwise/rope"),
    # torch top-p / top-k sampling: radix sort, mbtopk
    (TORCH_TOPP, r"DeviceRadixSortOnesweepKernel", "sampling"),
    (TORCH_TOPK, r"mbtopk::gatherTopK", "sampling"),
    (TORCH_TOPK, r"mbtopk::computeBlockDigitCounts", "sampling"),
    (TORCH_TOPP, r"tensor_kernel_scan_innermost_dim", "elementwise"),  # cumsum (the rule claims it by op)
    # cuDNN convolutions are GEMM-like work, cuDNN batch norm a norm
    (CONV, r"^cudnn_infer_volta_scudnn_128x64_relu", "gemm/conv"),
    (CONV, r"^cudnn_train_volta_scudnn_128x128_stridedB_splitK", "gemm/conv"),
    (CONV, r"cudnn::detail::dgrad_engine", "gemm/conv"),
    (CONV, r"wgrad_alg0_engine", "gemm/conv"),
    (CONV, r"cudnn::winograd_nonfused::winogradForwardData", "gemm/conv"),
    (CONV, r"cudnn::bn_bw_1C11_kernel_new", "elementwise/norm"),
    # real SGLang on CUDA: FlashInfer norms, sgl-kernel rope / activation, FlashInfer's Hopper MLA kernel
    (SGL_H200, r"flashinfer::norm::FusedAddRMSNormKernel", "elementwise/norm"),
    (SGL_H200, r"flashinfer::norm::RMSNormKernel", "elementwise/norm"),
    (SGL_H200, r"fused_rope_kernel", "elementwise/rope"),
    (SGL_H200, r"act_and_mul_kernel", "elementwise/activation"),
    (SGL_H200, r"flashinfer::mla::hopper::BatchMLAPageAttentionHopperKernel", "attention"),
    (SGL_H200, r"^create_flashinfer_kv_indices_triton$", "elementwise/metadata"),
    (SGL_H200, r"set_mla_kv_buffer_kernel", "copy/kv-write"),
    (SGL_H200, r"ArgMaxOps", "sampling"),
    # perfscope's own pages fix: an FP8 -> BF16 cast of the referenced rows, a copy
    (PAGES_FIX, r"^_perfscope_fp8kv_rows_kernel$", "copy/cast"),
    # DeepSeek's internal DeepEP (EP64 over RDMA) in its own H800 training trace: communication
    (DEEPSEEK_TRAIN, r"dpsk::ep::internode::dispatch<", "communication/ep"),
    (DEEPSEEK_TRAIN, r"dpsk::ep::internode::combine<", "communication/ep"),
    (DEEPSEEK_TRAIN, r"dpsk::ep::internode::notify_dispatch<", "communication/ep"),
    (DEEPSEEK_TRAIN, r"dpsk::ep::internode::cached_notify<", "communication/ep"),
    (DEEPSEEK_TRAIN, r"cutlass::device_kernel<dpsk::grouped_gemm::", "moe/gemm"),
    (DEEPSEEK_TRAIN, r"cutlass::device_kernel<flash::FlashAttnBwd", "attention"),
    (DEEPSEEK_TRAIN, r"cuda::per_channel_cast_and_transpose", "elementwise/quant"),
    (DEEPSEEK_TRAIN, r"cuda::expand_to_fused_with_scales_impl", "moe/routing"),
    (DEEPSEEK_TRAIN, r"cuda::reduce_fused_impl", "moe/combine"),
    # cuDNN SDPA (its engines are named `..._flash_fprop_...`, like cuDNN convolutions): attention
    (SDPA_CUDNN, r"^cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma", "attention"),
    (SDPA_CUDNN, r"^cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma", "attention"),
    (SDPA_CUDNN, r"cudnn::fusion::lean_reduction_kernel", "attention"),
]


@pytest.mark.parametrize("trace,pattern,expected", EXPECT,
                         ids=[f"{t.name[:24]}:{p[:40]}" for t, p, _ in EXPECT])
def test_real_kernel_lands_in_its_bucket(trace, pattern, expected):
    for name, kind in find(trace, pattern):
        got = "/".join(classify(name, kind))
        assert got == expected or got.split("/")[0] == expected, f"{name[:160]} -> {got}, want {expected}"


# Inference traces, and the public ones whose kernels are all known; "other" stays below 1% of
# kernel time in each (fbgemm's sparse-feature helpers in the recsys training traces are "other").
# traces with no GPU kernel time at all (CPU-only, Meta MTIA, CUPTI range profiler) have no share to check
COVERAGE = [p for p in ALL if not any(s in str(p) for s in ("cpu_only", "mtia_inference", "cupti_profiler"))]


@pytest.mark.parametrize("trace", COVERAGE, ids=[str(p.relative_to(TRACES if TRACES in p.parents else KERNEL_MIX.parent))[-60:] for p in COVERAGE])
def test_other_is_a_small_share_of_kernel_time(trace):
    names = names_of(trace)
    total = sum(names.values())
    assert total > 0, "a trace without GPU kernel time belongs in the exclusions above COVERAGE"
    other = sum(us for (n, kind), us in names.items() if classify(n, kind)[0] == "other")
    left = sorted(((us, n) for (n, kind), us in names.items() if classify(n, kind)[0] == "other"), reverse=True)
    assert other / total < OTHER_MAX_SHARE, [(round(us / total, 4), n[:100]) for us, n in left[:5]]


def test_every_real_name_gets_a_known_bucket():
    seen = set()
    for p in ALL:
        for name, kind in names_of(p):
            b, sub = classify(name, kind)
            assert b in BUCKETS
            seen.add(f"{b}/{sub}")
    # the GPU rows of the table that real traces exercise (rows for kernels no shared trace has,
    # e.g. DeepGEMM or Triton block-FP8, are covered by the rule tests' derived fixtures)
    for must in ("copy/cast", "copy/copy", "copy/memcpy", "copy/kv-write", "copy/gather", "copy/fill",
                 "attention/attention", "gemm/gemm", "moe/gemm", "communication/nccl",
                 "communication/custom", "moe/routing", "moe/combine", "sampling/sampling",
                 "elementwise/norm", "elementwise/activation", "elementwise/rope", "elementwise/quant",
                 "elementwise/inductor", "elementwise/elementwise", "elementwise/metadata"):
        assert must in seen, must


def test_kind_wins_over_name_and_params_are_not_matched():
    assert classify("anything at all", "memcpy") == ("copy", "memcpy")
    assert classify("anything at all", "memset") == ("copy", "memset")
    assert without_params("void f<int, g(h)>(int, fbgemm_gpu::FixedDivisor)") == "void f<int, g(h)>"
    assert without_params("nvjet_sm90_tst_64x8") == "nvjet_sm90_tst_64x8"
    # the parameter list of a real V100 NCCL kernel
    name = next(n for n, _ in names_of(V100) if n.startswith("ncclKernel_AllReduce"))
    assert without_params(name) == "ncclKernel_AllReduce_RING_LL_Sum_float"


def test_table_is_declarative_and_compiles():
    for row in TABLE:
        # (bucket, sub-bucket, regex, whose kernels the row covers)
        assert len(row) == 4 and all(isinstance(x, str) for x in row)
        assert len(row[3]) > 10, f"row {row[:2]} does not say whose kernels it covers"
        # ... naming the engine(s) or the kind of workload whose kernels they are (the "done when")
        assert re.search(r"SGLang|vLLM|every engine|CPU-only|training|non-LLM|DeepSeek|perfscope|torch-native",
                         row[3]), f"row {row[:2]}: {row[3]!r} names no engine"
        assert row[0] in BUCKETS
        re.compile(row[2])


def test_real_sglang_sampling_lands_in_its_step():
    # SGLang's step[DECODE] annotation closes before the sampler launches its argmax: the kernels
    # launched right after it are the step's sampling, not lost between steps

    d = real_diagnosis(SGL_H200).to_dict()
    assert d["steps"]["method"] == "sglang-annotation" and d["steps"]["count"] == 10
    assert d["buckets"]["sampling"]["ms_per_step"] > 0.005  # ArgMaxOps (greedy), ~10 us per step
    assert d["buckets"]["attention"]["ms_per_step"] == pytest.approx(
        sum(o["ms_per_step"] for o in d["ops"] if "BatchMLAPageAttentionHopperKernel" in o["name"]), rel=0.01)


def _raw_events(path: Path) -> list:

    d = raw_json(path)
    return d["traceEvents"] if isinstance(d, dict) else d


def test_deepseek_deep_ep_is_the_communication_bucket():
    # DeepSeek's H800 training trace (deepseek-ai/profile-data train.json: a DualPipe forward+backward
    # chunk pair, EP64): its `dpsk::ep::` kernels are about half of kernel time and were "other"

    kernels = [e for e in _raw_events(DEEPSEEK_TRAIN) if e.get("ph") == "X" and e.get("cat") == "kernel"]
    total = sum(e["dur"] for e in kernels)
    ep = sum(e["dur"] for e in kernels if "dpsk::ep::" in e["name"])
    assert 0.40 < ep / total < 0.50  # the trace is what its README says: EP all-to-all ~46%
    d = real_diagnosis(DEEPSEEK_TRAIN).to_dict()
    comm = d["buckets"]["communication"]
    assert comm["share"] == pytest.approx(ep / total, abs=0.002), (comm, ep / total)
    assert d["buckets"]["other"]["share"] < 0.01
    assert d["steps"]["workload"] == "training" and d["steps"]["phase"] == "train"
    assert d["findings"] == []  # no nccl-allreduce / eager-decode / server flags on a training chunk
    tops = [o for o in d["ops"] if "dpsk::ep::" in o["name"]]
    assert {o["short"] for o in tops} >= {"dispatch", "combine", "notify_dispatch", "cached_notify"}
    assert all((o["bucket"], o["sub"]) == ("communication", "ep") for o in tops)


def test_cudnn_sdpa_kernels_are_attention():
    # torch SDPA under sdpa_kernel(CUDNN_ATTENTION) on an H200 (cuDNN 9.19): decode (q 1 token, kv 1k-32k,
    # batch 1/8/64, 32 q heads over 8 KV heads) and a causal prefill; every kernel of the calls is attention
    import json

    ev = _raw_events(SDPA_CUDNN)
    ranges = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev if e.get("ph") == "X"
              and e.get("cat") == "user_annotation" and e["name"].startswith("sdpa_cudnn ")]
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("ph") == "X"
              and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    per: dict = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            ts = launch[e["args"]["correlation"]]
            case = next(n for a, b, n in ranges if a <= ts <= b)  # every kernel was launched by an SDPA call
            per.setdefault(case, set()).add(e["name"])
            assert classify(e["name"])[0] == "attention", (case, e["name"])
    assert len(ranges) == len(per) == 13
    # cuDNN's split-KV decode ends in lean_reduction_kernel (batch 1 and 8; batch 64 needs no split)
    lean = {c for c, ns in per.items() if any("lean_reduction_kernel" in n for n in ns)}
    assert lean and all(c.startswith("sdpa_cudnn decode") for c in lean)
    assert not any("b=64" in c for c in lean)
    # the timings beside the trace: the same cases, cuDNN's CUDA-event medians
    t = json.loads((KERNEL_MIX / "sdpa_timings.json").read_text())
    assert t["env"]["gpu"] == "NVIDIA H200" and t["env"]["cudnn"] >= 90000
    timed = {"sdpa_cudnn " + c["name"]: c["cudnn"]["median_ms"] for c in t["cases"]}
    assert set(timed) == set(per) and all(v > 0 for v in timed.values())
    assert {c: sorted(ns) for c, ns in per.items()} == {c: sorted(k for k in ks if not k.startswith("["))
                                                        for c, ks in t["kernels_per_case"].items()}

    d = real_diagnosis(SDPA_CUDNN).to_dict()
    assert d["buckets"]["attention"]["share"] > 0.99 and d["buckets"]["gemm"]["ms_per_step"] == 0


MOE_B300 = TRACES / "public/TraceLens/evals/unit_tests_nv/moe"


@pytest.mark.parametrize("name", ["nv_moe_01_many_experts_few_tokens", "nv_moe_06_tiny_batch_many_experts"])
def test_moe_router_topk_is_not_sampling(name):
    # real B300 torch-native MoE: router GEMM -> topk over the 128 experts (`sbtopk::gatherTopK`,
    # `bitonicSortKVInPlace`) -> softmax -> gather -> expert GEMMs. Those top-k kernels share their names
    # with torch sampling's, but a GEMM follows them in the step: routing, not sampling (which runs on the
    # logits after the step's last GEMM). They read 18% "sampling", and made the file look like an LLM.

    path = MOE_B300 / f"{name}.json.xz"
    t = real_trace(path)
    sorts = [k for k in t.kernels if re.search(r"gatherTopK|bitonicSort", k.name)]
    assert sorts and all(classify(k.name, k.kind)[0] == "sampling" for k in sorts)  # by name alone
    gemm_starts = [k.ts for k in t.kernels if classify(k.name, k.kind)[0] == "gemm"]
    assert all(any(g >= k.ts + k.dur for g in gemm_starts) for k in sorts)  # each has a GEMM after it
    d = real_diagnosis(path).to_dict()
    assert d["buckets"]["sampling"]["ms_per_step"] == 0
    n = max(d["steps"]["count"], 1)
    want = sum(k.dur for k in sorts) / 1e3 / n
    assert d["sub_buckets"]["moe/routing"]["ms_per_step"] == pytest.approx(want, rel=1e-3, abs=1e-4)
    assert d["steps"]["workload"] != "llm-inference" and not d["findings"]
    assert all(o["bucket"] != "sampling" for o in d["ops"])


@pytest.mark.parametrize("name", ["sample_topk", "sample_topp"])
def test_sampling_topk_after_the_lm_head_stays_sampling(name):
    # the same torch top-k / sort kernels after the step's last GEMM (the LM head, H200 kernel-mix traces):
    # sampling, every one of them

    t = real_trace(KERNEL_MIX / f"{name}.json.gz")
    sort_us = sum(k.dur for k in t.kernels if re.search(r"gatherTopK|bitonicSort|RadixSort|radixSort|mbtopk", k.name))
    assert sort_us > 0
    d = real_diagnosis(KERNEL_MIX / f"{name}.json.gz").to_dict()
    assert "moe/routing" not in d["sub_buckets"]
    assert d["buckets"]["sampling"]["ms_per_step"] * d["steps"]["count"] * 1e3 >= 0.999 * sort_us


def _in_ranges(t, rx):
    spans = [(a.ts, a.ts + a.dur) for a in t.annotations if a.gpu and re.search(rx, a.name)]
    return [k for k in t.kernels if any(s <= k.ts and k.ts + k.dur <= e + 0.5 for s, e in spans)]


@pytest.mark.parametrize("name", ["nv_moe_01_many_experts_few_tokens", "nv_moe_02_few_experts_many_tokens",
                                  "nv_moe_05_large_capacity"])
def test_torch_native_moe_layer_is_the_moe_bucket(name):
    # real B300 torch-native MoE layers, each inside a GPU range `MoE[experts=.., topk=..]`: by name their
    # kernels are GEMMs (nvjet), gathers, top-k and elementwise work; by place they are the MoE layer, its
    # GEMMs `moe/gemm` and the rest `moe/other` / `moe/routing` (the top-k)

    path = MOE_B300 / f"{name}.json.xz"
    t = real_trace(path)
    inside = _in_ranges(t, r"^MoE\[")
    assert inside and {classify(k.name, k.kind)[0] for k in inside} >= {"gemm", "copy"}  # by name alone
    d = real_diagnosis(path).to_dict()
    n = max(d["steps"]["count"], 1)
    gemm_us = sum(k.dur for k in inside if classify(k.name, k.kind)[0] == "gemm")
    assert d["sub_buckets"]["moe/gemm"]["ms_per_step"] == pytest.approx(gemm_us / 1e3 / n, rel=1e-3, abs=1e-4)
    moe_ms = d["buckets"]["moe"]["ms_per_step"]
    assert moe_ms * n * 1e3 >= 0.999 * sum(k.dur for k in inside)
    subs = sum(v["ms_per_step"] for k, v in d["sub_buckets"].items() if k.startswith("moe/"))
    assert subs == pytest.approx(moe_ms, abs=1e-3)
    assert d["buckets"]["gemm"]["ms_per_step"] == 0 and d["buckets"]["sampling"]["ms_per_step"] == 0


@pytest.mark.parametrize("path,sub", [(VLLM_FULL, r"^_matmul_ogs_"), (B200, r"dynBatch"),
                                      (DEEPSEEK_TRAIN, r"dpsk::grouped_gemm::")])
def test_expert_gemms_are_moe_not_gemm(path, sub):
    # vLLM gpt-oss decode (Triton-kernels matmul_ogs), the B200 TRT-LLM-gen MoE, DeepSeek's H800 training
    # trace: the expert GEMMs are the moe bucket's `moe/gemm`, the dense GEMMs stay `gemm`

    t = real_trace(path)
    experts = sum(k.dur for k in t.kernels if re.search(sub, k.name))
    dense = sum(k.dur for k in t.kernels if classify(k.name, k.kind)[0] == "gemm")
    assert experts > 0 and dense > 0
    d = real_diagnosis(path).to_dict()
    assert d["sub_buckets"]["moe/gemm"]["ms_per_step"] > 0
    assert d["buckets"]["moe"]["ms_per_step"] > d["sub_buckets"]["moe/gemm"]["ms_per_step"]  # routing, combine
    assert d["buckets"]["moe"]["share"] > d["buckets"]["gemm"]["share"] > 0


def test_mid_step_topk_without_moe_layer_stays_other():
    # a recommendation model's training rank (HTA sampled_rank-0: no MoE kernel, no MoE range): its torch
    # top-k mid-step is no expert routing

    path = HTA / "trace_filter/sampled_rank-0.json.xz"
    t = real_trace(path)
    assert not any(classify(k.name, k.kind)[0] == "moe" for k in t.kernels) and not _in_ranges(t, r"(?i)moe|expert")
    d = real_diagnosis(path).to_dict()
    assert d["sub_buckets"]["other/topk-mid-step"]["ms_per_step"] > 0
    assert d["buckets"]["moe"]["ms_per_step"] == 0
