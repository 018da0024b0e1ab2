"""`perfscope demo` end to end on CPU: the real reproduction server, traced, diagnosed, fixed on a
scratch copy, restarted, re-measured and compared. Nothing is mocked."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the whole demo loop on the reproduction server


def test_demo_finds_fixes_and_measures(tmp_path):
    shipped = REPO / "examples" / "repro_server" / "mla_attention.py"
    before_hash = hashlib.sha256(shipped.read_bytes()).hexdigest()
    # as the README runs it: no --out, from the user's working directory (the default folder
    # ./perfscope-demo-<time> is relative; it once crashed trace by being joined twice)
    r = subprocess.run([sys.executable, "-m", "perfscope", "demo", "--json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    (out,) = tmp_path.glob("perfscope-demo-*")
    assert s["before"] == str(out / "before") and s["html"] == str(out / "compare.html")
    assert s["findings_before"][0] == "fp8-kv-cast"
    # its log (stderr with --json) pastes back: every command and path on one line, not folded at 80
    log = r.stderr.splitlines()
    ran = [ln for ln in log if ln.startswith("$ perfscope ")]
    assert len(ran) >= 8 and all(ln.rstrip().endswith("--json") for ln in ran), ran
    assert f"HTML comparison: {s['html']}" in log and f"run folders: {s['before']}  {s['after']}" in log
    assert "fp8-kv-cast" not in s["findings_after"]
    # a CPU-only trace has no GPU timeline: no idle-time rule may fire on it
    assert not {"eager-decode", "host-bubble", "overlap-off"} & set(s["findings_before"] + s["findings_after"])
    assert s["tpot_ms_before"] > 5 * s["tpot_ms_after"] > 0
    # the before/after with its noise: the TPOT change's interval lies below 0, verdict improved
    ch = s["change"]["tpot"]
    assert ch["verdict"] == "improved" and ch["interval"][1] < 0 and ch["before"]["n"] >= 3, ch
    # predictions held to account: the before run's predicted step against the after run's. Each
    # step is paired with its own casts, so the prediction is a real step (it once was 0 ms: the mean
    # cast time of 4 steps, one of them slow, exceeded the median step)
    assert 0 < s["predicted_step_ms_after_fix"] < s["step_ms_before"]
    (pr,) = s["predictions"]
    assert pr["finding"] == "fp8-kv-cast" and pr["measured_step_ms"] == s["step_ms_after"]
    assert pr["predicted_step_ms"] == round(s["predicted_step_ms_after_fix"], 4)
    # the server runs on the CPU and the before run has a bench: the prediction is of the unprofiled TPOT
    # (perfscope.analysis.cpuhost), held to the after run's bench
    assert pr["measured_tpot_ms"] == round(s["tpot_ms_after"], 4) and pr["predicted_tpot_ms"] == pr["predicted_step_ms"]
    assert pr["error_pct"] == round((pr["predicted_step_ms"] - pr["measured_tpot_ms"]) / pr["measured_tpot_ms"] * 100, 1)
    # ... and not far from it: within 4x either way (-0.7% and +36% in two runs on 2-core machines; the profiled step
    # less the casts, the prediction before it was held to the bench, was 47 ms against the 50 ms
    # measured). It was 12-14x: with torch's thread per core the server's ops waited on OpenMP's barrier
    # for descheduled threads after each cast, and glibc unmapped each layer's 37 MB BF16 copy (3-5 ms
    # outside any op); the demo's server runs one thread and keeps large allocations (perfscope/demo.py).
    # What is left: the ops after a cast run on caches it evicted (2x on a 2-core box), which a CPU-only
    # trace cannot tell from their own time
    assert 1 / 4 < pr["predicted_step_ms"] / pr["measured_tpot_ms"] < 4, pr
    said = " ".join(r.stderr.split())
    assert re.search(r"predicted by fp8-kv-cast \(before run\): TPOT [\d.]+ ms, measured without the profiler [\d.]+ ms "
                     r"\(error [+-][\d.]+%", said), said[-2000:]
    # a short patch summary and the path of the full diff, not the diff itself
    diff = (out / "fix.diff").read_text()
    assert s["diff"] == str(out / "fix.diff") and "perfscope fp8-kv-cast" in diff and diff.count("\n+") > 20
    assert re.search(r"patch: \+\d+ -\d+ lines in \d+ hunks; full diff: ", " ".join(r.stderr.split()))
    assert not any(ln.startswith(("@@", "+++", "---")) for ln in r.stderr.splitlines())  # no diff on screen
    assert (out / "compare.html").stat().st_size > 100_000
    for side in ("before", "after"):
        run = json.loads((out / side / "run.json").read_text())
        assert run["files"] and (out / side / "bench.json").exists()
    # the shipped source is never patched; the scratch copy is, with a backup and manifest
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == before_hash
    patched = out / "server" / "examples" / "repro_server" / "mla_attention.py"
    assert b"perfscope fp8-kv-cast" in patched.read_bytes()
    # CPU-only traces compared: said as CPU, not GPU
    cmp = subprocess.run([sys.executable, "-m", "perfscope", "compare", str(out / "before"), str(out / "after")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "160"})
    assert cmp.returncode == 0, cmp.stderr
    assert "(CPU, " in cmp.stdout and "median step (CPU ops)" in cmp.stdout and "CPU op time per step" in cmp.stdout
    assert "GPU" not in cmp.stdout
    cj = json.loads(subprocess.run([sys.executable, "-m", "perfscope", "compare", str(out / "before"),
                                    str(out / "after"), "--json"], capture_output=True, text=True, timeout=300).stdout)
    assert cj["before"]["platform"] == cj["after"]["platform"] == "cpu"  # not the trace meta's "cuda" default
    # one rank's EXTEND and DECODE files: the HTML labels them as stages, not as ranks
    html = (out / "compare.html").read_text()
    assert "Per stage, before and after" in html and "EXTEND stage (prefill)" in html and "DECODE stage" in html
    # a second demo into the same (non-empty) folder is refused, not overwritten
    # (named through '~', as --out=~/... reaches it unexpanded by the shell)
    again = subprocess.run([sys.executable, "-m", "perfscope", "demo", f"--out=~/{out.name}"], cwd=REPO,
                           env={**os.environ, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "not empty" in again.stderr and str(out) in again.stderr
