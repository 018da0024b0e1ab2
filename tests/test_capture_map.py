"""Graph-replay attribution by a capture trace, on the two real pairs TraceLens ships:
SGLang (MI300X, Qwen3-8B decode, bs 32, HIP graph) and vLLM (full-graph decode, bs 32)."""

from __future__ import annotations

import json

import pytest

from clirun import invoke
from paths import H200, TRACELENS
from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.capture_map import CaptureSet, align, load_capture, node_key
from perfscope.analysis.diagnose import diagnose
from realtraces import real_diagnosis
from perfscope.errors import InputError
from perfscope.load.reader import load_trace

INF = TRACELENS / "inference"
SGL = INF / "sglang_decode/sglang_Qwen3-8B_decode.json.xz"
SGL_CAP = INF / "sglang_decode/capture_traces/bs_32_rank0.json.xz"
VLLM = INF / "vllm_decode_full/graph_execution.json.xz"
VLLM_CAP_DIR = INF / "vllm_decode_full/capture_traces"
PIECEWISE = INF / "vllm_prefilldecode_piecewise/graph_execution.json.xz"


def test_capture_trace_holds_one_graph_of_named_launches():
    (g,) = load_capture(SGL_CAP)
    assert g.label == "capture_32_DECODE"
    assert len(g.launches) == 544  # the replay's graph has 544 kernels
    assert all(l.runtime in ("hipLaunchKernel", "hipExtModuleLaunchKernel") for l in g.launches)
    assert any(k.startswith("Cijk_") for k in g.keys)
    a = g.attribution(next(i for i, k in enumerate(g.keys) if k.startswith("Cijk_")))
    assert a.op_chain[-1] == "aten::mm" and "aten::linear" in a.op_chain
    assert a.input_dims and a.source


def test_sglang_replay_is_mapped_kernel_for_kernel():
    trace = load_trace(SGL)
    rm = CaptureSet.load([SGL_CAP]).map_trace(trace)
    assert (rm.replays, rm.replays_mapped) == (1, 1)
    assert rm.kernels == rm.kernels_mapped == 544
    assert dict(rm.methods) == {"positional": 1}


def test_sglang_ops_table_gets_op_chain_shapes_and_source():
    without = real_diagnosis(SGL).to_dict()
    top0 = without["ops"][0]
    assert top0["graph_replay"] and not top0["op_chain"] and top0["source"] is None

    d = diagnose([SGL], capture=[SGL_CAP]).to_dict()
    assert any("544 of 544 kernels" in n for n in d["notes"])
    by_short = {}
    for o in d["ops"]:
        by_short.setdefault(o["short"], o)
    assert all(o["op_chain"] for o in d["ops"] if o["graph_replay"])
    gemm = d["ops"][0]
    assert gemm["bucket"] == "gemm" and gemm["captured"] == "capture_32_DECODE"
    assert gemm["op_chain"][-3:] == ["aten::linear", "aten::matmul", "aten::mm"]
    assert [32, 4096] in gemm["input_dims"]
    assert gemm["source"].startswith("aiter/tuned_gemm.py(")
    attn = by_short["paged_attention_ll4mi_QKV_mfma16_kernel"]
    assert "paged_attention" in attn["op_chain"][-1]
    silu = by_short["sgl_hip::activation::act_and_mul_kernel"]
    assert silu["op_chain"] == ["sgl_kernel::silu_and_mul"]
    # the lm_head GEMM runs once per step and comes from the logits processor
    lm = next(o for o in d["ops"] if o["count_per_step"] == 1 and o["bucket"] == "gemm")
    assert "logits_processor.py" in lm["source"]


def test_vllm_full_graph_from_a_capture_folder():
    d = diagnose([VLLM], capture=[VLLM_CAP_DIR]).to_dict()
    assert any("421 of 421 kernels" in n and "capture_32_FULL" in n for n in d["notes"]), d["notes"]
    moe = d["ops"][0]
    assert (moe["bucket"], moe["sub"]) == ("moe", "gemm") and moe["op_chain"] == ["vllm::moe_forward"]
    attn = next(o for o in d["ops"] if o["bucket"] == "attention")
    assert attn["op_chain"] == ["vllm::unified_attention_with_output"]
    gemm = next(o for o in d["ops"] if o["short"].startswith("Cijk_"))
    assert gemm["op_chain"][-1] == "aten::addmm"
    assert gemm["source"].startswith("vllm/model_executor/layers/utils.py(")
    # launcher plumbing (triton's driver) is never the source line shown
    assert not any((o.get("source") or "").startswith("triton/") for o in d["ops"])


def test_a_capture_of_another_graph_maps_only_what_matches():
    # piecewise replays against the full-graph capture: names match only in part, so the greedy
    # scan maps some kernels and the note says how many and how
    rm = CaptureSet.load([VLLM_CAP_DIR]).map_trace(load_trace(PIECEWISE))
    assert rm.replays == 25
    assert 0 < rm.kernels_mapped < rm.kernels
    assert set(rm.methods) <= {"greedy"}


def test_unmatched_capture_leaves_replay_unattributed():
    # the SGLang capture has none of vLLM's kernels
    d = analyze_trace(load_trace(VLLM), capture=CaptureSet.load([SGL_CAP]))
    assert any("0 of 421 kernels" in n for n in d.notes)
    assert all(not o.attribution.op_chain for o in d.ops if o.attribution.graph_replay)


def test_alignment_methods():
    assert align(["a", "b", "c"], ["a", "b", "c"]) == ("positional", [0, 1, 2])
    # two streams: same names and counts, GPU order differs from program order
    assert align(["a", "b", "a", "c"], ["a", "a", "b", "c"]) == ("by-name", [0, 2, 1, 3])
    # extra launches in the capture are skipped; a kernel the capture lacks stays unmapped
    assert align(["x", "a", "y", "b"], ["a", "b", "z"]) == ("greedy", [1, 3, None])
    assert node_key("Memcpy DtoD (Device -> Device)", "memcpy") == node_key("hipMemcpyAsync") == "memcpy"


def test_not_a_capture_trace_is_refused_clearly():
    with pytest.raises(InputError, match="not a graph-capture trace"):
        load_capture(H200 / "mla_pool_graph.json.xz")


def test_cli_option(tmp_path):
    r = invoke("diagnose", SGL, "--capture-trace", SGL_CAP, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ops"][0]["op_chain"]
    r = invoke("diagnose", SGL, "--capture-trace", H200 / "mla_pool_graph.json.xz", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "not a graph-capture trace" in r.stderr
