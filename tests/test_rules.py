"""Every rule: a fixture where it fires and one where it stays quiet.

Real traces wherever a shared trace shows the pattern. Where none does, the fixture is DERIVED from
real traces by a transformation written out in the helper that makes it (renaming real kernels,
moving real events in time, merging real events of two traces); each such test says so.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from clirun import invoke
from paths import H200, HTA, TRACELENS
from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.rules import RULES, rule_ids
from perfscope.analysis.rules.base import CONFIDENCE
from perfscope.analysis.steps import find_steps
from perfscope.load.model import Trace
from realtraces import real_analysis, real_trace

SGL_DECODE = TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz"
SGL_PREFILL = TRACELENS / "inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.xz"
VLLM_FULL = TRACELENS / "inference/vllm_decode_full/graph_execution.json.xz"
V100_NCCL = HTA / "df_index_resolver/df_index_resolver.json.xz"
CONTROL = HTA / "trace_diff/control/control.json.xz"
H100 = TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"


def findings(t: Trace, config: dict | None = None) -> dict[str, dict]:
    return {f.id: f.to_dict() for f in analyze_trace(t, config or {}).findings}


def real_findings(name) -> dict[str, dict]:
    """``findings`` of the real trace ``name`` as it is (its analysis shared by the session: realtraces)."""
    return {f.id: f.to_dict() for f in real_analysis(name).findings}


def check_finding(f: dict) -> None:
    """Every finding carries the same fields, filled."""
    assert f["id"] in rule_ids()
    assert f["confidence"] in CONFIDENCE
    assert f["ms_per_step"] > 0 and f["share"] > 0
    assert f["evidence"] and isinstance(f["evidence"], dict)
    assert f["summary"]
    assert f["fix"] is not None or f["remedy"], "a finding without a fix module must say what to do"
    assert f["predicted_step_ms_after_fix"] is None or f["predicted_step_ms_after_fix"] >= 0


# ---- derivations (each one a plain transformation of real events) ----------------------------

def renamed(t: Trace, pattern: str, new: str) -> Trace:
    """The same trace with the kernels whose name matches ``pattern`` renamed to ``new``."""
    rx = re.compile(pattern)
    return replace(t, kernels=[k._replace(name=new) if rx.search(k.name) else k for k in t.kernels])


def as_sglang_steps(t: Trace, label: str = "step[DECODE bs=1]") -> Trace:
    """ProfilerStep#N ranges renamed to SGLang's scheduler step annotation."""
    ann = [a._replace(name=label) if a.name.startswith("ProfilerStep#") else a for a in t.annotations]
    return replace(t, annotations=ann)


def shifted(t: Trace, dt: float, dc: int) -> Trace:
    """Every event of ``t`` moved by ``dt`` us, correlation and External ids offset by ``dc``."""
    def c(x):
        return None if x is None else (x if x < 0 else x + dc)
    return replace(
        t,
        kernels=[k._replace(ts=k.ts + dt, corr=c(k.corr), ext=c(k.ext)) for k in t.kernels],
        launches=[l._replace(ts=l.ts + dt, corr=c(l.corr), ext=c(l.ext)) for l in t.launches],
        cpu_ops=[o._replace(ts=o.ts + dt, ext=c(o.ext)) for o in t.cpu_ops],
        frames=[f._replace(ts=f.ts + dt) for f in t.frames],
        annotations=[a._replace(ts=a.ts + dt) for a in t.annotations])


def merged(parts: list[Trace]) -> Trace:
    out = Trace(meta=parts[0].meta)
    for p in parts:
        out.kernels += p.kernels
        out.launches += p.launches
        out.cpu_ops += p.cpu_ops
        out.frames += p.frames
        out.annotations += p.annotations
    out.kernels.sort(key=lambda k: k.ts)
    return out


def sglang_sequence(phases: list[tuple[str, float]]) -> Trace:
    """Real SGLang MI300X steps placed one after another: ("D", t) puts a copy of the DECODE trace at
    t seconds, ("E", t) a copy of the EXTEND (prefill) trace."""
    d, e = real_trace(SGL_DECODE), real_trace(SGL_PREFILL)
    d0 = min(a.ts for a in d.annotations)
    e0 = min(a.ts for a in e.annotations)
    parts = []
    for n, (kind, t_s) in enumerate(phases):
        src, t0 = (d, d0) if kind == "D" else (e, e0)
        parts.append(shifted(src, d0 + t_s * 1e6 - t0, (n + 1) * 10_000_000))
    return merged(parts)


def with_sort_every_step(t: Trace) -> Trace:
    """Each step of ``t`` followed by the real cub radix-sort kernels of one step of the A100
    control trace (same names and durations), launched by that step's launch."""
    c = real_trace(CONTROL)
    cs = find_steps(c).steps[1]
    sort = [c.kernels[i] for i in cs.kernels if "RadixSort" in c.kernels[i].name]
    assert sort
    extra = []
    for s in find_steps(t).steps:
        last = max((t.kernels[i] for i in s.kernels), key=lambda k: k.end)
        ts = last.end
        for k in sort:
            extra.append(last._replace(name=k.name, ts=ts, dur=k.dur, grid=k.grid, block=k.block))
            ts += k.dur + 1.0
    return replace(t, kernels=sorted(t.kernels + extra, key=lambda k: k.ts))


def slow_first_step(t: Trace, factor: float = 5.0) -> Trace:
    """The first step's kernels run ``factor`` times longer, one after the other (a cold first step)."""
    first = set(find_steps(t).steps[0].kernels)
    out, extra = [], 0.0
    for i, k in enumerate(t.kernels):
        if i in first:
            out.append(k._replace(ts=k.ts + extra, dur=k.dur * factor))
            extra += k.dur * (factor - 1)
        else:
            out.append(k)
    return replace(t, kernels=sorted(out, key=lambda k: k.ts))


# ---- the registry and the docs ----------------------------------------------------------------

def test_registry_ids_unique_and_documented():
    ids = rule_ids()
    assert len(ids) == len(set(ids))
    for want in ("fp8-kv-cast", "eager-decode", "nccl-allreduce", "warmup-in-window", "host-bubble",
                 "overlap-off", "torch-sampling", "untuned-fused-moe", "triton-block-fp8-gemm",
                 "chunked-prefill-interference"):
        assert want in ids
    for r in RULES:
        d = r.doc()
        for k in ("id", "title", "what", "why", "evidence", "remedy", "false_positives"):
            assert d[k], (r.id, k)


# ---- the lead's four rules --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_fp8_kv_cast_fires_on_pool_traces(mode):
    f = real_findings(H200 / f"mla_pool_{mode}.json.xz")["fp8-kv-cast"]
    check_finding(f)
    assert f["evidence"]["pool_tokens"] == 495000
    assert f["evidence"]["casts_per_step"] == 60
    assert f["fix"] == "fp8-kv-cast"


@pytest.mark.parametrize("name", ["mla_pages_eager", "mla_pages_graph", "mla_fp8_eager", "mla_fp8_graph"])
def test_fp8_kv_cast_quiet_on_fixed_traces(name):
    assert "fp8-kv-cast" not in real_findings(H200 / f"{name}.json.xz")


def test_eager_decode_fires_on_eager_traces():
    f = real_findings(H200 / "mla_fp8_eager.json.xz")["eager-decode"]
    check_finding(f)
    assert f["evidence"]["graph_launches_per_step"] == 0 and f["evidence"]["launches_per_step"] >= 100
    assert f["predicted_step_ms_after_fix"] < 0.5 * analyze_trace(real_trace(H200 / "mla_fp8_eager.json.xz")).steps.median_ms


@pytest.mark.parametrize("path", [H200 / "mla_fp8_graph.json.xz", H200 / "mla_pages_graph.json.xz",
                                  H200 / "mla_pool_graph.json.xz", SGL_DECODE, VLLM_FULL])
def test_eager_decode_quiet_on_graph_traces(path):
    assert "eager-decode" not in real_findings(path)


def test_nccl_allreduce_quiet_on_the_v100_training_rank():
    # a training rank's NCCL all-reduces are gradient syncs: no server-flag advice (tests/test_workload.py)
    assert "nccl-allreduce" not in real_findings(V100_NCCL)


def test_nccl_allreduce_fires_on_the_v100_nccl_kernels():
    # DERIVED: the V100 rank's real kernels with its autograd and optimizer markers removed, so that it
    # is analysed as inference: the rule's own logic on 2,020 real NCCL kernels
    t = real_trace(V100_NCCL)
    t = replace(t, cpu_ops=[o for o in t.cpu_ops if "Backward" not in o.name and "autograd" not in o.name
                            and not o.name.startswith("Optimizer.")],
                annotations=[a for a in t.annotations if not a.name.startswith("Optimizer.")])
    f = findings(t)["nccl-allreduce"]
    check_finding(f)
    assert f["evidence"]["nccl_allreduce_per_step"] > 0
    assert f["share"] > 0.15


@pytest.mark.parametrize("name", ["mla_pool_graph", "mla_pool_eager", "mla_fp8_graph", "mla_pages_eager"])
def test_nccl_allreduce_quiet_on_h200(name):
    assert "nccl-allreduce" not in real_findings(H200 / f"{name}.json.xz")


def test_nccl_allreduce_quiet_on_custom_allreduce_b200():
    assert "nccl-allreduce" not in real_findings(TRACELENS / "b200/eager_trace.json.xz")


def test_warmup_fires_on_a_cold_first_step():
    # DERIVED: mla_fp8_graph with its first step's kernels made 5x longer
    f = findings(slow_first_step(real_trace(H200 / "mla_fp8_graph.json.xz")))["warmup-in-window"]
    check_finding(f)
    assert f["evidence"]["outlier_steps"] == [0]


@pytest.mark.parametrize("path", [H200 / "mla_fp8_graph.json.xz", H100])
def test_warmup_quiet_on_steady_traces(path):
    # the H100 trace has 168 real cudaFuncGetAttributes calls in its step: 0.4 ms of 35, below the bar
    assert "warmup-in-window" not in real_findings(path)


# ---- host-bubble (real traces) ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["mla_fp8_graph", "mla_pages_graph"])
def test_host_bubble_fires_on_short_graph_steps(name):
    # real: each 7 ms graph replay waits ~1 ms for the profiled host loop that launches the next one.
    # The bubble that counts is the unprofiled one: with a bench whose step cycle is the profiled one
    # (the host as slow unprofiled), it fires with that bubble; without a bench the host's time scaled
    # by the profiler's measured slow-down (perfscope.analysis.hosttime) leaves less than 10% idle
    t = real_trace(H200 / f"{name}.json.xz")
    assert "host-bubble" not in findings(t)
    gpu = analyze_trace(t).steps.median_ms
    f = findings(t, {"bench": {"tpot_ms": gpu + 1.2, "concurrency": 1}})["host-bubble"]
    check_finding(f)
    ev = f["evidence"]
    assert 0.8 < ev["gap_between_steps_ms"] < 1.6 and ev["profiled_bubble_ms"] > 0.8
    assert ev["graph_replayed_fraction"] == 1.0
    assert ev["bubble_share_of_cycle"] >= 0.10 and ev["unprofiled"]["source"] == "bench"
    assert f["ms_per_step"] == pytest.approx(ev["unprofiled"]["idle_ms"], abs=1e-3)
    assert f["predicted_step_ms_after_fix"] == pytest.approx(ev["step_gpu_ms"] - ev["idle_inside_step_ms"], abs=1e-3)
    assert f["fix"] == "overlap-off"  # a benchmark loop: nothing says the overlap scheduler is on
    # a bench at the GPU work: the profiled bubble was the profiler's
    assert "host-bubble" not in findings(t, {"bench": {"tpot_ms": gpu, "concurrency": 1}})


@pytest.mark.parametrize("path", [H200 / "mla_pool_graph.json.xz", H200 / "mla_fp8_eager.json.xz", SGL_DECODE,
                                  HTA / "negative_queue_length_values_check/rank0.json.xz"])
def test_host_bubble_quiet(path):
    # pool: the same ~1 ms gap is 2% of a 57 ms step; eager: eager-decode's case; SGLang: one step;
    # the A100 training trace: a few graphs inside mostly eager steps
    assert "host-bubble" not in real_findings(path)


# ---- overlap-off (derived: real graph steps under SGLang's step annotation) -------------------

def test_overlap_off_fires_when_config_says_so():
    # DERIVED: mla_fp8_graph's ProfilerStep ranges renamed `step[DECODE bs=1]`; a bench whose step is the
    # GPU work plus 1.2 ms of serial host time per step
    t = as_sglang_steps(real_trace(H200 / "mla_fp8_graph.json.xz"))
    gpu = analyze_trace(t).steps.median_ms
    fs = findings(t, {"disable_overlap_schedule": True, "bench": {"tpot_ms": gpu + 1.2, "itl_p50_ms": gpu + 1.2}})
    f = fs["overlap-off"]
    check_finding(f)
    ev = f["evidence"]
    assert f["confidence"] == "high" and ev["disable_overlap_schedule"] is True
    assert 0.8 < ev["gap_between_steps_ms"] < 1.6
    assert "host-bubble" not in fs  # one cause, one finding
    # the idle is the bench's step less the GPU work, not the profiled gap; overlapped, the step is the GPU work
    assert ev["host_serial"]["source"] == "bench"
    assert f["ms_per_step"] == pytest.approx(gpu + 1.2 - ev["gpu_work_ms"], abs=1e-3)
    assert f["predicted_step_ms_after_fix"] == pytest.approx(ev["gpu_work_ms"], abs=1e-3)
    lo, hi = ev["prediction"]["range_ms"]
    assert lo < f["predicted_step_ms_after_fix"] < hi < gpu + 1.2
    # a host slower than the GPU work: the overlapped step is the host's
    slow = findings(t, {"disable_overlap_schedule": True, "bench": {"tpot_ms": 3 * gpu, "itl_p50_ms": 3 * gpu}})
    p = slow["overlap-off"]["evidence"]["prediction"]
    assert p["bound"] == "host" and p["predicted_step_ms"] == pytest.approx(3 * gpu - ev["gpu_work_ms"], abs=1e-3)


def test_overlap_off_idle_is_the_unprofiled_hosts():
    # the same trace, no bench: its 1.1 ms of profiled idle per step is the profiled host's; scaled by the
    # profiler's measured slow-down (hosttime.SCALE["full"]) it is ~0.4 ms, 6% of the cycle: no finding
    from perfscope.analysis.hosttime import SCALE
    from perfscope.analysis.rules.overlap_off import OverlapOff

    t = as_sglang_steps(real_trace(H200 / "mla_fp8_graph.json.xz"))
    assert "overlap-off" not in findings(t, {"disable_overlap_schedule": True})
    # a bench at the GPU work says the host hides nothing: no finding either
    gpu = analyze_trace(t).steps.median_ms
    assert "overlap-off" not in findings(t, {"disable_overlap_schedule": True, "bench": {"tpot_ms": gpu}})
    old = OverlapOff.MIN_SHARE
    try:  # below the threshold, the evidence: profiled idle x the scale
        OverlapOff.MIN_SHARE = 0.0
        ev = findings(t, {"disable_overlap_schedule": True})["overlap-off"]["evidence"]
    finally:
        OverlapOff.MIN_SHARE = old
    assert ev["host_serial"]["source"] == "full"
    assert ev["host_serial"]["point"] == pytest.approx(ev["profiled_idle_ms"] * SCALE["full"].point, abs=1e-3)
    assert ev["profiled_idle_ms"] > 0.8


def test_overlap_off_quiet_when_overlap_is_on_or_gap_small():
    t = as_sglang_steps(real_trace(H200 / "mla_fp8_graph.json.xz"))
    gpu = analyze_trace(t).steps.median_ms
    fs = findings(t, {"disable_overlap_schedule": False, "bench": {"tpot_ms": gpu + 1.2, "concurrency": 1}})
    assert "overlap-off" not in fs and "host-bubble" in fs  # overlap on, still a bubble (the bench says so)
    assert "overlap-off" not in findings(as_sglang_steps(real_trace(H200 / "mla_pool_graph.json.xz")),
                                         {"disable_overlap_schedule": True})
    assert "overlap-off" not in real_findings(SGL_DECODE)  # real SGLang, overlap kernels present


# ---- torch-sampling (derived) -----------------------------------------------------------------

def test_torch_sampling_fires_when_every_step_sorts():
    # DERIVED: each mla_fp8_graph step followed by the real radix-sort kernels of an A100 trace
    f = findings(with_sort_every_step(real_trace(H200 / "mla_fp8_graph.json.xz")), {"sampling_backend": "pytorch"})[
        "torch-sampling"]
    check_finding(f)
    assert f["evidence"]["steps_with_sort_fraction"] == 1.0
    assert f["confidence"] == "high"
    assert f["predicted_step_ms_after_fix"] < analyze_trace(real_trace(H200 / "mla_fp8_graph.json.xz")).steps.median_ms + f["ms_per_step"]


@pytest.mark.parametrize("path", [H200 / "mla_fp8_graph.json.xz", SGL_DECODE, CONTROL])
def test_torch_sampling_quiet(path):
    # SGLang decode samples with one argmax; the A100 control trace sorts each step but for 1.6%
    assert "torch-sampling" not in real_findings(path)


# ---- untuned-fused-moe (derived) ---------------------------------------------------------------

def test_untuned_fused_moe_fires():
    # DERIVED: vLLM decode with its MoE expert GEMMs (_matmul_ogs_*) renamed to Triton's fused_moe_kernel
    t = renamed(real_trace(VLLM_FULL), r"^_matmul_ogs_", "fused_moe_kernel")
    f = findings(t)["untuned-fused-moe"]
    check_finding(f)
    assert f["evidence"]["fused_moe_calls_per_step"] == 48
    assert f["share"] > 0.5


# DeepSeek-V2-Lite's MoE shape (its config.json's keys): 64 routed experts top-6, 2 shared, 1408 wide
V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
           "num_hidden_layers": 27, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_routed_experts": 64,
           "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "intermediate_size": 10944}


def test_untuned_fused_moe_names_the_missing_file_and_reads_the_log():
    # DERIVED as above, with SGLang's step labels; the log line in SGLang 0.5.13.post1's own wording
    from perfscope.analysis.moe_config import config_file_name

    t = renamed(real_trace(VLLM_FULL), r"^_matmul_ogs_", "fused_moe_kernel")
    t = replace(t, meta=replace(t.meta, device_name="NVIDIA H200"))  # the trace has no device name
    dev = t.meta.device_name
    want = config_file_name(64, 1408, dev)
    assert want == f"E=64,N=1408,device_name={dev.replace(' ', '_')}.json"
    f = findings(t, {"model_config": V2_LITE, "tp_size": 1, "floor_inputs": {"batch": 16}})["untuned-fused-moe"]
    ev = f["evidence"]
    assert ev["config_file"] == want and want in f["summary"]
    assert ev["moe_shape"] == {"E": 64, "N": 1408, "top_k": 6, "hidden": 2048, "moe_layers": 26}
    flops = 2 * 6 * (2048 * 2 * 1408 + 1408 * 2048) * 16 * 26
    assert ev["achieved_tflops"] == pytest.approx(flops / (ev["fused_moe_ms_per_step"] * 1e9), rel=1e-2)
    assert f["confidence"] == "medium" and any("server log" in x for x in ev["could_not_check"])
    log = ("[2026-12-01 10:00:00] Using default MoE kernel config. Performance might be sub-optimal! Config file not "
           f"found at /x/sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0/{want}, you can create them "
           "with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton\n")
    f = findings(t, {"model_config": V2_LITE, "server_log": log})["untuned-fused-moe"]
    assert f["confidence"] == "high" and f["evidence"]["server_log"][0]["kind"] == "default"
    found = f"[x] Using MoE kernel config from /x/configs/triton_3_6_0/{want}.\n"
    assert "untuned-fused-moe" not in findings(t, {"model_config": V2_LITE, "server_log": found})
    other = found.replace("E=64,N=1408", "E=8,N=7168")  # a tuned config of another shape decides nothing
    f = findings(t, {"model_config": V2_LITE, "server_log": other})["untuned-fused-moe"]
    assert f["confidence"] == "medium" and any("none for" in x for x in f["evidence"]["could_not_check"])
    # TP 2 halves N: the file SGLang wants then is N=704
    f = findings(t, {"model_config": V2_LITE, "tp_size": 2})["untuned-fused-moe"]
    assert f["evidence"]["config_file"].startswith("E=64,N=704,")


def test_untuned_fused_moe_quiet_on_other_moe_kernels():
    assert "untuned-fused-moe" not in real_findings(VLLM_FULL)
    assert "untuned-fused-moe" not in real_findings(H200 / "mla_fp8_graph.json.xz")


# ---- triton-block-fp8-gemm (derived) ------------------------------------------------------------

def test_triton_block_fp8_gemm_fires():
    # DERIVED: the H200 trace's nvjet GEMMs renamed to SGLang's Triton block-FP8 kernel
    t = renamed(real_trace(H200 / "mla_fp8_graph.json.xz"), r"^nvjet_", "_w8a8_block_fp8_matmul")
    f = findings(t)["triton-block-fp8-gemm"]
    check_finding(f)
    assert f["evidence"]["deepgemm_supported_gpu"] is True and f["confidence"] == "high"
    assert f["evidence"]["calls_per_step"] == 120


def test_triton_block_fp8_gemm_quiet():
    assert "triton-block-fp8-gemm" not in real_findings(H200 / "mla_fp8_graph.json.xz")
    assert "triton-block-fp8-gemm" not in real_findings(SGL_DECODE)


# ---- chunked-prefill-interference (derived) ------------------------------------------------------

def test_chunked_prefill_fires_when_extend_runs_between_decodes():
    # DERIVED: copies of the real SGLang MI300X DECODE step 1 s apart, with the real EXTEND step of
    # the prefill trace placed between the third and the fourth
    t = sglang_sequence([("D", 0), ("D", 1), ("D", 2), ("E", 3), ("D", 4.5), ("D", 5.5)])
    a = analyze_trace(t)
    assert {p["phase"]: p["count"] for p in a.phases} == {"decode": 5, "prefill": 1}
    f = {x.id: x.to_dict() for x in a.findings}["chunked-prefill-interference"]
    check_finding(f)
    ev = f["evidence"]
    assert ev["prefill_steps_between_decodes"] == 1 and ev["decode_steps"] == 5
    assert ev["decode_interval_max_ms"] >= 2 * ev["decode_interval_median_ms"]
    assert ev["stalled_intervals"] == 1


def test_chunked_prefill_quiet():
    assert "chunked-prefill-interference" not in findings(sglang_sequence([("D", 0), ("D", 1), ("D", 2)]))
    # the prefill comes first: nothing is interrupted
    assert "chunked-prefill-interference" not in findings(sglang_sequence([("E", 0), ("D", 1), ("D", 2), ("D", 3)]))
    assert "chunked-prefill-interference" not in real_findings(SGL_PREFILL)


# ---- no rule fires without reason on the real traces --------------------------------------------

@pytest.mark.parametrize("path", [SGL_DECODE, VLLM_FULL, TRACELENS / "b200/eager_trace.json.xz", H100,
                                  TRACELENS / "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"])
def test_healthy_real_traces_have_no_findings(path):
    assert real_findings(path) == {}


def test_new_rules_run_on_every_shared_trace_without_error():
    from paths import TRACES
    for p in sorted(TRACES.rglob("*.json.xz")):
        if "120steps" in p.name or "_et." in p.name or "908_results" in p.name:  # the last two: not Kineto
            continue
        for f in real_findings(p).values():
            check_finding(f)


# ---- `perfscope rules` and docs/rules.md ---------------------------------------------------------

def test_docs_rules_md_is_generated_and_current():

    from paths import REPO
    r = invoke("rules", "--markdown")
    assert r.returncode == 0, r.stderr
    doc = (REPO / "docs" / "rules.md").read_text()
    assert doc == r.stdout, "docs/rules.md is stale: run `perfscope rules --markdown > docs/rules.md`"
    for rid in rule_ids():
        assert f"## {rid}" in doc


def test_rules_json_and_table():
    import json
    r = invoke("rules", "--json")
    assert r.returncode == 0
    assert [d["id"] for d in json.loads(r.stdout)["rules"]] == rule_ids()
    r = invoke("rules")
    assert r.returncode == 0 and "fp8-kv-cast" in r.stdout


def test_deepgemm_check_reads_vendor_and_compute_capability():
    # real trace metadata: an AMD MI210 reports compute capability "9.0"; the B300 is 10.3
    from perfscope.analysis.rules.triton_block_fp8_gemm import deepgemm_supported

    assert real_trace(TRACELENS / "mi210/gpu_only_trace/gpu_only_trace.json.xz").meta.compute_capability == "9.0"
    assert not deepgemm_supported(real_trace(TRACELENS / "mi210/gpu_only_trace/gpu_only_trace.json.xz").meta)
    assert not deepgemm_supported(real_trace(TRACELENS / "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz").meta)
    b300 = real_trace(TRACELENS.parent.parent / "evals/unit_tests_nv/moe/nv_moe_01_many_experts_few_tokens.json.xz").meta
    assert b300.compute_capability == "10.3" and deepgemm_supported(b300)
    assert deepgemm_supported(real_trace(H200 / "mla_fp8_graph.json.xz").meta)
    assert deepgemm_supported(real_trace(TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz").meta)


def test_overlap_off_reads_sglang_0_5_23_scheduler_loop_from_its_python_frames():
    """Real SGLang 0.5.23 on the H200 (examples/gpu_loop/results/h200-2026-12-01-sglang), overlap
    scheduler ON (server_info: disable_overlap_schedule false). 0.5.23 no longer runs a
    `resolve_future_token_ids` kernel (the next input ids are a plain gather from its FutureMap), so
    the bare trace file (no server config) got overlap-off "no overlap-scheduler kernels were seen"
    on every run. Its Python frames name the loop: `scheduler.py(..): event_loop_overlap`."""
    import json

    from paths import GPU_LOOP, REPO

    run = GPU_LOOP / "h200-2026-12-01-sglang/pool495000-pages/runs/495000-pages"
    assert json.loads((run / "run.json").read_text())["server_info"]["disable_overlap_schedule"] is False
    t = real_trace(next((run / "traces").glob("*-DECODE.trace.json.xz")))
    assert not any("resolve_future_token_ids" in k.name for k in t.kernels)
    assert any(f.name.endswith(": event_loop_overlap") for f in t.frames)
    fs = findings(t)
    assert "overlap-off" not in fs and "host-bubble" in fs  # the gap is real, overlap is on: a host bubble
    # ... whose fix is not `perfscope fix overlap-off` (already on), and which, hidden, leaves the GPU work:
    # 0.93 ms per step measured (compare-bug-vs-pages.json), not the 3.06 ms profiled step
    hb = fs["host-bubble"]
    assert hb["fix"] is None and hb["evidence"]["overlap_scheduler_on"] is True
    ev = hb["evidence"]
    assert hb["predicted_step_ms_after_fix"] == pytest.approx(ev["step_gpu_ms"] - ev["idle_inside_step_ms"], abs=1e-3)
    assert hb["predicted_step_ms_after_fix"] < 0.6 * ev["step_gpu_ms"]
    # the same server's CPU trace ran the normal loop (overlap off on CPU): the frames say so
    from perfscope.analysis.rules.shared import scheduler_loop
    assert scheduler_loop(real_trace(REPO / "tests/fixtures/real-sglang-0.5.23-cpu-TP-0-DECODE.trace.json.gz")) == "normal"
    assert scheduler_loop(t) == "overlap"
    assert scheduler_loop(real_trace(H200 / "mla_fp8_graph.json.xz")) is None  # no scheduler: no evidence


def test_diagnose_server_log_option(tmp_path):
    # --server-log: a missing file is one line, exit 2; a log is read (its tail) into the rule's facts

    from paths import KERNEL_MIX
    t = KERNEL_MIX / "sample_argmax.json.gz"
    r = invoke("diagnose", t, "--json", "--server-log", tmp_path / "nope.log")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no such file" in r.stderr
    r = invoke("diagnose", t, "--json", "--server-log", tmp_path)
    assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr
    log = tmp_path / "server.log"
    log.write_text("x" * 100 + "\nUsing MoE kernel config from /a/E=1,N=2,device_name=X.json.\n")
    r = invoke("diagnose", t, "--json", "--server-log", log)
    assert r.returncode == 0, r.stderr
    from perfscope.analysis.moe_config import read_log
    assert read_log(log).endswith("device_name=X.json.\n")
