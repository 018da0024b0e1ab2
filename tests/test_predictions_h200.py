"""Predicted vs measured TPOT on the real SGLang on the H200 (examples/gpu_loop/results/
h200-2026-12-01-predict and, both models again on another day, h200-2026-12-02-predict, made by
examples/gpu_loop/sglang/predict_run.py): an unmodified SGLang
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
RESULTS2 = REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-02-predict"  # both models, another day
sys.path.insert(0, str(REPO / "examples" / "gpu_loop" / "sglang"))
from predict_table import rows  # noqa: E402

from realtraces import real_diagnosis

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)


@pytest.fixture(scope="module")
def table():
    return {r["case"]: r for r in rows(RESULTS)}


@pytest.fixture(scope="module")
def table2():
    return {r["case"]: r for r in rows(RESULTS2)}


def test_every_case_is_predicted_from_its_gpu_only_profile(table, table2):
    # the second day's host-timing profiles are 32 plain steps (piecewise-graph prefills among the
    # full-graph decode steps): read as one "graph pieces" step they left the prediction on the full trace
    assert len(table) == 8 and len(table2) == 8
    for r in [*table.values(), *table2.values()]:
        assert r["host_source"] == "gpu-only" and r["predicted_ms"] and r["range_ms"][0] < r["range_ms"][1], r


def test_every_measured_tpot_is_inside_the_predicted_range(table, table2):
    """The range is the host-speed ratio's measured spread (perfscope.analysis.hosttime.SCALE): every
    fixed server's median TPOT, over all its benches taken before a trace of the process, lies in it.
    The point is held to no more than that: the host-bound servers' own benches differ by up to 1.7x
    (dense-3000000-c1: bench medians 1.16-1.97 ms within one process, nothing else sent), so a point
    estimate cannot be closer than that noise; the GPU-bound MoE row is within 3% at batch 1."""
    rs = [*table.values(), *table2.values()]
    for r in rs:
        assert r["range_ms"][0] <= r["measured_ms"] <= r["range_ms"][1], r
    errs = sorted(abs(r["error_pct"]) for r in rs)
    assert statistics.median(errs) <= 15.0, errs
    noisy = table["dense-3000000-c1"]["bench_medians_ms"]
    assert noisy[1] / noisy[0] > 1.6 and table["dense-3000000-c1"]["benches"] == 4
    assert abs(table["moe-495000-c1"]["error_pct"]) <= 3.0 and abs(table["moe-3000000-c1"]["error_pct"]) <= 15.0


def test_moe_predictions_meet_the_target_on_the_second_day(table2):
    """The MoE fixes re-measured with the current script (`trace --bench`: bench, GPU-only profile, full
    trace): the step is held by the GPU's work or by a host only a little slower, and the prediction is
    within the issue's target: median error <= 5%, every case within 15% of the measured TPOT."""
    moe = [r for r in table2.values() if r["model"] == "moe"]
    assert len(moe) == 4
    errs = sorted(abs(r["error_pct"]) for r in moe)
    assert statistics.median(errs) <= 5.0 and errs[-1] <= 15.0, errs
    for r in moe:
        assert r["bug_tpot_ms"] / r["measured_ms"] > 5 and r["range_ms"][0] <= r["measured_ms"] <= r["range_ms"][1], r


def test_moe_fix_is_not_predicted_as_no_gain(table):
    # the 10-layer MoE step: the profiled host (5.4 ms per step) looked like it would hold the fixed step
    # and the replay kept the shared experts' stream where it was: "11.9 ms, no gain" for a 6.7x fix
    for pool in (495000, 3000000):
        r = table[f"moe-{pool}-c1"]
        assert r["bug_tpot_ms"] / r["predicted_ms"] > 6
        assert r["range_ms"][0] <= r["measured_ms"] <= r["range_ms"][1]
    assert table["moe-495000-c1"]["bound"] == "gpu"


def test_dense_fix_is_host_bound_and_the_host_is_the_unprofiled_one(table):
    for pool in (495000, 3000000):
        r = table[f"dense-{pool}-c1"]
        assert r["bound"] == "host" and r["range_ms"][0] <= r["measured_ms"] <= r["range_ms"][1], r
        d = real_diagnosis(RESULTS / f"dense-{pool}-c1" / "bug").to_dict()
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
    d = real_diagnosis(run).to_dict()
    f = next((x for x in d["findings"] if x["id"] == "host-bubble"), None)
    gpu = d["kernel_ms_per_step"]
    itl = bench.get("itl_p50_ms")
    cycle = itl if itl and itl >= 0.5 * bench["tpot_ms"] else bench["tpot_ms"]  # a stream in bursts: TPOT
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
        d = real_diagnosis(RESULTS / f"dense-3000000-c{c}" / "fixed").to_dict()
        assert d["steps"].get("analysed_on") == "cpu-ops" or d["kernel_ms_total"] == 0 or \
            any("no GPU kernel" in n for n in d["notes"])
        assert any("TEARDOWN_CUPTI=1" in n for n in d["notes"]), d["notes"]


def test_a_token_stream_in_bursts_is_timed_by_its_tpot():
    """The second day's fixed 495k server at 16 requests, host-bound, delivered tokens several at a
    time: median inter-token latency 0.08 ms against a 2.07 ms TPOT. That ITL is no step time: the
    step is the TPOT, with no prefill tail added on top; a bench whose ITL is the step keeps it."""
    from perfscope.analysis.hosttime import decode_tail_ms, step_itl_ms

    burst = json.loads((RESULTS2 / "dense-495000-c16" / "fixed" / "bench.json").read_text())
    assert burst["itl_p50_ms"] < 0.1 * burst["tpot_ms"]
    assert step_itl_ms(burst) is None and decode_tail_ms(burst) == 0.0
    steady = json.loads((RESULTS2 / "dense-495000-c16" / "bug" / "bench.json").read_text())
    assert step_itl_ms(steady) == steady["itl_p50_ms"] and 0 <= decode_tail_ms(steady) < 0.1


def test_a_host_bound_servers_tpot_switches_levels_within_one_process():
    """examples/gpu_loop/sglang/starts_run.py on the H200: four pages-fixed dense servers side by side
    (two pinned to their own 4 CPUs with taskset), started three times, each benched twice in a row at
    batch 1 with nothing else sent. The same process's two benches differ by up to 1.45x; pinned
    servers spread as widely as unpinned ones: what a prediction of a host-bound step is held to."""
    s = json.loads((REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-02-starts" / "summary.json").read_text())
    assert s["reverted_byte_identical"] and s["apply"]["rc"] == 0 and len(s["rounds"]) == 3
    servers = [r for rd in s["rounds"] for r in rd["servers"].values()]
    assert len(servers) == 12 and all(r["c1a"]["failed"] == 0 and r["c1b"]["failed"] == 0 for r in servers)
    within = [max(r["c1a"]["tpot_ms"], r["c1b"]["tpot_ms"]) / min(r["c1a"]["tpot_ms"], r["c1b"]["tpot_ms"])
              for r in servers]
    assert max(within) > 1.4
    for pinned in (True, False):
        t = [x for r in servers if bool(r["pinned"]) == pinned for x in (r["c1a"]["tpot_ms"], r["c1b"]["tpot_ms"])]
        assert max(t) / min(t) > 1.3, (pinned, t)


def test_a_host_bound_servers_level_is_none_of_the_causes_measured_beside_it():
    """examples/gpu_loop/sglang/levels_run.py on the H200: one pages-fixed dense server, a sampler beside it
    (the scheduler's CPU, its involuntary switches, every CPU's steal and interrupt time, a busy loop's time
    on a CPU of its own), batch-1 requests in phases: unpinned, the scheduler pinned to CPU 2, to CPU 3,
    unpinned again; the whole run twice (two process starts). Measured: no steal, no interrupt time on the
    scheduler's CPU while it decodes, the machine's speed elsewhere barely follows the TPOT (r 0.17), pinning
    adds ~115 involuntary switches per request yet TPOT falls; two starts pinned alike differ by 1.27x."""
    sys.path.insert(0, str(REPO / "examples" / "gpu_loop" / "sglang"))
    from levels_table import rows as level_rows

    starts = {s["start"]: s for s in level_rows(REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-02-levels")}
    assert set(starts) == {"start1", "start2"} and all(s["reverted_byte_identical"] for s in starts.values())
    for s in starts.values():
        ph = {p["phase"]: p for p in s["phases"]}
        assert len(ph) == 4 and all(p["steal_jiffies_per_request"] < 0.1 for p in ph.values())
        assert all(p["irq_jiffies_per_request"] < 0.1 for p in ph.values())
        assert abs(s["loop_tpot_r"]) < 0.5
        pinned = ph["scheduler-on-cpu2"]
        assert pinned["scheduler_cpus"] == [2] and pinned["nvcsw_per_request"] > 50 > ph["unpinned"]["nvcsw_per_request"]
        assert pinned["tpot_median_ms"] < ph["unpinned"]["tpot_median_ms"]
    a, b = (starts[k]["phases"][1]["tpot_median_ms"] for k in ("start1", "start2"))
    assert max(a, b) / min(a, b) > 1.2  # the same server, pinned alike, another process start


def test_a_host_bound_servers_tpot_spread_is_not_the_gpu_clocking_down():
    """levels_run.py again on another H200 machine, its sampler now reading the GPU too (a read-only
    ``nvidia-smi -lms 20`` beside it): the GPU never left its top SM clock (1980 MHz) while the batch-1
    requests decoded, in every phase, with no clock-event reason, though the requests' TPOT spread 1.3x and
    more within each phase (the GPU busy about half the time: host-bound). A clock that falls in the idle
    gaps between short steps is not what moves a host-bound server's TPOT; this machine also had steal time,
    which the first one had not, and a slower median (1.9-2.1 against 1.0-1.6 ms)."""
    sys.path.insert(0, str(REPO / "examples" / "gpu_loop" / "sglang"))
    from levels_table import rows as level_rows

    (start,) = level_rows(REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-05-levels")
    assert start["reverted_byte_identical"] and len(start["phases"]) == 4
    for p in start["phases"]:
        assert p["requests"] == 200 and p["sm_mhz_median"] == p["sm_mhz_min"] == 1980.0, p
        assert p["throttle_reasons"] == ["0x0000000000000000"] and p["sm_tpot_r"] is None  # a constant clock
        assert p["tpot_p90_ms"] / p["tpot_p10_ms"] > 1.3
        assert p["steal_jiffies_per_request"] > 1
    first = level_rows(REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-02-levels")
    assert min(p["tpot_median_ms"] for p in start["phases"]) > max(p["tpot_median_ms"] for s in first for p in s["phases"])


def test_trace_no_stack_on_the_real_sglang_and_the_batch_1_host_spread():
    """predict_run.py --model dense --pools 495000 --starts 1 --no-stack-c1 on the H200 (2026-12-05): the bug
    server traced at batch 1 with stacks and shapes, then again with ``trace --no-stack --no-shapes`` 11 s
    later, and at 16 requests; fixed by ``fix fp8-kv-cast --apply --restart-cmd``. Without the stack tracer
    the full trace's host work per step is a third shorter (3.44 -> 2.27 ms) and the trace a quarter of the
    size, with the same kernels (the cast 6.92 ms per step in both) and the same finding; the diagnosis says
    what it lacks (no source line per op). The batch-1 prediction rests on the GPU-only profile that
    ``trace --bench`` takes first, and two of them, same server, same options, 11 s apart, measured 1.96 and
    2.77 ms of host work per step: the prediction inherits the host's own spread (-0.5% and +41% of the
    fixed server's TPOT; the second, 0.43 of its profile's host time, fell below the range's old end, 0.45:
    hosttime.SCALE's GPU-only range now ends at 0.42)."""
    results = REPO / "examples" / "gpu_loop" / "results"
    with_stack = {r["case"]: r for r in rows(results / "h200-2026-12-05-predict")}
    no_stack = {r["case"]: r for r in rows(results / "h200-2026-12-05-predict-nostack")}
    a, b = with_stack["dense-495000-c1"], no_stack["dense-495000-c1"]
    assert a["measured_ms"] == b["measured_ms"] and a["benches"] == 4  # the same fixed server
    assert abs(a["error_pct"]) <= 5 and a["within_range"] and with_stack["dense-495000-c16"]["within_range"]
    assert b["error_pct"] > 30 and b["within_range"]  # inside only since this run lowered hosttime's range end

    from perfscope.analysis.diagnose import diagnose

    da = diagnose([results / "h200-2026-12-05-predict" / "dense-495000-c1" / "bug"], workers=1).to_dict()
    db = diagnose([results / "h200-2026-12-05-predict-nostack" / "dense-495000-c1" / "bug"], workers=1).to_dict()
    pa, pb = (d["findings"][0]["evidence"]["prediction"] for d in (da, db))
    assert da["findings"][0]["id"] == db["findings"][0]["id"] == "fp8-kv-cast"
    assert abs(pa["kernel_time_saved_ms"] - pb["kernel_time_saved_ms"]) < 0.01
    assert pb["host_floor_ms"] < 0.75 * pa["host_floor_ms"]  # the stack tracer's own cost on the host
    assert pb["host"]["profiled_ms"] / pa["host"]["profiled_ms"] > 1.3  # two GPU-only profiles 11 s apart
    assert any(o["source"] for o in da["ops"]) and not any(o["source"] for o in db["ops"])
    assert not da["notes"] and any("--no-stack" in n for n in db["notes"])
