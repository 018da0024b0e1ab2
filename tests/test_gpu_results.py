"""The traces the H200 loop brought back (examples/gpu_loop/results/h200-2026-11-29: the reproduction
server on CUDA with CUDA graphs, 60 layers, a 495,000-token FP8 pool) analysed here on the CPU: a
trace of the same kind as tests/traces/corpus/h200-mla-fp8-kv but from another program."""

from __future__ import annotations

import json

import pytest

from paths import REPO
from perfscope.analysis.compare import compare
from perfscope.analysis.diagnose import diagnose
from realtraces import real_diagnosis

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

RESULTS = REPO / "examples" / "gpu_loop" / "results"
# two pool sizes: 495,000 tokens (the notes' setup) and 250,000 (a size the rule was not tuned on);
# and the 495,000-token server with SGLang's overlap scheduler (the final loop)
SETS = [RESULTS / "h200-2026-11-29" / "runs", RESULTS / "h200-2026-11-29-pool250k" / "runs",
        RESULTS / "h200-2026-11-29-overlap" / "runs"]
IDS = ["pool495k", "pool250k", "overlap"]


def _bench_tpot(runs, run: str) -> float:
    return json.loads((runs / run / "bench.json").read_text())["tpot_ms"]


@pytest.mark.parametrize("RUNS", SETS, ids=IDS)
def test_bug_run_top_finding_and_prediction_against_both_fixes(RUNS):
    d = real_diagnosis(RUNS / "bug").to_dict()
    f = d["findings"][0]
    assert f["id"] == "fp8-kv-cast" and f["confidence"] == "high"
    pool = d["run"]["server_info"]["max_total_num_tokens"]
    assert f["evidence"]["pool_tokens"] in (pool, pool + 1)  # SGLang's pool has one extra row (slot 0)
    assert f["evidence"]["casts_per_step"] == 60
    for fixed in ("native", "pages"):
        assert f["predicted_step_ms_after_fix"] == pytest.approx(_bench_tpot(RUNS, fixed), rel=0.20), fixed


@pytest.mark.parametrize("RUNS", SETS, ids=IDS)
def test_bug_trace_alone_without_server_config_still_fires(RUNS):
    trace = next((RUNS / "bug" / "traces").glob("*DECODE*.json.xz"))
    d = real_diagnosis(trace).to_dict()
    assert d["findings"] and d["findings"][0]["id"] == "fp8-kv-cast"


@pytest.mark.parametrize("RUNS", SETS, ids=IDS)
@pytest.mark.parametrize("run", ["native", "pages"])
def test_fixed_runs_have_no_cast_and_compare_uses_bench_tpot(RUNS, run):
    after = real_diagnosis(RUNS / run)
    assert "fp8-kv-cast" not in [x.id for x in after.primary.findings]
    c = compare(real_diagnosis(RUNS / "bug"), after)
    assert c["tpot"]["before_ms"] == pytest.approx(_bench_tpot(RUNS, "bug"), abs=1e-3)  # not the profiled 78 ms
    assert c["tpot"]["after_ms"] == pytest.approx(_bench_tpot(RUNS, run), abs=1e-3)
    assert "fp8-kv-cast" in [f["id"] for f in c["findings"]["gone"]]


def test_final_loop_meets_issue_7_targets():
    """The overlap run: the fix cuts TPOT >= 6x, the prediction is within 20%, the fixed step names
    the bucket above its floor, and fp8-kv-cast is the top finding before and gone after."""
    runs = SETS[2]
    bug = real_diagnosis(runs / "bug").to_dict()
    assert bug["findings"][0]["id"] == "fp8-kv-cast"
    predicted = bug["findings"][0]["predicted_step_ms_after_fix"]
    for fixed in ("native", "pages"):
        assert _bench_tpot(runs, "bug") / _bench_tpot(runs, fixed) >= 6.0
        assert predicted == pytest.approx(_bench_tpot(runs, fixed), rel=0.20)
        after = real_diagnosis(runs / fixed).to_dict()
        assert "fp8-kv-cast" not in [f["id"] for f in after["findings"]]
        assert after["floor"]["available"] and after["floor"]["worst_bucket"]


@pytest.mark.parametrize("RUNS", SETS[:2], ids=IDS[:2])
@pytest.mark.parametrize("run", ["native", "pages"])
def test_overlap_off_on_the_fixed_servers_predicts_the_overlap_runs_tpot(RUNS, run):
    """The fixed servers of the first two sets ran without the overlap scheduler (run.json:
    disable_overlap_schedule true): their bench's step (9.3-10.2 ms) is the GPU work (~7.8 ms) plus the
    host's serial work. overlap-off reads that idle from the bench, not from the profiled trace, and
    predicts the step with the overlap scheduler on: the larger of the two. The overlap set is the same
    server and fix with the overlap scheduler on (another process on the same kind of machine), so its
    bench measured what the prediction promises: within 5% (measured -0.4% to -1.2%), inside the range."""
    d = real_diagnosis(RUNS / run).to_dict()
    assert d["run"]["server_info"]["disable_overlap_schedule"] is True
    f = {x["id"]: x for x in d["findings"]}["overlap-off"]
    ev = f["evidence"]
    assert ev["host_serial"]["source"] == "bench" and f["confidence"] == "high"
    bench = json.loads((RUNS / run / "bench.json").read_text())
    # the idle is the bench's step less the GPU work, and far below the profiled one's cycle
    assert f["ms_per_step"] == pytest.approx(bench["itl_p50_ms"] - ev["gpu_work_ms"], abs=2e-3)
    assert ev["profiled_cycle_ms"] > bench["itl_p50_ms"]
    measured = _bench_tpot(SETS[2], run)  # overlap on
    assert f["predicted_step_ms_after_fix"] == pytest.approx(measured, rel=0.05)
    lo, hi = ev["prediction"]["range_ms"]
    assert lo <= measured <= hi
    assert f["fix"] == "overlap-off"


def test_overlap_runs_have_no_overlap_off():
    """With the overlap scheduler on, no fixed server of the overlap set gets overlap-off."""
    for run in ("native", "pages"):
        d = real_diagnosis(SETS[2] / run).to_dict()
        assert "overlap-off" not in [x["id"] for x in d["findings"]]


# the real SGLang 0.5.13.post1 on the H200 with --disable-cuda-graph (examples/gpu_loop/sglang/eager_run.py):
# a bug run folder per concurrency (bench, GPU-only profile, full trace) and the TPOTs the server measured
# after `perfscope fix eager-decode --apply --restart-cmd` removed the flag (every bench of the fixed process
# taken before its trace, and the fresh bench of a second process start where the call had time for it);
# the dense model, and the MoE one (DeepSeek-V2-Lite shape), whose runs were not used to build the model
EAGER = {"dense": RESULTS / "h200-2026-12-03-eager", "moe": RESULTS / "h200-2026-12-03-eager-moe"}


def _fixed_bench_medians(folder, conc: int) -> list[float]:
    R = json.loads((folder / "summary.json").read_text())["fixed"]
    got = [R[k]["tpot_ms"] for k in (f"bench_c{conc}", f"start2_bench_c{conc}") if R.get(k)]
    if conc == 1:
        got += [b["tpot_ms"] for b in R.get("before_trace_c1") or []]
    return sorted(got)


# |predicted - measured| / measured allowed: the MoE model at 16 requests runs more host work per step
# under the profiler than the scale assumes (predicted 2.45 ms, measured 1.66 ms; inside the range)
EAGER_ERR = {("dense", 1): 0.25, ("dense", 16): 0.25, ("moe", 1): 0.25, ("moe", 16): 0.5}


@pytest.mark.parametrize("model,conc", sorted(EAGER_ERR))
def test_eager_decode_on_the_real_sglang_fires_and_predicts_the_graph_tpot(model, conc):
    run = EAGER[model] / "runs" / f"eager-c{conc}" / "bug"
    d = real_diagnosis(run).to_dict()
    f = next((x for x in d["findings"] if x["id"] == "eager-decode"), None)
    # profiled, the GPU idles 110-160 us per launch (over the host-work threshold); the bench's step says
    # 43-70 us without the profiler: launch-bound, and CUDA graphs made the server 3.4-14x faster
    assert f is not None, [x["id"] for x in d["findings"]]
    ev = f["evidence"]
    assert ev["idle_per_launch_us"] > 100 >= ev["unprofiled_idle_per_launch_us"]
    p = ev["prediction"]
    assert p["graph_kept_host"]["frame"].startswith("sglang/srt/models/deepseek_v2.py")
    meas = _fixed_bench_medians(EAGER[model], conc)
    mid = meas[len(meas) // 2]
    bug = json.loads((run / "bench.json").read_text())["tpot_ms"]
    assert bug > 3 * mid  # the fix's effect, measured (3.4-14x)
    assert f["predicted_step_ms_after_fix"] == pytest.approx(mid, rel=EAGER_ERR[(model, conc)])
    # the median bench inside the range (one of the dense model's five benches at one request, a second
    # process start's 1.91 ms, lies above its 1.81 ms)
    assert p["range_ms"][0] <= mid <= p["range_ms"][1], (p["range_ms"], meas)


def test_eager_decode_host_model_beats_the_kernel_time_on_the_dense_model():
    # the dense model's fixed TPOT is twice its kernel time: the kernel-only answer (the old one) is -50%
    for conc in (1, 16):
        d = diagnose([EAGER["dense"] / "runs" / f"eager-c{conc}" / "bug"]).to_dict()
        p = next(x for x in d["findings"] if x["id"] == "eager-decode")["evidence"]["prediction"]
        meas = _fixed_bench_medians(EAGER["dense"], conc)
        mid = meas[len(meas) // 2]
        assert p["kernel_only_prediction_ms"] < 0.6 * mid < p["predicted_step_ms"]
        assert p["bound"] == "host"


def test_eager_decode_without_the_bench_reads_the_profiled_idle_as_host_work():
    # the same trace without its bench: 110 us of profiled idle per launch is over the threshold (no
    # finding), and the note says why
    run = EAGER["dense"] / "runs" / "eager-c1" / "bug"
    d = diagnose([run], config={"bench": None}).to_dict()
    assert "eager-decode" not in [x["id"] for x in d["findings"]]
    assert any("not launch cost" in n for n in d.get("notes", []) + d["ranks"][0].get("notes", [])), d.get("notes")
