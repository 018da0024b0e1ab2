"""Training and non-LLM traces are told apart from LLM inference, and the serving rules stay off them.

Real traces: the training runs among ../shared/traces/public (HolisticTraceAnalysis: V100/A100
training ranks with autograd and optimizer steps, a cuDNN CNN, an MI250 toy training loop;
TraceLens: an MI210 GPU-only CNN training trace), the LLM serving traces beside them and the H200
kernel-mix traces of this project.
"""

from __future__ import annotations

import pytest

from paths import H200, HTA, KERNEL_MIX, TRACELENS
from perfscope.analysis.diagnose import diagnose

TRAINING = [
    HTA / "df_index_resolver/df_index_resolver.json.gz",
    HTA / "negative_queue_length_values_check/rank0.json.gz",
    HTA / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    HTA / "trace_diff/control/control.json.gz",
    HTA / "trace_diff/test/test.json.gz",
    HTA / "trace_filter/sampled_rank-0.json.gz",
    HTA / "trace_filter/sampled_rank-1.json.gz",
    HTA / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    TRACELENS / "mi210/gpu_only_trace/gpu_only_trace.json.gz",
]
LLM = [
    TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    TRACELENS / "inference/vllm_decode_full/graph_execution.json.gz",
    H200 / "mla_pool_graph.json.gz",
    KERNEL_MIX / "sample_topp.json.gz",
]


@pytest.mark.parametrize("path", TRAINING, ids=[p.name[:40] for p in TRAINING])
def test_training_traces_are_training_and_get_no_serving_finding(path):
    d = diagnose([path]).to_dict()
    assert d["steps"]["workload"] == "training", d["steps"]["workload_how"]
    assert d["steps"]["phase"] == "train"  # not "decode"
    assert d["findings"] == []  # no eager-decode, nccl-allreduce, torch-sampling, ... on a training loop
    assert any("training trace" in n for n in d["notes"])
    ev = d["steps"]["workload_evidence"]
    assert ev["backward_ops"] >= 3 or ev["optimizer_steps"] or ev["backward_kernel_share"] >= 0.1


def test_training_gradient_allreduce_is_not_a_server_flag_finding():
    # the V100 rank with 2,020 NCCL kernels: gradient all-reduces, no `--disable-custom-all-reduce` advice
    d = diagnose([HTA / "df_index_resolver/df_index_resolver.json.gz"]).to_dict()
    assert d["buckets"]["communication"]["ms_per_step"] > 0
    assert not any(f["id"] == "nccl-allreduce" for f in d["findings"])


@pytest.mark.parametrize("path", LLM, ids=[p.name[:40] for p in LLM])
def test_llm_traces_stay_llm(path):
    d = diagnose([path]).to_dict()
    assert d["steps"]["workload"] == "llm-inference", d["steps"]["workload_how"]
    assert d["steps"]["phase"] in ("decode", "prefill", "mixed")
