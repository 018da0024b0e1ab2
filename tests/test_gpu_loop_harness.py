"""The harness the one-call device scripts of examples/gpu_loop/sglang share (predict_run.py, eager_run.py,
...): run on this machine with real commands, as they run on the device. Its summary, its command log and
the archives it brings back are what the results folders hold."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time

from paths import REPO

sys.path.insert(0, str(REPO / "examples" / "gpu_loop" / "sglang"))
from harness import Harness  # noqa: E402


def test_run_logs_each_command_and_pack_brings_back_logs_extras_and_runs(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    (work / "stale").mkdir(parents=True)  # a warm machine's earlier call: emptied first
    S: dict = {}
    h = Harness(out, work, deadline=60, t0=time.monotonic(), summary=S, steps=True)
    assert not (work / "stale").exists()
    rc, so, _ = h.run("hello", [sys.executable, "-c", "print('hi')"])
    assert rc == 0 and so == "hi\n" and (work / "logs" / "hello.out").read_text() == "hi\n"
    rc, _, se = h.run("fails", [sys.executable, "-c", "import sys; sys.exit('no')"])
    assert rc == 1 and "no" in se
    assert [s["name"] for s in json.loads((out / "summary.json").read_text())["steps"]] == ["hello", "fails"]
    (work / "fixrun").mkdir()
    (work / "fixrun" / "fix.json").write_text("{}")
    (work / "srv.sh").write_text("#!/bin/sh\n")
    runs = work / "runs" / "eager-c1" / "bug"
    runs.mkdir(parents=True)
    (runs / "run.json").write_text("{}")
    h.pack((work / "srv.sh", work / "fixrun", work / "absent"), work / "runs")
    with tarfile.open(out / "logs.tar.gz") as tf:
        names = set(tf.getnames())
    assert {"logs/hello.out", "logs/fails.err", "srv.sh", "fixrun/fix.json"} <= names
    assert not any(n.startswith("absent") for n in names)
    with tarfile.open(out / "runs.tar") as tf:
        assert "runs/eager-c1/bug/run.json" in tf.getnames()


def test_pack_without_runs_writes_no_runs_archive(tmp_path):
    h = Harness(tmp_path / "out", tmp_path / "work", deadline=60, t0=time.monotonic(), summary={})
    h.pack((), tmp_path / "work" / "runs")
    assert (tmp_path / "out" / "logs.tar.gz").is_file() and not (tmp_path / "out" / "runs.tar").exists()


def test_bench_of_an_unreachable_server_records_the_failure_and_writes_no_bench(tmp_path):
    h = Harness(tmp_path / "out", tmp_path / "work", deadline=60, t0=time.monotonic(), summary={}, steps=True)
    w = {"input_len": 8, "output_len": 4}
    r = h.bench("bench-dead", sys.executable, dict(os.environ, PYTHONPATH=str(REPO)), "http://127.0.0.1:9", w, 1, 1,
                tmp_path / "dest")
    assert r["rc"] != 0 and r["stderr"] and r["concurrency"] == 1 and r["tpot_per_request"] == []
    assert not (tmp_path / "dest" / "bench.json").exists()


def _probe(tmp_path, path_dir, seconds=0.6):
    """Run hostprobe.py beside this test's own process for ``seconds``, stop it with SIGTERM as
    levels_run.py does, and return its JSON lines."""
    import gzip
    import signal
    import subprocess

    out = tmp_path / "samples.jsonl.gz"
    env = {**os.environ, "PATH": f"{path_dir}:/usr/bin:/bin"}
    p = subprocess.Popen([sys.executable, str(REPO / "examples" / "gpu_loop" / "sglang" / "hostprobe.py"),
                          "--pids", str(os.getpid()), "--out", str(out), "--cpu", "0", "--period", "0.02"], env=env)
    time.sleep(seconds)
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    with gzip.open(out, "rt") as f:
        return [json.loads(line) for line in f]


def test_hostprobe_records_the_gpus_clock_beside_the_hosts_timeline(tmp_path):
    # No GPU here: a stand-in nvidia-smi (a shell script on PATH) prints the CSV lines the real one prints
    # for `--query-gpu=... --format=csv,noheader,nounits -lms N`, so the sampler's reading of them runs for real.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\ncase \"$*\" in *clocks.sm*-lms*) ;; *) exit 9;; esac\n"
                                     "while :; do echo '1980, 3201, 312.45, P0, 87, 0x0000000000000001'; "
                                     "sleep 0.02; done\n")
    (fake / "nvidia-smi").chmod(0o755)
    lines = _probe(tmp_path, fake)
    gpu = [s["gpu"] for s in lines if s["gpu"]]
    assert len(lines) >= 5 and len(gpu) >= len(lines) // 2
    assert gpu[-1]["sm_mhz"] == 1980.0 and gpu[-1]["power_w"] == 312.45 and gpu[-1]["throttle"] == "0x0000000000000001"
    assert 0 <= gpu[-1]["age_ms"] < 1000


def test_hostprobe_without_nvidia_smi_records_no_gpu_and_the_table_reads_both(tmp_path):
    empty = tmp_path / "nobin"
    empty.mkdir()
    lines = _probe(tmp_path, empty)
    assert lines and all(s["gpu"] is None for s in lines)
    from levels_table import rows

    # the H200 results predate the GPU readings: their table has no GPU columns and still reads
    starts = rows(REPO / "examples" / "gpu_loop" / "results" / "h200-2026-12-02-levels")
    assert starts and all("sm_mhz_median" not in p for s in starts for p in s["phases"])
