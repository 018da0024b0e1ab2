"""Hugging Face model forwards are not decode steps, and eager-decode judges them by one threshold.

Real traces: TraceLens' H100 forwards of BERT-small, a ViT classifier, the OWLv2 detector and the TimeSformer video classifier
(tests/traces/tracelens-hf, profiled with stacks, shapes and memory), TraceLens' H100 and MI300X
Qwen1.5-0.5B forward, and the eager H200 decode traces of this project beside them. Each test
recounts from the raw JSON by name what it asserts perfscope found.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from paths import H200, KERNEL_MIX, REPO, TRACELENS, raw_json
from realtraces import real_diagnosis

HF = REPO / "tests" / "traces" / "tracelens-hf"
BERT = HF / "gaunernst_bert-small-uncased__1016001.json.gz"
VIT = HF / "Falconsai_nsfw_image_detection__1016002.json.gz"
OWLV2 = HF / "google_owlv2-large-patch14-ensemble__1016001.json.gz"
TIMESFORMER = HF / "facebook_timesformer-base-finetuned-k400__1016002.json.gz"
QWEN_FORWARDS = [TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz",
                 TRACELENS / "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"]


@lru_cache(maxsize=None)
def diag(path: Path) -> dict:
    return real_diagnosis(path).to_dict()


@lru_cache(maxsize=None)
def recount(path: Path) -> dict:
    """From the raw JSON, by name: the ProfilerStep's kernel launches and the GPU work they launched
    (span, busy union, idle), and the Python functions of transformers' model files."""
    ev = raw_json(path)["traceEvents"]
    step = next(e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    calls = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and t0 <= e["ts"] <= t1
             and any(s in e["name"] for s in ("LaunchKernel", "Memcpy", "Memset"))]
    launches = [e for e in calls if "LaunchKernel" in e["name"]]
    corr = {e["args"]["correlation"] for e in calls}
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                 and e.get("args", {}).get("correlation") in corr)
    busy, end = 0.0, None
    for s, e in gpu:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    span = gpu[-1][1] - gpu[0][0]
    archs = sorted({e["name"].split("transformers/models/")[1].split("/")[0] for e in ev
                    if e.get("cat") == "python_function" and "transformers/models/" in e["name"]
                    and "/modeling_" in e["name"]})
    llm = [e["name"] for e in ev if e.get("cat") == "kernel" and any(
        s in e["name"] for s in ("reshape_and_cache", "flashinfer", "topk_topp", "sampling_from"))]
    return {"launches": len(launches), "span_us": span, "idle_us": span - busy, "archs": archs,
            "llm_kernels": llm, "frames_of_engines": sum(1 for e in ev if e.get("cat") == "python_function"
                                                        and ("vllm/" in e["name"] or "sglang/" in e["name"]))}


@pytest.mark.parametrize("path", [BERT, VIT, OWLV2, TIMESFORMER] + QWEN_FORWARDS, ids=lambda p: p.name[:24] + p.parent.name)
def test_hf_forwards_are_inference_not_decode(path):
    # one forward of a transformers model per ProfilerStep (no serving engine, no generate loop): was
    # `phase: decode` ("ProfilerStep ranges taken as decode steps"), OWLv2 even `llm-inference`
    r = recount(path)
    assert r["archs"] and r["frames_of_engines"] == 0 and r["llm_kernels"] == []
    st = diag(path)["steps"]
    assert st["workload"] == "inference" and st["workload_model"] == "transformers", st["workload_how"]
    assert st["phase"] == "inference" and st["method"] == "ProfilerStep"
    assert st["workload_evidence"]["transformers_models"] == r["archs"]
    assert "(taken as decode steps)" not in st["how"]
    assert any(n.startswith("This is Hugging Face transformers model forwards") for n in diag(path)["notes"])


def test_owlv2_argmax_is_not_llm_sampling_evidence():
    # its only kernel read as "sampling" is an int ArgMax reduce of the detector's post-processing
    r = recount(OWLV2)
    assert r["archs"] == ["owlv2"]
    d = diag(OWLV2)
    assert d["steps"]["workload"] != "llm-inference"
    assert "KV-cache / sampling" not in d["steps"]["workload_how"]


@pytest.mark.parametrize("path", [BERT, VIT])
def test_launch_bound_hf_forwards_get_eager_decode_without_a_server_fix(path):
    # BERT-small: 60 launches, 92% idle (was silent: under 100 launches); the ViT: 154 launches, 84%
    # idle (was flagged, with SGLang's launch-flag fix). One threshold (the idle share), no server fix.
    r = recount(path)
    d = diag(path)
    f = next(f for f in d["findings"] if f["id"] == "eager-decode")
    ev = f["evidence"]
    assert ev["launches_per_step"] == r["launches"]
    assert ev["idle_ms_per_step"] == pytest.approx(r["idle_us"] / 1e3, abs=0.01)
    assert ev["idle_share"] == pytest.approx(r["idle_us"] / r["span_us"], abs=0.005)
    assert ev["idle_share"] >= 0.2 and ev["idle_per_launch_us"] <= 100
    assert ev["server"] is False
    assert f["fix"] is None and f["fix_command"] is None
    assert "torch.compile" in f["remedy"] and "--disable-cuda-graph" not in f["remedy"]
    assert f["summary"].startswith("The forward pass runs eagerly")


def test_host_work_under_a_heavy_profiler_is_not_launch_cost():
    # OWLv2 under stacks + shapes + memory profiling: ~118 us of GPU idle per launch, host work between
    # the launches (HTA: host_wait), not launch cost: no eager-decode (it predicted the kernel-only time)
    r = recount(OWLV2)
    assert r["idle_us"] / r["launches"] > 100 and r["idle_us"] / r["span_us"] > 0.4
    d = diag(OWLV2)
    assert not any(f["id"] == "eager-decode" for f in d["findings"])
    note = next(n for n in d["notes"] if "us per kernel launch: host work between the launches" in n)
    assert f"{r['idle_us'] / r['launches']:.0f} us per kernel launch" in note


@pytest.mark.parametrize("path", [H200 / "mla_fp8_eager.json.xz", H200 / "mla_pages_eager.json.xz",
                                  KERNEL_MIX / "fi_decode_eager.json.gz", KERNEL_MIX / "triton_norm_rope_eager.json.gz"],
                         ids=lambda p: p.name)
def test_eager_decode_loops_keep_their_server_fix(path):
    # the eager decode loops (no transformers frames): launch cost, 19-62 us idle per launch, the fix kept
    d = diag(path)
    assert d["steps"]["workload"] == "llm-inference" and d["steps"]["phase"] == "decode"
    f = next(f for f in d["findings"] if f["id"] == "eager-decode")
    assert f["evidence"]["idle_per_launch_us"] <= 100 and f["evidence"]["server"] is True
    assert f["fix"] == "eager-decode"
