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
