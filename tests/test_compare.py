"""perfscope compare: the data diff (perfscope.analysis.compare) and the CLI, on the real H200 traces."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from perfscope.analysis.compare import compare
from perfscope.analysis.diagnose import diagnose
from perfscope.rundir import write_run

from clirun import invoke
from paths import TRACES, gz_bytes, topen
from realtraces import real_diagnosis

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)
H200 = TRACES / "h200-mla-fp8-kv"
QWEN = TRACES / "public" / "TraceLens" / "tests" / "traces"


@pytest.fixture(scope="module")
def diag():
    return real_diagnosis


@pytest.mark.parametrize("after", ["mla_fp8_graph", "mla_pages_graph"])
def test_the_fix_shows_in_the_comparison(diag, after):
    c = compare(diag(H200 / "mla_pool_graph.json.xz"), diag(H200 / f"{after}.json.xz"),
                labels=("mla_pool_graph", after))
    st = c["step"]
    assert 55.0 <= st["before_ms"] <= 59.0, st
    assert 6.0 <= st["after_ms"] <= 8.0, st
    assert st["ratio"] == pytest.approx(st["after_ms"] / st["before_ms"], abs=1e-3) and st["ratio"] < 0.15
    assert st["speedup"] > 7
    copy = next(b for b in c["buckets"] if b["bucket"] == "copy")
    assert copy["before_ms"] > 45 and copy["after_ms"] < 1.5 and copy["delta_ms"] < -44
    assert copy["before_share"] > 0.8 and copy["after_share"] < 0.2
    assert c["buckets"][0]["bucket"] == "copy", "largest change first"
    assert [f["id"] for f in c["findings"]["gone"]] == ["fp8-kv-cast"]
    assert "fp8-kv-cast" not in c["after"]["findings"]
    assert "fp8-kv-cast" not in [f["id"] for f in c["findings"]["new"]]
    assert c["setup"]["differs"] is False and not c["setup"]["flagged"]
    assert "fp8-kv-cast" in c["verdict"] and "faster" in c["verdict"]
    # the cast op: gone with native FP8, 100x smaller (same short name, smaller grid) with page casts
    cast = next(o for o in c["ops"] if o["bucket"] == "copy" and "cast" in o["short"] and o["before_ms"])
    assert cast["before_count"] == 60 and cast["before_grid"] == [556875, 1, 1]
    if after == "mla_fp8_graph":
        assert cast["status"] == "gone" and cast["after_ms"] is None
    else:
        assert cast["status"] == "changed" and cast["after_ms"] < 1.0 and cast["after_grid"] != cast["before_grid"]
    json.dumps(c)  # JSON-ready


def test_identical_sides_compare_as_unchanged(diag):
    d = diag(H200 / "mla_pool_eager.json.xz")
    c = compare(d, d)
    assert c["step"]["ratio"] == 1.0 and c["step"]["delta_ms"] == 0
    assert not c["findings"]["gone"] and not c["findings"]["new"]
    assert [f["id"] for f in c["findings"]["kept"]] == ["fp8-kv-cast"]
    assert all(b["delta_ms"] == 0 for b in c["buckets"])
    assert all(o["status"] == "changed" and o["delta_ms"] == 0 for o in c["ops"])


def test_different_gpus_are_compared_but_flagged(diag):
    c = compare(diag(QWEN / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"),
                diag(QWEN / "mi300" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"))
    assert c["setup"]["differs"] is True
    fields = {f["field"] for f in c["setup"]["flagged"]}
    assert {"device", "platform"} <= fields
    assert "H100" in c["before"]["device"] and "MI300X" in c["after"]["device"]
    assert "setups differ" in c["verdict"] and "GPU" in c["verdict"]
    assert c["step"]["before_ms"] and c["step"]["after_ms"]  # still compared


def _run_folder(root: Path, trace: Path, model: str, tpot: float, kv: str) -> Path:
    """A perfscope run folder as `perfscope trace` leaves it (run.json + traces/), around a real trace."""
    (root / "traces").mkdir(parents=True)
    dst = root / "traces" / "1730000000.0-TP-0-DECODE.trace.json.gz"
    shutil.copyfile(trace, dst)
    write_run(root, command=["perfscope", "trace"], host="gpu1", engine="sglang",
              versions={"sglang": "0.5.5", "flashinfer": "0.6.18"},
              server_info={"model_path": model, "kv_cache_dtype": kv, "attention_backend": "flashinfer",
                           "tp_size": 1, "max_total_num_tokens": 495000},
              gpu=[{"index": 0, "name": "NVIDIA H200"}],
              timings={"ttft_ms": 120.0, "tpot_ms": tpot}, files=[{"path": dst.relative_to(root).as_posix()}])
    return root


def test_run_folders_bring_tpot_model_and_config(tmp_path, diag):
    before = _run_folder(tmp_path / "before", H200 / "mla_pool_graph.json.xz", "deepseek-ai/DeepSeek-V3", 58.0, "fp8_e4m3")
    after = _run_folder(tmp_path / "after", H200 / "mla_fp8_graph.json.xz", "deepseek-ai/DeepSeek-V3", 7.5, "fp8_e4m3")
    other = _run_folder(tmp_path / "other", H200 / "mla_fp8_graph.json.xz", "Qwen/Qwen3-8B", 7.5, "auto")
    c = compare(diagnose([before]), diagnose([after]))
    assert c["tpot"] == {"before_ms": 58.0, "after_ms": 7.5, "delta_ms": -50.5, "ratio": pytest.approx(0.1293, abs=1e-4),
                         "speedup": pytest.approx(7.7333, abs=1e-4)}
    assert c["before"]["model"] == "deepseek-ai/DeepSeek-V3" and not c["setup"]["differs"]
    c2 = compare(diagnose([before]), diagnose([other]))
    assert c2["setup"]["differs"] and [f["field"] for f in c2["setup"]["flagged"]] == ["model"]
    assert {"field": "kv_cache_dtype", "before": "fp8_e4m3", "after": "auto"} in c2["setup"]["config"]


def test_cli_terminal_and_json(tmp_path):
    pool, fp8 = H200 / "mla_pool_graph.json.xz", H200 / "mla_fp8_graph.json.xz"
    r = invoke("compare", pool, fp8)
    assert r.returncode == 0, r.stderr
    assert "fp8-kv-cast" in r.stdout and "gone" in r.stdout and "copy" in r.stdout
    r = invoke("compare", pool, H200 / "mla_pages_graph.json.xz", "--json", "--html", tmp_path / "c.html")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert c["kind"] == "compare" and c["findings"]["gone"][0]["id"] == "fp8-kv-cast"
    assert c["before"]["label"] == "mla_pool_graph" and c["after"]["label"] == "mla_pages_graph"
    assert (tmp_path / "c.html").stat().st_size > 1_000_000 and "report written" in r.stderr


def test_predictions_are_held_to_account(tmp_path, diag):
    """The pool trace predicted its fixed step (fp8-kv-cast, gone after the fix): compare prints the
    prediction against the fixed run's measured step, with the error in %."""
    c = compare(diag(H200 / "mla_pool_graph.json.xz"), diag(H200 / "mla_fp8_graph.json.xz"))
    (pr,) = c["predictions"]
    pred = next(f.to_dict() for f in diag(H200 / "mla_pool_graph.json.xz").primary.findings if f.id == "fp8-kv-cast")
    assert pr["finding"] == "fp8-kv-cast" and pr["predicted_step_ms"] == round(pred["predicted_step_ms_after_fix"], 4)
    assert pr["measured_step_ms"] == c["step"]["after_ms"]
    assert pr["error_pct"] == round((pr["predicted_step_ms"] - pr["measured_step_ms"]) / pr["measured_step_ms"] * 100, 1)
    assert -25 < pr["error_pct"] < 0  # 6.42 ms predicted, 6.91 ms measured
    # a finding still present predicted nothing that was tested: no row; nor the reverse direction
    assert compare(diag(H200 / "mla_pool_graph.json.xz"), diag(H200 / "mla_pool_eager.json.xz"))["predictions"] == []
    assert compare(diag(H200 / "mla_fp8_graph.json.xz"), diag(H200 / "mla_pool_graph.json.xz"))["predictions"] == []
    r = invoke("compare", H200 / "mla_pool_graph.json.xz", H200 / "mla_fp8_graph.json.xz")
    shown = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.stdout).split())
    assert f"measured {pr['measured_step_ms']:.2f} ms (error {pr['error_pct']:+.1f}%)" in shown
    # the prediction is of the unprofiled TPOT: AFTER's TPOT measured under the profiler is not held to
    # it (said so); a bench of AFTER (no profiler) is
    before = _run_folder(tmp_path / "b", H200 / "mla_pool_graph.json.xz", "deepseek-ai/DeepSeek-V3", 58.0, "fp8_e4m3")
    after = _run_folder(tmp_path / "a", H200 / "mla_fp8_graph.json.xz", "deepseek-ai/DeepSeek-V3", 7.5, "fp8_e4m3")
    (pr,) = compare(diagnose([before]), diagnose([after]))["predictions"]
    assert pr["measured_under_profiler"] and "measured_tpot_ms" not in pr
    from perfscope.rundir import update_run

    update_run(after, timings={"bench": {"tpot_ms": 7.1, "concurrency": 1}})
    (pr,) = compare(diagnose([before]), diagnose([after]))["predictions"]
    assert pr["predicted_tpot_ms"] == pr["predicted_step_ms"] and pr["measured_tpot_ms"] == 7.1
    assert pr["error_pct"] == round((pr["predicted_step_ms"] - 7.1) / 7.1 * 100, 1)


@pytest.mark.parametrize("side", ["before", "after"])
def test_cli_one_unreadable_side_is_one_line(tmp_path, side):
    bad = tmp_path / "broken.json.gz"
    bad.write_bytes(gz_bytes(H200 / "mla_fp8_graph.json.xz")[:5000])  # truncated gzip
    good = H200 / "mla_fp8_graph.json.xz"
    args = (bad, good) if side == "before" else (good, bad)
    r = invoke("compare", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"perfscope: error: {side}"), r.stderr
    assert "Traceback" not in r.stderr and "broken.json.gz" in lines[0]


def test_cli_missing_side_and_not_a_kineto_trace(tmp_path):
    good = H200 / "mla_fp8_graph.json.xz"
    r = invoke("compare", tmp_path / "nope.json.gz", good)
    assert r.returncode == 2 and r.stderr.strip() == f"perfscope: error: before ({tmp_path / 'nope.json.gz'}): no such file or folder"
    et = TRACES / "public/HolisticTraceAnalysis/tests/data/execution_trace/benchmark_simple_add_et.json.xz"
    r = invoke("compare", good, et)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("perfscope: error: after") and "execution trace" in r.stderr


def test_cpu_only_runs_compare_as_platform_cpu():
    """Two CPU-only traces (the demo's repro server on CPU; a real SGLang 0.5.23 server on CPU): the
    trace meta's platform defaults to "cuda", which the comparison once reported; a GPU trace keeps its own."""
    fx = Path(__file__).parent / "fixtures"
    r = invoke("compare", fx / "repro-cpu-demo-before-DECODE.trace.json.gz",
                  fx / "real-sglang-0.5.23-cpu-TP-0-DECODE.trace.json.gz", "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert c["before"]["platform"] == c["after"]["platform"] == "cpu"
    assert c["before"]["analysed_on"] == "cpu-ops"
    assert "cuda" not in json.dumps(c["before"]).lower()
    r = invoke("compare", fx / "repro-cpu-demo-before-DECODE.trace.json.gz", H200 / "mla_pool_graph.json.xz", "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert (c["before"]["platform"], c["after"]["platform"]) == ("cpu", "cuda")
    assert {"field": "platform", "what": "platform", "before": "cpu", "after": "cuda"} in c["setup"]["flagged"]


def test_the_change_has_its_noise_and_a_verdict(diag):
    """Step medians with their spread and a bootstrap interval: the cast fix is 'improved' with an
    interval far from 0; a trace against itself is 'no change'; the fix changed its own kernels
    only, so nothing 'moved together'."""
    c = compare(diag(H200 / "mla_pool_graph.json.xz"), diag(H200 / "mla_fp8_graph.json.xz"))
    st = c["change"]["step"]
    assert st["verdict"] == "improved" and st["before"]["n"] >= 5 and st["after"]["n"] >= 5, st
    lo, hi = st["interval"]
    assert lo <= st["change"] <= hi < -0.8 and st["before"]["min"] <= st["before"]["median"] <= st["before"]["max"]
    assert "improved, 95% CI" in c["verdict"] and c["moved_together"] is None, c["verdict"]
    same = compare(diag(H200 / "mla_pool_eager.json.xz"), diag(H200 / "mla_pool_eager.json.xz"))
    assert same["change"]["step"]["verdict"] == "no change" and same["moved_together"] is None
    assert "no change (noise +-5%)" in same["verdict"], same["verdict"]


def test_kernels_the_fix_did_not_touch_moving_together_flag_the_machine(tmp_path, diag):
    """The same real trace with every kernel 2.5x shorter (as a busier or slower-clocked machine
    makes them, edited here from mla_pages_graph): the ops no finding expected to change moved
    together, and compare says the machine changed; the terminal says it on one line."""
    import gzip

    src = H200 / "mla_pages_graph.json.xz"
    d = json.loads(topen(src).read())
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel" and "dur" in e:
            e["dur"] = e["dur"] * 0.4
    fast = tmp_path / "fast.json.gz"
    fast.write_bytes(gzip.compress(json.dumps(d).encode()))
    c = compare(diag(src), diagnose([fast]))
    m = c["moved_together"]
    assert m is not None and m["direction"] == "faster" and 2.3 <= m["median_factor"] <= 2.7, m
    assert m["share_of_time"] >= 0.6 and m["ops"] >= 2 and "machine changed" in c["verdict"]
    r = invoke("compare", src, fast, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    assert "the machine changed between runs?" in r.stdout and "not expected to change" in r.stdout
