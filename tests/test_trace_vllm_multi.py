"""`perfscope trace` success paths beyond one SGLang host, end to end with real processes:

* ``--engine vllm`` against the reproduction server in vLLM emulation (``--api vllm
  --torch-profiler-dir DIR``: bodiless /start_profile and /stop_profile, traces written by the
  server as ``{hostname}_{pid}.{time_ns}.pt.trace.json.gz``, streamed /v1/completions, /v1/models,
  /version, /metrics), with ``--url`` and through the real sshd (tests/sshd.py);
* several hosts in one run: one sshd reached under two host names (127.0.0.1 and localhost) and two
  repro servers on different ports (``--port`` given once per ``--host``).

Each run folder is then read by ``perfscope diagnose``, which must report the fp8-kv-cast finding.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from clirun import invoke
from perfscope import rundir
from perfscope.load.reader import parse
from perfscope.remote.vllm_api import VLLMClient, parse_cache_config
from reproserver import start_repro

pytestmark = pytest.mark.usefixtures("no_agent")

VLLM_NAME = re.compile(r"^[^/]+_\d+\.\d{16,}\.pt\.trace\.json(\.gz)?$")  # torch's tensorboard_trace_handler


def diagnose_json(run_dir: Path) -> dict:
    rc, out, err = invoke("diagnose", str(run_dir), "--json", "--workers", "1")
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """The repro server speaking vLLM's API, profiler dir set, shapes recorded (vLLM's
    VLLM_TORCH_PROFILER_RECORD_SHAPES=1). A stale trace already in the dir must be left alone."""
    d = tmp_path_factory.mktemp("vllm-profiles")
    stale = d / "otherhost_1.1700000000000000000.pt.trace.json.gz"
    stale.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    with start_repro("--api", "vllm", "--torch-profiler-dir", str(d), env={"VLLM_TORCH_PROFILER_RECORD_SHAPES": "1"},
                     log_dir=tmp_path_factory.mktemp("repro-vllm")) as (url, _):
        yield url, d, stale


def _check_vllm_run(out: Path, profile_dir: Path, stale: Path) -> None:
    info = rundir.read_run(out, verify=True)
    assert info.engine == "vllm"
    assert info.server_info["engine"] == "vllm" and info.server_info["kv_cache_dtype"] == "fp8_e4m3"
    assert info.server_info["max_total_num_tokens"] == 4000 and info.versions["server"]
    assert info.timings.get("tpot_ms") and info.timings.get("ttft_ms")
    assert len(info.files) == 1
    f = info.files[0]
    assert VLLM_NAME.match(f.path.name), f.path.name
    raw = f.path.read_bytes()
    raw = gzip.decompress(raw) if f.path.name.endswith(".gz") else raw
    assert parse(raw, f.rel).meta.events > 0  # a complete Kineto trace
    # the copied trace was removed from the server's dir; the one that was there before was not touched
    assert not (profile_dir / f.path.name).exists() and stale.exists()
    d = diagnose_json(out)
    assert "fp8-kv-cast" in [x["id"] for x in d["findings"]]
    assert d["run"]["engine"] == "vllm"
    assert not any("RECORD_SHAPES" in n for n in d["notes"])  # shapes were recorded: no hint


def test_vllm_client_reads_config(vllm_server):
    url, _, _ = vllm_server
    c = VLLMClient(url)
    info = c.server_info()
    assert info["model_path"].startswith("perfscope-repro/") and info["served_model_name"] == "repro-mla"
    assert info["page_size"] == 1 and info["context_length"] == 4096
    frames = list(c.generate_stream({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4,
                                                                                "ignore_eos": True}}))
    counts = [fr.data["meta_info"]["completion_tokens"] for fr in frames]
    assert counts == [1, 2, 3, 4, 4]  # the last frame is include_usage's summary: no new token
    assert frames[3].data["meta_info"]["finish_reason"] == {"type": "length"}
    assert c.stop_profile() == ""  # vLLM ignores a stop when no profile runs
    assert parse_cache_config('x 1\nvllm:cache_config_info{block_size="16",cache_dtype="fp8"} 1.0\n') == {
        "block_size": "16", "cache_dtype": "fp8"}


def test_bench_vllm(vllm_server, tmp_path):
    url, _, _ = vllm_server
    out = tmp_path / "b"
    rc, stdout, err = invoke("bench", "--url", url, "--engine", "vllm", "--input-len", "8", "--output-len", "6",
                               "--num-requests", "2", "--warmup", "1", "--out", str(out), "--json")
    assert rc == 0, err
    d = json.loads(stdout)
    assert d["requests"] == 2 and d["failed"] == 0 and d["tpot_ms"] > 0
    assert d["stats_ms"]["itl"]["n"] == 2 * 5  # 6 tokens per request: 5 inter-token gaps, as streamed
    run = rundir.read_run(out)
    assert run.engine == "vllm" and run.data["kind"] == "bench" and "--engine" in run.data["command"]


def test_trace_vllm_url_end_to_end(vllm_server, tmp_path):
    url, pdir, stale = vllm_server
    out = tmp_path / "run"
    rc, stdout, err = invoke("trace", "--url", url, "--engine", "vllm", "--profile-dir", str(pdir), "--steps", "4",
                               "--input-len", "16", "--output-len", "24", "--timeout", "60", "--out", str(out),
                               "--json")
    assert rc == 0, err
    assert "stopping the profiler" in err
    _check_vllm_run(out, pdir, stale)


def test_trace_vllm_through_sshd(sshd, vllm_server, tmp_path):
    url, pdir, stale = vllm_server
    port = url.rsplit(":", 1)[1]
    out = tmp_path / "run"
    rc, _, err = invoke("trace", "--host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port),
                          "--identity", str(sshd.user_key), "--known-hosts", str(sshd.known_hosts),
                          "--port", port, "--engine", "vllm", "--profile-dir", str(pdir), "--steps", "4",
                          "--input-len", "16", "--output-len", "24", "--timeout", "60", "--out", str(out))
    assert rc == 0, err
    info = rundir.read_run(out)
    assert info.host == f"{sshd.user}@127.0.0.1:{sshd.port}" and info.versions.get("torch")
    _check_vllm_run(out, pdir, stale)


def test_trace_vllm_plain_json_through_sshd(sshd, tmp_path):
    """vLLM with its profiler's gzip off (VLLM_TORCH_PROFILER_USE_GZIP=0, which saves the server the
    compression): plain ``.pt.trace.json`` files are waited for (complete when the JSON closes),
    copied, hash-checked and diagnosed like gzipped ones."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    stale = pdir / "otherhost_1.1700000000000000000.pt.trace.json"
    stale.write_bytes(b'{"traceEvents": []}')
    with start_repro("--api", "vllm", "--torch-profiler-dir", str(pdir),
                     env={"VLLM_TORCH_PROFILER_RECORD_SHAPES": "1", "VLLM_TORCH_PROFILER_USE_GZIP": "0"},
                     log_dir=tmp_path) as (url, _):
        out = tmp_path / "run"
        rc, _, err = invoke("trace", "--host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port),
                              "--identity", str(sshd.user_key), "--known-hosts", str(sshd.known_hosts),
                              "--port", url.rsplit(":", 1)[1], "--engine", "vllm", "--profile-dir", str(pdir),
                              "--steps", "4", "--input-len", "16", "--output-len", "24", "--timeout", "60",
                              "--out", str(out))
        assert rc == 0, err
    (f,) = rundir.read_run(out).files
    assert f.path.name.endswith(".pt.trace.json"), f.path.name
    _check_vllm_run(out, pdir, stale)


@pytest.mark.slow
def test_trace_vllm_two_ranks(tmp_path):
    """vLLM with tensor parallelism: one trace per worker, named {hostname}_{pid} (no rank in the
    name); /stop_profile replies once both are written. Both come back, and diagnose tells the
    ranks apart by the traces' own distributedInfo."""
    pdir = tmp_path / "profiles"
    with start_repro("--api", "vllm", "--tp-size", "2", "--mlp-size", "128", "--torch-profiler-dir", str(pdir),
                     env={"VLLM_TORCH_PROFILER_RECORD_SHAPES": "1"}, log_dir=tmp_path) as (url, _):
        out = tmp_path / "run"
        rc, _, err = invoke("trace", "--url", url, "--engine", "vllm", "--profile-dir", str(pdir), "--steps", "4",
                              "--input-len", "16", "--output-len", "24", "--timeout", "90", "--out", str(out))
        assert rc == 0, err
    files = rundir.read_run(out, verify=True).files
    assert len(files) == 2 and all(VLLM_NAME.match(f.path.name) for f in files), [f.path.name for f in files]
    assert len({f.path.name.split(".")[0] for f in files}) == 2  # one worker (pid) each
    d = diagnose_json(out)
    ranks = sorted(r["rank"] for r in d["ranks"])
    assert ranks == [0, 1], ranks  # from distributedInfo: the names carry no rank
    for r in d["ranks"]:
        assert r["meta"]["world_size"] == 2
        assert "fp8-kv-cast" in [x["id"] for x in r["findings"]], r["rank"]
    assert d["straggler"] is not None and d["straggler"]["significant"] is False, d["straggler"]


@pytest.mark.slow
def test_trace_vllm_without_shapes_says_what_is_missing(tmp_path):
    """vLLM records no shapes by default. On a trace without GPU kernels the cast cannot be sized
    or typed then: no finding is guessed, and a note says which setting brings the evidence."""
    pdir = tmp_path / "profiles"
    with start_repro("--api", "vllm", "--torch-profiler-dir", str(pdir), log_dir=tmp_path) as (url, _):
        out = tmp_path / "run"
        rc, _, err = invoke("trace", "--url", url, "--engine", "vllm", "--profile-dir", str(pdir), "--steps", "4",
                              "--input-len", "16", "--output-len", "24", "--timeout", "60", "--out", str(out))
        assert rc == 0, err
    d = diagnose_json(out)
    ids = {f["id"] for f in d["findings"]}
    # the cast is not guessed; a slow step on a busy CPU may be reported as warm-up (measured, not guessed)
    assert "fp8-kv-cast" not in ids and ids <= {"warmup-in-window"}, ids
    assert d["ops"][0]["bucket"] == "copy" and d["ops"][0]["input_types"] is None
    assert any("VLLM_TORCH_PROFILER_RECORD_SHAPES=1" in n for n in d["notes"]), d["notes"]


@pytest.mark.slow
def test_trace_vllm_without_profiler_dir(tmp_path):
    # a vLLM server started without a torch profiler dir has no /start_profile: a clear message
    with start_repro("--api", "vllm", log_dir=tmp_path) as (url, _):
        rc, _, err = invoke("trace", "--url", url, "--engine", "vllm", "--profile-dir", str(tmp_path / "p"),
                              "--steps", "2", "--output-len", "8", "--input-len", "4", "--timeout", "20",
                              "--out", str(tmp_path / "r"))
    assert rc == 3 and "VLLM_TORCH_PROFILER_DIR" in err and "Traceback" not in err


def test_trace_two_hosts_end_to_end(sshd, tmp_path):
    """One sshd under two names, two repro servers: both hosts traced in parallel, one folder each."""
    kh = tmp_path / "known_hosts"
    key = sshd.host_key_line.split(" ", 1)[1]
    kh.write_text(f"[127.0.0.1]:{sshd.port} {key}[localhost]:{sshd.port} {key}")
    out = tmp_path / "run"
    with start_repro(log_dir=tmp_path) as (u1, _), start_repro(log_dir=tmp_path) as (u2, _):
        p1, p2 = u1.rsplit(":", 1)[1], u2.rsplit(":", 1)[1]
        rc, stdout, err = invoke("trace", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--host", f"{sshd.user}@localhost:{sshd.port}",
             "--port", p1, "--port", p2, "--identity", str(sshd.user_key), "--known-hosts", str(kh),
             "--steps", "4", "--input-len", "16", "--output-len", "24", "--timeout", "90", "--out", str(out),
             "--json")
    assert rc == 0, err
    top = json.loads((out / "run.json").read_text())
    labels = [f"{sshd.user}@127.0.0.1:{sshd.port}", f"{sshd.user}@localhost:{sshd.port}"]
    assert top["kind"] == "multi" and top["hosts"] == labels
    assert [m["host"] for m in top["members"]] == labels
    dirs = [m["dir"] for m in top["members"]]
    assert len(set(dirs)) == 2
    for d, label, port in zip(dirs, labels, (p1, p2)):
        member = rundir.read_run(out / d, verify=True)
        assert member.kind == "trace" and member.host == label and member.files
        assert member.url.endswith(f"127.0.0.1:{port}")  # each host's own server port
        assert member.timings.get("tpot_ms")
        assert all(f.host == label for f in member.files)
    info = rundir.read_run(out, verify=True)
    assert {f.host for f in info.files} == set(labels)
    assert all(fe["path"].split("/")[0] in dirs for fe in top["files"])
    summary = json.loads(stdout)
    assert summary["hosts"] == labels and set(summary["timings"]) == set(labels)
    d = diagnose_json(out)
    files = [r["file"] for r in d["ranks"]]
    assert len(files) == len(info.files) >= 2
    assert {Path(f).parent.parent.name for f in files} == set(dirs)  # both hosts' traces analysed
    assert {r["meta"].get("host") for r in d["ranks"]} == set(labels)  # each rank names its host
    rc, table, _ = invoke("diagnose", str(out), "--workers", "1")
    assert rc == 0 and "Per rank" in table and "host" in table
    assert "fp8-kv-cast" in [x["id"] for x in d["findings"]]


def test_trace_port_options(tmp_path):
    rc, _, err = invoke("trace", "--host", "a", "--host", "b", "--port", "1", "--port", "2", "--port", "3",
                          "--out", str(tmp_path / "r"))
    assert rc == 2 and "3 --port values for 2 --host" in err
    rc, _, err = invoke("trace", "--url", "http://127.0.0.1:1", "--port", "5", "--out", str(tmp_path / "r"))
    assert rc == 2 and "--port goes with --host" in err
