"""Rules checked against a small context (tests/rulectx.py): a few kernels per step, read by
perfscope's reader and analysed as ``diagnose`` analyses a trace, then one rule's ``check``. Each
rule fires where its cause is, and stays quiet just past the threshold its doc states or where
the evidence names another cause. (tests/test_rules.py checks the same rules on real traces.)"""

from __future__ import annotations

import pytest

from perfscope.analysis.rules import run_rules
from perfscope.analysis.rules.nccl_allreduce import NcclAllReduce
from perfscope.analysis.rules.triton_block_fp8_gemm import TritonBlockFp8Gemm
from rulectx import H200, context

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
CUSTOM = "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, sglang::Signal*, __nv_bfloat16*, int, int)"
GEMM = "nvjet_sm90_tst_192x8_64x8_4x1_v_bz_splitK_NNT"  # cuBLAS's Hopper GEMM
TRITON_FP8 = "_w8a8_block_fp8_matmul"
ATTENTION = "flash_fwd_kernel"


def layers(*kernels: tuple[str, float], n: int = 4) -> list[tuple[str, float]]:
    """One decode step of ``n`` layers, each launching ``kernels`` (name, µs) in order."""
    return list(kernels) * n


# ------------------------------------------------------------------------------------ nccl-allreduce

def test_nccl_allreduce_fires_when_nccl_all_reduce_is_a_large_share_of_the_step():
    ctx = context([layers((NCCL, 300.0), (GEMM, 400.0))] * 4, config={"disable_custom_all_reduce": True})
    f = NcclAllReduce().check(ctx)
    assert f is not None and f.id == "nccl-allreduce" and f.fix == "nccl-allreduce"
    assert f.ms_per_step == pytest.approx(1.2) and f.share == pytest.approx(1.2 / 2.8)
    assert f.confidence == "high"  # the server's config says the custom all-reduce is off
    assert f.evidence["nccl_allreduce_per_step"] == 4
    assert 0 < f.predicted_step_ms_after_fix < ctx.step_ms


def test_nccl_allreduce_is_medium_without_the_config():
    f = NcclAllReduce().check(context([layers((NCCL, 300.0), (GEMM, 400.0))] * 4))
    assert f is not None and f.confidence == "medium"


def test_nccl_allreduce_stays_quiet_below_its_share():
    # 50 of 550 µs a layer: 9% of kernel time, under the rule's 15%
    assert NcclAllReduce().check(context([layers((NCCL, 50.0), (GEMM, 500.0))] * 4)) is None


def test_nccl_allreduce_stays_quiet_when_a_custom_all_reduce_does_the_work():
    # the custom all-reduce already serves most collectives: NCCL's are the rest (large messages)
    ctx = context([layers((NCCL, 300.0), (CUSTOM, 400.0), (GEMM, 400.0))] * 4)
    assert NcclAllReduce().check(ctx) is None


# ----------------------------------------------------------------------------- triton-block-fp8-gemm

def test_triton_block_fp8_gemm_fires_and_names_deepgemm_on_hopper():
    ctx = context([layers((TRITON_FP8, 300.0), (GEMM, 100.0), (ATTENTION, 100.0))] * 4)
    f = TritonBlockFp8Gemm().check(ctx)
    assert f is not None and f.id == "triton-block-fp8-gemm" and f.fix is None and f.remedy
    assert f.ms_per_step == pytest.approx(1.2) and f.share == pytest.approx(0.6)
    assert f.confidence == "high" and "DeepGEMM runs these on this GPU" in f.summary


def test_triton_block_fp8_gemm_is_medium_where_deepgemm_has_no_kernels():
    a100 = {**H200, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0}
    ctx = context([layers((TRITON_FP8, 300.0), (GEMM, 100.0), (ATTENTION, 100.0))] * 4, device=a100)
    f = TritonBlockFp8Gemm().check(ctx)
    assert f is not None and f.confidence == "medium" and "DeepGEMM" not in f.summary


def test_triton_block_fp8_gemm_stays_quiet_when_triton_is_not_most_of_the_gemm_time():
    ctx = context([layers((TRITON_FP8, 100.0), (GEMM, 300.0), (ATTENTION, 100.0))] * 4)
    assert TritonBlockFp8Gemm().check(ctx) is None


# ---------------------------------------------------------------------------------------- registry

def test_the_registry_reports_what_the_rules_find_on_the_small_context():
    ctx = context([layers((NCCL, 300.0), (TRITON_FP8, 300.0), (GEMM, 100.0))] * 4)
    ids = [f.id for f in run_rules(ctx)]
    assert "nccl-allreduce" in ids and "triton-block-fp8-gemm" in ids
    quiet = context([layers((GEMM, 400.0), (ATTENTION, 100.0))] * 4)
    assert not {"nccl-allreduce", "triton-block-fp8-gemm"} & {f.id for f in run_rules(quiet)}
