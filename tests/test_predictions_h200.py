"""Predicted vs measured TPOT on the real SGLang on the H200 (examples/gpu_loop/results/
h200-2026-12-01-predict, made by examples/gpu_loop/sglang/predict_run.py): an unmodified SGLang
0.5.13.post1, DeepSeek-V2-shaped MLA models (8 dense layers; 12 layers of which 10 MoE, 64 experts
top-6, 2 shared), FP8 KV pools of 495k and 3M tokens, concurrency 1 and 16. Each case folder holds
the bug's run folder (bench without any profiler, its GPU-only host-timing profile, the full trace)
and the fixed server's (after `perfscope fix fp8-kv-cast --apply --restart-cmd`: a fresh bench and a
trace). Everything is recomputed here from those files on the CPU."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-01-predict"
sys.path.insert(0, str(REPO / "examples" / "gpu_loop" / "sglang"))
from predict_table import rows  # noqa: E402

from perfscope.analysis.diagnose import diagnose  # noqa: E402


@pytest.fixture(scope="module")
def table():
    return {r["case"]: r for r in rows(RESULTS)}


def test_every_case_is_predicted_from_its_gpu_only_profile(table):
    assert len(table) == 8
    for r in table.values():
        assert r["host_source"] == "gpu-only" and r["predicted_ms"] and r["range_ms"][0] < r["range_ms"][1], r


def test_median_error_within_5_percent_and_batch_1_within_5(table):
    errs = [abs(r["error_pct"]) for r in table.values()]
    assert statistics.median(errs) <= 5.0, errs
    for r in table.values():
        if r["concurrency"] == 1:  # one request at a time: TPOT is the decode step
            assert abs(r["error_pct"]) <= 5.0, r
    # at 16 in flight the one outside 15% is the server whose own benches spread 1.16-1.85 ms
    assert sum(abs(r["error_pct"]) > 15 for r in table.values()) <= 1


def test_moe_fix_is_not_predicted_as_no_gain(table):
    # the 10-layer MoE step: the profiled host (5.4 ms per step) looked like it would hold the fixed step
    # and the replay kept the shared experts' stream where it was: "11.9 ms, no gain" for a 6.7x fix
    for pool in (495000, 3000000):
        r = table[f"moe-{pool}-c1"]
        assert r["bug_tpot_ms"] / r["predicted_ms"] > 6 and r["bound"] == "gpu"
        assert r["range_ms"][0] <= r["measured_ms"] <= r["range_ms"][1]


def test_dense_fix_is_host_bound_and_the_host_is_the_unprofiled_one(table):
    for pool in (495000, 3000000):
        r = table[f"dense-{pool}-c1"]
        assert r["bound"] == "host" and r["range_ms"][0] <= r["measured_ms"] <= r["range_ms"][1], r
        d = diagnose([RESULTS / f"dense-{pool}-c1" / "bug"]).to_dict()
        p = next(f for f in d["findings"] if f["id"] == "fp8-kv-cast")["evidence"]["prediction"]
        # the profiled host time the old model predicted with: 3.6x the measured TPOT
        assert p["host_floor_ms"] > 3 * r["measured_ms"] and p["gpu_work_ms"] < r["measured_ms"]


@pytest.mark.parametrize("case", ["moe-495000-c1", "moe-3000000-c1", "moe-495000-c16", "dense-495000-c1",
                                  "dense-495000-c16"])
def test_fixed_trace_has_no_host_bubble_its_bench_contradicts(case):
    """The fixed servers' profiled traces idle 1-2.7 ms per step (the profiled host); their benches say
    how much idle there is without the profiler: TPOT (median ITL) minus GPU work. A host-bubble
    finding appears only where that is at least 10% of the step, and says that number."""
    run = RESULTS / case / "fixed"
    bench = json.loads((run / "bench.json").read_text())
    d = diagnose([run]).to_dict()
    f = next((x for x in d["findings"] if x["id"] == "host-bubble"), None)
    gpu = d["kernel_ms_per_step"]
    cycle = bench.get("itl_p50_ms") or bench["tpot_ms"]
    real_idle = cycle - gpu
    profiled_idle = d["idle_ms_per_step"]
    assert profiled_idle > 0.9  # the profiled trace idles about 1 ms or more inside each step alone
    if real_idle < 0.10 * cycle:
        assert f is None, f
    else:
        assert f is not None and f["ms_per_step"] == pytest.approx(f["evidence"]["unprofiled"]["idle_ms"], abs=1e-3)
        assert f["ms_per_step"] < 0.5 * profiled_idle and f["evidence"]["unprofiled"]["source"] == "bench"


def test_teardown_cupti_server_traces_have_no_kernels():
    """The dense 3M-token fixed server was restarted with TEARDOWN_CUPTI=1 in its environment: both its
    traces (concurrency 1 and 16) came back without a single GPU kernel, and diagnose says why."""
    s = json.loads((RESULTS / "summary-dense-495000+3000000.json").read_text())
    assert s["servers"]["3000000"]["env"] == {"TEARDOWN_CUPTI": "1"} and s["fixed"]["3000000"]["teardown_cupti"]
    for c in (1, 16):
        d = diagnose([RESULTS / f"dense-3000000-c{c}" / "fixed"]).to_dict()
        assert d["steps"].get("analysed_on") == "cpu-ops" or d["kernel_ms_total"] == 0 or \
            any("no GPU kernel" in n for n in d["notes"])
        assert any("TEARDOWN_CUPTI=1" in n for n in d["notes"]), d["notes"]
