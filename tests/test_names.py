"""Readable kernel names in the dominant-ops table, on the real names of shared traces.

A generic entry point (CUTLASS `device_kernel<K>` / `Kernel<K>` / `Kernel2<K>`, CK-tile `kentry<N, K>`)
says nothing by its own name: DeepSeek's H800 training trace had three dominant rows all called
`device_kernel` (three different FP8 grouped GEMMs) and the A100 HTA traces dozens called `Kernel`.
"""

from __future__ import annotations

import re
from functools import lru_cache

import pytest

from paths import GPU_LOOP, HTA, REPO, TRACELENS
from perfscope.analysis.diagnose import diagnose
from perfscope.analysis.names import short_name
from realtraces import real_diagnosis, real_trace

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

DEEPSEEK_TRAIN = REPO / "tests/traces/deepseek-profile-data/train.json.gz"
A100 = HTA / "negative_queue_length_values_check/rank0.json.xz"
SAMPLED = HTA / "trace_filter/sampled_rank-0.json.xz"
H100 = TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"
SGL_PD = TRACELENS / "inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.xz"
VLLM_FULL = TRACELENS / "inference/vllm_decode_full/graph_execution.json.xz"
CONTROL = HTA / "trace_diff/control/control.json.xz"
GENERIC = {"device_kernel", "Kernel", "Kernel2", "kentry", "kernel", "ck_tile::kentry"}


@lru_cache(maxsize=None)
def names(path):
    return sorted({k.name for k in real_trace(path).kernels})


def test_deepseek_grouped_gemms_are_named_by_their_kernel_type():
    d = diagnose([DEEPSEEK_TRAIN]).to_dict()
    shorts = [o["short"] for o in d["ops"]]
    assert not any(s in GENERIC for s in shorts), shorts
    gemms = [o for o in d["ops"] if o["name"].startswith("void cutlass::device_kernel<dpsk::grouped_gemm::")]
    assert len(gemms) == 3 and len({o["short"] for o in gemms}) == 3
    for o in gemms:
        # the template argument, namespaces that repeat the path (`dpsk::`, `cuda::`) left out
        kind = re.search(r"grouped_gemm::cuda::(\w+)::GemmKernel>", o["name"]).group(1)
        assert o["short"] == f"grouped_gemm::{kind}::GemmKernel"
    assert {o["short"] for o in gemms} == {"grouped_gemm::fp8_dptp128c_acc::GemmKernel",
                                           "grouped_gemm::m_grouped_fp8_ptp128c::GemmKernel",
                                           "grouped_gemm::fp8_ptp128c::GemmKernel"}
    flash = [o["short"] for o in d["ops"] if "device_kernel<flash::" in o["name"]]
    assert "flash::FlashAttnBwd" in flash and all(s.startswith("flash::FlashAttnBwd") for s in flash)


@pytest.mark.parametrize("path,entry,want", [
    (A100, r"^void cutlass::Kernel<(cutlass_80_tensorop_\w+)>", None),
    (SAMPLED, r"^void cutlass::Kernel<(cutlass_80_tensorop_\w+)>", None),
    (H100, r"^void cutlass::Kernel2<(cutlass_80_simt_sgemm_\w+)>", None),
    (SGL_PD, r"^_ZN7ck_tile6kentry", "FmhaBatchPrefillWithPagedKVCacheKernel"),
    (VLLM_FULL, r"^_ZN7ck_tile6kentry", "Rmsnorm2dFwd"),
    (CONTROL, r"internal::gemvx::kernel<", "gemvx::kernel"),
], ids=["a100-cutlass-Kernel", "sampled-cutlass-Kernel", "h100-cutlass-Kernel2", "mi300-ck-fmha", "mi300-ck-rmsnorm",
        "cublas-gemvx"])
def test_generic_entry_points_in_shared_traces(path, entry, want):
    rx = re.compile(entry)
    hits = [n for n in names(path) if rx.search(n)]
    assert hits, f"no kernel matching {entry!r} in {path.name}: the expectation is stale"
    for n in hits:
        m = rx.search(n)
        got = short_name(n)
        assert got == (want or m.group(1)), (n[:150], got)
    # different kernel types stay different rows
    if want is None:
        assert len({short_name(n) for n in hits}) == len({rx.search(n).group(1) for n in hits}) == len(hits)
    if path in (A100, SAMPLED):
        assert len(hits) > 5  # dozens of CUTLASS GEMMs, once all called `Kernel`


def test_names_without_an_entry_point_keep_their_short_form():
    # real names of the shared traces: the entry-point rule leaves every other kernel as it was read
    flash = [n for n in names(H100) if "pytorch_flash::flash_fwd_kernel" in n]
    assert flash and {short_name(n) for n in flash} == {"flash_fwd_kernel"}
    a100 = [n for n in names(A100) if n.startswith("ncclKernel_SendRecv")]
    assert a100 and short_name(a100[0]) == "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"


B200 = TRACELENS / "b200/eager_trace.json.xz"
SGL_GRAPH = next((GPU_LOOP / "h200-2026-12-01-eager-decode/graph/traces").glob("*-DECODE.trace.json.xz"))
SGL_POOL = next((GPU_LOOP / "h200-2026-12-01-sglang/pool495000-pages/runs/495000-pages/traces").glob("*-DECODE.trace.json.xz"))
SGL_DECODE = TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz"
MOE_B300 = TRACELENS.parents[1] / "evals/unit_tests_nv/moe/nv_moe_06_tiny_batch_many_experts.json.xz"
CROSS = REPO / "tests/traces/h200-cross-stream/base.json.gz"


@pytest.mark.parametrize("path,pattern,want", [
    # torch's and sgl-kernel's kernels in anonymous namespaces (the short name was
    # `(anonymous namespace)::act_and_mul_kernel<__nv_bfloat16, ((a` or `at::native::(anonymous namespace)::cunn_So`)
    (SGL_POOL, r"^void \(anonymous namespace\)::act_and_mul_kernel<", "act_and_mul_kernel"),
    (SGL_POOL, r"^void \(anonymous namespace\)::fused_rope_kernel<", "fused_rope_kernel"),
    (SGL_DECODE, r"^void \(anonymous namespace\)::store_kvcache<", "store_kvcache"),
    (SGL_GRAPH, r"^void at::native::\(anonymous namespace\)::cunn_SoftMaxForwardReg<", "cunn_SoftMaxForwardReg"),
    (SGL_GRAPH, r"^void at::native::\(anonymous namespace\)::vectorized_layer_norm_kernel<", "vectorized_layer_norm_kernel"),
    (H100, r"^void at::native::\(anonymous namespace\)::CatArrayBatchedCopy<", "CatArrayBatchedCopy"),
    (MOE_B300, r"^void \(anonymous namespace\)::softmax_warp_forward<", "softmax_warp_forward"),
    (B200, r"^void \(anonymous namespace\)::multimem_all_reduce_kernel<", "multimem_all_reduce_kernel"),
    (CROSS, r"^at::cuda::\(anonymous namespace\)::spin_kernel\(long\)$", "spin_kernel"),
    # a template return type (`std::enable_if<(((8)>(0)))&&...>::type vllm::fused_add_rms_norm_kernel<..>`):
    # the comparison inside the template argument closed it early and the row read `enable_if`
    (B200, r"^std::enable_if<.*vllm::fused_add_rms_norm_kernel<", "fused_add_rms_norm_kernel"),
], ids=["sgl-act-and-mul", "sgl-fused-rope", "sgl-store-kvcache", "torch-softmax-reg", "torch-layer-norm", "torch-cat", "torch-softmax-warp",
        "torch-multimem-allreduce", "torch-spin", "vllm-enable-if-rmsnorm"])
def test_anonymous_namespaces_and_return_types_are_not_the_name(path, pattern, want):
    rx = re.compile(pattern)
    hits = [n for n in names(path) if rx.search(n)]
    assert hits, f"no kernel matching {pattern!r} in {path.name}: the expectation is stale"
    for n in hits:
        got = short_name(n)
        assert got.split(" [")[0] == want, (n[:160], got)
        assert "anonymous" not in got and "(" not in got.split(" [")[0], got


def test_no_dominant_op_of_a_real_trace_reads_as_a_namespace_or_return_type():
    for path in (SGL_POOL, SGL_GRAPH, H100, B200):
        d = real_diagnosis(path).to_dict()
        for o in d["ops"]:
            head = o["short"].split(" [")[0]
            assert "anonymous namespace" not in head and not head.startswith(("enable_if", "std::", "at::")), o["short"]


@pytest.mark.parametrize("path,pattern,tag", [
    # torch's reductions: the reduction they run, not the `ReduceOp` every one of them is
    (REPO / "tests/traces/h200-kernel-mix/sample_argmax.json.gz", r"reduce_kernel<.*ArgMaxOps", "ArgMaxOps"),
    (MOE_B300, r"reduce_kernel<.*func_wrapper_t<c10::BFloat16, at::native::sum_functor", "sum_functor"),
    # torch's lambda kernels: the op they implement (`silu_kernel`, `pow_tensor_scalar_kernel_impl`)
    (H100, r"^void at::native::vectorized_elementwise_kernel<\d+, at::native::\(anonymous namespace\)::silu_kernel\(",
     "silu_kernel"),
    (H100, r"^void at::native::vectorized_elementwise_kernel<\d+, at::native::\(anonymous namespace\)::"
           r"pow_tensor_scalar_kernel_impl<", "pow_tensor_scalar_kernel_impl"),
], ids=["argmax", "sum", "silu", "pow"])
def test_torch_reductions_and_lambda_kernels_say_what_they_compute(path, pattern, tag):
    """H100 Qwen1.5: silu (2.9%) and pow (4.1%) were two dominant rows both called
    `vectorized_elementwise_kernel`; every torch reduction (argmax of greedy sampling, sum, mean)
    read `reduce_kernel [ReduceOp]`."""
    rx = re.compile(pattern)
    hits = [n for n in names(path) if rx.search(n)]
    assert hits, f"no kernel matching {pattern!r} in {path.name}: the expectation is stale"
    for n in hits:
        got = short_name(n)
        assert got.endswith(f"[{tag}]"), (n[:200], got)
