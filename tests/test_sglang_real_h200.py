"""What the H200 runs against a real SGLang 0.5.13.post1 (and a torch harness of its default-pool
cast) brought back, analysed here on the CPU (examples/gpu_loop/results/h200-2026-12-01-sglang/),
plus the parts of run_loop.py's real-SGLang mode that run without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from paths import REPO
from perfscope.analysis.diagnose import diagnose

RES = REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-01-sglang"
SPLIT = RES / "split_cast"
REAL = RES / "pool495000" / "runs" / "495000-bug"
MODEL = REPO / "examples" / "gpu_loop" / "sglang" / "config.json"
ROWS = 15_728_043  # SGLang's default FP8 pool on one H200 at --mem-fraction-static 0.5: 15,728,042 tokens + 1 row


def _cast(d) -> dict:
    f = [x for x in d.to_dict()["findings"] if x["id"] == "fp8-kv-cast"]
    assert f, [x["id"] for x in d.to_dict()["findings"]]
    return f[0]


def test_split_cast_graph_trace_is_one_cast_per_layer_of_the_whole_pool():
    """Replayed from a CUDA graph (no CPU ops): torch's 16 launches of each layer's 9.06e9-element
    cast are one cast; 8 casts per step of the 15.7M-row pool, not 128 of 983,003 rows."""
    f = _cast(diagnose([SPLIT / "split_cast_graph.json.gz"]))
    ev = f["evidence"]
    assert ev["casts_per_step"] == 8 and ev["launches_per_cast"] == 16
    assert ROWS <= ev["pool_tokens"] <= ROWS + 16  # each launch's grid rounds up by < 1 row
    assert ev["sized_from"] == "kernel launch geometry (16 launches)"
    assert "16 launches" in f["summary"] and "15,728,0" in f["summary"]
    assert f["ms_per_step"] == pytest.approx(213.8, abs=1.0)


def test_split_cast_eager_trace_sizes_from_the_cpu_op_and_counts_casts_not_launches():
    f = _cast(diagnose([SPLIT / "split_cast_eager.json.gz"]))
    ev = f["evidence"]
    assert ev["input_dims"] == [ROWS, 1, 576] and ev["pool_tokens"] == ROWS
    assert ev["casts_per_step"] == 8 and ev["launches_per_cast"] == 16
    assert ev["elements_per_cast"] == ROWS * 576


@pytest.mark.parametrize("pool, match", [(ROWS - 1, True), (983_003, False)])
def test_pool_checked_against_the_servers_max_total_num_tokens(pool, match):
    f = _cast(diagnose([SPLIT / "split_cast_graph.json.gz"], {"max_total_num_tokens": pool}))
    assert f["evidence"]["pool_matches_config"] is match
    assert ("the server reports" in f["summary"]) is (not match)


def test_real_sglang_trace_one_launch_per_cast_pool_from_server_info():
    """The real SGLang 0.5.13.post1 run (FlashInfer 0.6.12, CUDA graphs, --max-total-tokens 495000):
    8 layers, one launch per cast, the pool of /server_info (+1 row), and the floor from the
    DeepSeek-V2-shaped config (all 8 layers dense: the config's 64 experts are never used)."""
    d = diagnose([REAL])
    f = _cast(d)
    ev = f["evidence"]
    run = json.loads((REAL / "run.json").read_text())
    pool = run["server_info"]["max_total_num_tokens"]
    assert pool == 495_000 and ev["pool_tokens"] == pool + 1 and ev["pool_matches_config"] is True
    assert ev["casts_per_step"] == 8 and ev["launches_per_cast"] == 1
    bench = json.loads((REAL / "bench.json").read_text())
    assert bench["tpot_ms"] == pytest.approx(7.6, abs=0.3)
    # the GPU work left is ~1 ms; the fixed step is bound by the host (tests/test_stepmodel.py)
    assert f["evidence"]["prediction"]["gpu_prediction_ms"] == pytest.approx(1.0, abs=0.3)
    assert f["evidence"]["prediction"]["bound"] == "host"


def test_real_sglang_trace_floor_with_a_dense_config_that_lists_experts(tmp_path):
    r = subprocess.run([sys.executable, "-m", "perfscope", "diagnose", str(REAL), "--json", "--model-config",
                        str(MODEL), "--batch", "1", "--context", "2032"], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    fl = json.loads(r.stdout)["floor"]
    assert fl["available"] and 0.1 < fl["floor_ms"] < 1.0 and fl["worst_bucket"] == "copy"
    assert not any("routed experts" in n for n in fl.get("notes") or [])


def test_pages_rows_under_cuda_graph_on_the_h200_bit_identical_and_the_shifted_copy_fails():
    """rows_check.json: the snippet's conversion captured in one CUDA graph, replayed with 6 batches
    of 8 requests: every converted row equals torch's cast bit for bit; the copy whose row index is
    shifted by one differs in almost every row. Before the sign-of-zero fix, byte 0x80 (-0.0)
    came out +0.0 (bits differ, values equal)."""
    now = json.loads((SPLIT / "rows_check.json").read_text())
    assert now["pages_rows_graph"]["all_bit_identical"] is True
    sh = now["pages_rows_graph_shifted"]
    assert sh["all_value_identical"] is False
    assert all(t["rows_differing_in_value"] > 0.9 * t["rows"] for t in sh["trials"])
    before = json.loads((SPLIT / "rows_check_before_and_after_sign_fix.json").read_text())["pages_rows_graph_before"]
    assert before["all_bit_identical"] is False and before["all_value_identical"] is True
    assert {b for t in before["trials"] for b in t["fp8_bytes_of_differing_bits"]} == {0x80}


PAGES = RES / "pool495000-pages"


def test_real_sglang_pages_patch_outputs_identical_to_the_unpatched_server():
    """h15b's run (examples/gpu_loop/sglang/patched_run.py): the probe of the patched server, of a
    control server of the same call (patch switched off) and of the unpatched server of the earlier
    call, compared here again from the raw probes: every id, logprob, top-5 and prompt logprob."""
    m = _gpuloop()
    now = json.loads((PAGES / "summary.json").read_text())
    rec = json.loads((RES / "pool495000" / "summary.json").read_text())["probe_unpatched"]
    assert now["install"]["target_is_recorded_original"] is True and now["apply"]["outcome"] == "applied"
    assert now["apply"]["sha256_after"] != now["install"]["target_sha256"]
    for other in (rec, now["probe_control"]):
        d = m.probe_diff(other, now["probe_pages"])
        assert d["identical"] is True and d["distinct_output_logprobs"] > 100  # not dummy weights
    assert sum(len(r["lp"]) for part in ("bs1", "bs8") for r in now["probe_pages"][part]) == 176
    assert now["servers"]["control"]["env"] == {"PERFSCOPE_FP8_KV_CAST": "off"}
    assert now["servers"]["pages"]["server_info"]["max_total_num_tokens"] == 495_000
    assert now["servers"]["pages"]["server_info"]["disable_cuda_graph"] is False
    assert now["reverted_byte_identical"] is True and now["reverted_sha256"] == now["install"]["target_sha256"]


def test_real_sglang_pages_patch_tpot_and_the_cast_gone_from_the_trace():
    """TPOT 7.6 -> 1.42 ms (the control of the same call 7.59 ms); the after trace has no
    fp8-kv-cast finding, the conversion kernel in place of the casts, and kernel time near the
    bug's prediction (the TPOT prediction, 0.99 ms, is ~30% low: host time at batch 1)."""
    now = json.loads((PAGES / "summary.json").read_text())
    assert now["bench_pages"]["failed"] == 0 and now["bench_control"]["failed"] == 0
    assert now["bench_pages"]["tpot_ms"] == pytest.approx(1.42, abs=0.1)
    assert now["bench_control"]["tpot_ms"] == pytest.approx(7.6, abs=0.3)
    after = diagnose([PAGES / "runs" / "495000-pages"]).to_dict()
    assert "fp8-kv-cast" not in [f["id"] for f in after["findings"]]
    # the GPU work the step model predicted (the step itself is host-bound: tests/test_stepmodel.py)
    pred = _cast(diagnose([REAL]))["evidence"]["prediction"]["gpu_prediction_ms"]
    r = subprocess.run([sys.executable, "-m", "perfscope", "compare", str(REAL), str(PAGES / "runs" / "495000-pages"),
                        "--json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    c = json.loads(r.stdout)
    assert [f["id"] for f in c["findings"]["gone"]] == ["fp8-kv-cast"]
    assert c["kernel_ms_per_step"]["after_ms"] == pytest.approx(pred, rel=0.2)
    assert any(o["short"] == "_perfscope_fp8kv_rows_kernel" and o["status"] == "new" for o in c["ops"])


# ------------------------------------------------------------ the mode's CPU-side parts


def _gpuloop():
    sys.path.insert(0, str(REPO / "examples" / "gpu_loop"))
    from gpuloop import sglang_real

    return sglang_real


def test_probe_diff_identical_and_one_logprob_off():
    m = _gpuloop()
    a = {"bs1": [{"len": 64, "ids": [5, 6], "lp": [-6.9, -7.1], "top": [[[-6.9, 5]], [[-7.1, 6]]], "in_lp": [-7.0]}],
         "bs8": [{"len": 100, "ids": [7], "lp": [-6.5], "top": [[[-6.5, 7]]], "in_lp": [-7.3]}]}
    b = json.loads(json.dumps(a))
    assert m.probe_diff(a, b)["identical"] is True
    b["bs8"][0]["in_lp"][0] = -7.300001  # a prompt logprob, last digits
    d = m.probe_diff(a, b)
    assert d["identical"] is False and d["bs8"]["max_abs_diff"] == pytest.approx(1e-6, rel=0.1)
    assert m.probe_diff(a, {"bs1": [], "bs8": []})["identical"] is False  # nothing to compare is not a pass


def test_restart_script_replaces_the_running_server_under_sh(tmp_path):
    """The --restart-cmd script under /bin/sh (dash here, as on Debian/Ubuntu hosts): the second
    start stops the first server's process group before starting the next one."""
    m = _gpuloop()

    class A:
        port = 0
        mem_fraction = 0.5

    lp = m.SglangMixin()
    lp.a, lp.work, lp.logs, lp.py, lp.model, lp.summary = A(), tmp_path, tmp_path, sys.executable, tmp_path, {}
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    lp.a.port = port
    script = lp.sg_script("t", 1000, argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"])
    pids = []
    try:
        _start_twice(script, port, pids, tmp_path)
    finally:
        lp.sg_stop()
    assert pids[0] != pids[1]
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    for _ in range(50):
        try:
            os.kill(pids[1], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("sg_stop left the server running")


def _start_twice(script, port, pids, tmp_path):
    for _ in range(2):
        subprocess.run(["sh", str(script)], check=True, timeout=60)
        pids.append(int((tmp_path / "server.pid").read_text()))
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the server did not answer")
