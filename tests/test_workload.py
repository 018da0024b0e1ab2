"""Training and non-LLM traces are told apart from LLM inference, and the serving rules stay off them.

Real traces: the training runs among tests/traces/corpus/public (HolisticTraceAnalysis: V100/A100
training ranks with autograd and optimizer steps, a cuDNN CNN, an MI250 toy training loop;
TraceLens: an MI210 GPU-only CNN training trace), DeepSeek's own H800 training trace (DualPipe,
EP64, tests/traces/deepseek-profile-data), the xDiT Stable Diffusion 3.5 trace (MI300X), the LLM
serving traces beside them and the H200 kernel-mix traces of this project.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from paths import H200, HTA, KERNEL_MIX, PUBLIC, REPO, TRACELENS, raw_json
from realtraces import real_diagnosis, real_trace

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

DEEPSEEK_TRAIN = REPO / "tests/traces/deepseek-profile-data/train.json.gz"
XDIT = TRACELENS / "inference/xdit_sd_3.5/profile_trace_rank_0.json.xz"  # 62 MB of JSON: diagnosed once
NOT_KINETO = ("benchmark_simple_add_et", "908_results")  # an execution trace, a rocprofiler JSON
PUBLIC_TRACES = sorted(p for p in PUBLIC.rglob("*.json.xz") if not any(s in p.name for s in NOT_KINETO))


@lru_cache(maxsize=None)
def diag(path: Path) -> dict:
    return real_diagnosis(path).to_dict()

@lru_cache(maxsize=None)
def raw_marks(path: Path) -> tuple[dict, ...]:
    """The trace's ProfilerStep# and Optimizer.step# events as its raw JSON holds them (the truth the
    step tests recount from; the file read once for both)."""

    ev = raw_json(path)["traceEvents"]
    return tuple(e for e in ev if isinstance(e.get("name"), str)
                 and e["name"].startswith(("ProfilerStep#", "Optimizer.step#")))


TRAINING = [
    HTA / "df_index_resolver/df_index_resolver.json.xz",
    HTA / "negative_queue_length_values_check/rank0.json.xz",
    HTA / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.xz",
    HTA / "trace_diff/control/control.json.xz",
    HTA / "trace_diff/test/test.json.xz",
    HTA / "trace_filter/sampled_rank-0.json.xz",
    HTA / "trace_filter/sampled_rank-1.json.xz",
    HTA / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.xz",
    TRACELENS / "mi210/gpu_only_trace/gpu_only_trace.json.xz",
    DEEPSEEK_TRAIN,
]
LLM = [
    TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz",
    TRACELENS / "inference/vllm_decode_full/graph_execution.json.xz",
    H200 / "mla_pool_graph.json.xz",
    KERNEL_MIX / "sample_topp.json.gz",
]


@pytest.mark.parametrize("path", TRAINING, ids=[p.name[:40] for p in TRAINING])
def test_training_traces_are_training_and_get_no_serving_finding(path):
    d = diag(path)
    assert d["steps"]["workload"] == "training", d["steps"]["workload_how"]
    assert d["steps"]["phase"] == "train"  # not "decode"
    assert d["findings"] == []  # no eager-decode, nccl-allreduce, torch-sampling, ... on a training loop
    assert any("training trace" in n for n in d["notes"])
    ev = d["steps"]["workload_evidence"]
    assert ev["backward_ops"] >= 3 or ev["optimizer_steps"] or ev["backward_kernel_share"] >= 0.1


def test_training_gradient_allreduce_is_not_a_server_flag_finding():
    # the V100 rank with 2,020 NCCL kernels: gradient all-reduces, no `--disable-custom-all-reduce` advice
    d = real_diagnosis(HTA / "df_index_resolver/df_index_resolver.json.xz").to_dict()
    assert d["buckets"]["communication"]["ms_per_step"] > 0
    assert not any(f["id"] == "nccl-allreduce" for f in d["findings"])


@pytest.mark.parametrize("path", LLM, ids=[p.name[:40] for p in LLM])
def test_llm_traces_stay_llm(path):
    d = diag(path)
    assert d["steps"]["workload"] == "llm-inference", d["steps"]["workload_how"]
    assert d["steps"]["phase"] in ("decode", "prefill", "mixed")


def test_diffusion_trace_is_told_apart_and_gets_no_decode_finding():
    # xDiT running Stable Diffusion 3.5 (diffusers' SD3Transformer2DModel, a VAE) on an MI300X: one
    # ProfilerStep around `execute_diffusion_1_256x256`; a 22 us int argmax once read as LLM sampling
    d = diag(XDIT)
    st = d["steps"]
    assert st["workload"] == "inference" and st["workload_model"] == "diffusion", st["workload_how"]
    assert st["phase"] == "inference"  # not "decode"
    assert d["findings"] == []  # no eager-decode (it was: "enable CUDA graphs in SGLang")
    how = st["workload_how"]
    assert how.startswith("diffusion-model inference") and "execute_diffusion_1_256x256" in how
    assert "diffusers" in how and "xfuser" in how and "SD3Transformer2DModel" in how
    assert st["workload_evidence"]["diffusion_annotations"] == 1 and st["workload_evidence"]["diffusion_frames"] > 10
    assert any(n.startswith("This is diffusion-model inference") for n in d["notes"])


@pytest.mark.parametrize("path", PUBLIC_TRACES, ids=[str(p.relative_to(PUBLIC))[-50:] for p in PUBLIC_TRACES])
def test_public_traces_get_serving_findings_only_where_they_can_apply(path):
    # every public trace: a finding (all perfscope's rules are about LLM serving) only on a trace taken
    # as LLM inference, on steps that are decode / prefill / mixed, never on training or non-LLM ones
    d = diag(path)
    st = d["steps"]
    if st["workload"] == "training":
        assert st["phase"] == "train" and d["findings"] == [], (st["workload_how"], d["findings"])
    elif st["workload_model"] in ("diffusion", "cnn"):
        assert st["phase"] == "inference" and d["findings"] == [], (st["workload_how"], d["findings"])
    for f in d["findings"]:
        if st["workload_model"] == "transformers":  # a forward outside a server: the launch-bound check only, no fix
            assert st["phase"] == "inference" and f["id"] == "eager-decode" and f["fix"] is None, (f, st)
            continue
        assert st["workload"] in ("llm-inference", "inference") and st["phase"] in ("decode", "prefill", "mixed"), \
            (f["id"], st)
    # the diffusion and training traces among them are told apart (none of them is read as decode)
    if "xdit" in str(path) or path in TRAINING:
        assert st["phase"] != "decode"


OPTIMIZER_TRACES = [HTA / "df_index_resolver/df_index_resolver.json.xz",
                    HTA / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.xz",
                    HTA / "trace_filter/sampled_rank-0.json.xz", HTA / "trace_diff/control/control.json.xz"]


@pytest.mark.parametrize("path", OPTIMIZER_TRACES, ids=[p.parent.name for p in OPTIMIZER_TRACES])
def test_optimizer_steps_count_each_iteration_once(path):
    # counted from the raw JSON: each ProfilerStep (a training iteration) steps each of its optimizers
    # once; zero_grad (df_index_resolver: 5 + 5 read as 10), the GPU-side copy of the range
    # (ns_resolution: 10) and a second optimizer of the same iteration (sampled_rank: Shampoo then an
    # EMA, 4) are not more iterations
    from collections import Counter

    marks = raw_marks(path)
    steps = [e for e in marks if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    opt = [e for e in marks if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")]
    for s in steps:
        inside = Counter(e["name"] for e in opt if s["ts"] <= e["ts"] <= s["ts"] + s["dur"])
        assert set(inside.values()) == {1}, inside
    assert diag(path)["steps"]["workload_evidence"]["optimizer_steps"] == len(steps)


NO_PROFILER_STEP = [HTA / "df_index_resolver/df_index_resolver.json.xz",
                    HTA / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.xz",
                    REPO / "tests/traces/kineto-2021/resnet50_worker0.pt.trace.json.gz"]


@pytest.mark.parametrize("path", NO_PROFILER_STEP, ids=[p.parent.name for p in NO_PROFILER_STEP])
def test_training_iterations_from_optimizer_steps_without_profiler_steps(path):
    # a training loop profiled without torch.profiler's schedule has no ProfilerStep#N: its iterations end
    # with their Optimizer.step (was: the whole trace, one "step"). With the ProfilerSteps of these real
    # traces dropped, the iterations found are the same GPU work; their count recounted from the raw JSON.
    from dataclasses import replace

    from perfscope.analysis.analyze import analyze_trace
    from perfscope.analysis.steps import find_steps

    opt = [e for e in raw_marks(path) if e.get("cat") in ("user_annotation", "Operator")
           and e["name"].startswith("Optimizer.step#")]
    t = real_trace(path)
    marked = find_steps(t)
    assert marked.method == "ProfilerStep" and len(marked.steps) == len(opt)
    bare = replace(t, annotations=[a for a in t.annotations if not a.name.startswith("ProfilerStep#")])
    it = find_steps(bare)
    assert it.method == "optimizer-steps" and len(it.steps) == len(opt)
    assert [s.kernels for s in it.steps] == [s.kernels for s in marked.steps]
    r = analyze_trace(bare)
    assert r.steps.workload == "training" and r.steps.phase == "train" and r.steps.count == len(opt)
