"""The parts of `perfscope trace` that need no HTTP server: the run folder format, and the wait
for complete traces on a real SSH host (tests/sshd.py), including a partial (still growing or
truncated) gzip file."""

from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path

import pytest
from paths import TRACES, json_of

from perfscope import rundir
from perfscope.remote.hostio import (
    LocalHost,
    SSHHost,
    gzip_intact_local,
    parse_nvidia_smi,
)
from perfscope.remote.hostio.probes import listen_pid
from perfscope.capture.options import TraceOptions
from perfscope.capture.trace import host_dirname
from perfscope.capture.wait import expected_files, wait_complete
from perfscope.errors import InputError, RemoteError
from perfscope.remote.ssh import connect

pytestmark = pytest.mark.usefixtures("no_agent")

SGL_NAME = "1732871234.5-TP-0-DECODE.trace.json.gz"


def _trace_bytes(n_events: int = 2000) -> bytes:
    doc = {"traceEvents": [{"ph": "X", "name": f"k{i}", "ts": i, "dur": 1, "pid": 0, "tid": 0}
                           for i in range(n_events)]}
    return gzip.compress(json.dumps(doc).encode())


def test_parse_trace_name():
    assert rundir.parse_trace_name("1732871234.5-TP-3-DECODE.trace.json.gz") == {
        "rank": 3, "stage": "DECODE", "parallel": {"tp": 3, "dp": None, "pp": None, "ep": None}, "role": None}
    # real vLLM 0.32's worker and front-end files (tests/test_real_vllm.py makes them)
    assert rundir.parse_trace_name("rank0.1796115885245003991.pt.trace.json.gz")["rank"] == 0
    fe = rundir.parse_trace_name("vm_13756.async_llm.1796115883908037566.pt.trace.json.gz")
    assert fe["role"] == "frontend" and fe["rank"] is None
    m = rundir.parse_trace_name("pre-1732.1-TP-1-DP-2-PP-0-EP-1-EXTEND.trace.json.gz")
    assert (m["rank"], m["stage"], m["parallel"]) == (1, "EXTEND", {"tp": 1, "dp": 2, "pp": 0, "ep": 1})
    assert rundir.parse_trace_name("123-TP-0.trace.json.gz")["stage"] is None  # 0.4.6 naming
    assert rundir.parse_trace_name("worker-rank-2.1700.pt.trace.json.gz")["rank"] == 2  # vLLM-like
    assert rundir.parse_trace_name("host_1234.1700.pt.trace.json.gz")["rank"] is None


def test_write_read_run_roundtrip(tmp_path):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    data = _trace_bytes()
    for name in (SGL_NAME, "1732871234.5-TP-0-EXTEND.trace.json.gz", "1732871234.5-TP-1-DECODE.trace.json.gz"):
        (run / "traces" / name).write_bytes(data)
    rundir.write_run(
        run, command=["perfscope", "trace", "--host", "gpu1"], host="gpu1", engine="sglang",
        versions={"sglang": "0.5.5"}, server_info={"kv_cache_dtype": "fp8_e4m3", "tp_size": 2},
        gpu=[{"name": "NVIDIA H200"}], workload={"concurrency": 1}, timings={"tpot_ms": 30.0},
        files=[{"path": f"traces/{p.name}"} for p in sorted((run / "traces").iterdir())],
    )
    info = rundir.read_run(run, verify=True)
    assert info.schema_version == rundir.SCHEMA_VERSION and info.tool_version
    assert info.server_info["kv_cache_dtype"] == "fp8_e4m3" and info.host == "gpu1" and info.hosts == ["gpu1"]
    assert [(f.rank, f.stage) for f in info.files] == [(0, "DECODE"), (0, "EXTEND"), (1, "DECODE")]
    assert all(f.sha256 and f.bytes == len(data) for f in info.files)
    assert len(info.traces("DECODE")) == 2
    assert rundir.trace_files(run) == info.traces()
    assert rundir.read_run(run / "run.json").dir == run
    rundir.update_run(run, timings={"bench": {"tpot_ms": 7.0}})
    assert rundir.read_run(run).timings == {"tpot_ms": 30.0, "bench": {"tpot_ms": 7.0}}


def test_read_run_rejects_bad_folders(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        rundir.read_run(tmp_path / "nope")
    with pytest.raises(InputError, match="no run.json"):
        rundir.read_run(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        rundir.read_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(InputError, match="newer|upgrade"):
        rundir.read_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 1, "files": [{"path": "../../etc/passwd"}]}))
    with pytest.raises(InputError, match="leaves the run folder"):
        rundir.read_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 1, "files": [{"path": "traces/x.trace.json.gz"}]}))
    with pytest.raises(InputError, match="missing"):
        rundir.read_run(tmp_path)
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "x.trace.json.gz").write_bytes(b"abc")
    (tmp_path / "run.json").write_text(json.dumps(
        {"schema_version": 1, "files": [{"path": "traces/x.trace.json.gz", "bytes": 10, "sha256": "0" * 64}]}))
    with pytest.raises(InputError, match="truncated"):
        rundir.read_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps(
        {"schema_version": 1, "files": [{"path": "traces/x.trace.json.gz", "bytes": 3, "sha256": "0" * 64}]}))
    rundir.read_run(tmp_path)  # sizes match; sha256 only on verify
    with pytest.raises(InputError, match="sha256"):
        rundir.read_run(tmp_path, verify=True)


def test_trace_files_without_run_json(tmp_path):
    with pytest.raises(InputError, match="no trace files"):
        rundir.trace_files(tmp_path)
    (tmp_path / SGL_NAME).write_bytes(_trace_bytes(10))
    assert rundir.trace_files(tmp_path) == [tmp_path / SGL_NAME]


def test_multi_host_run_folder(tmp_path):
    for h in ("a", "b"):
        d = tmp_path / h / "traces"
        d.mkdir(parents=True)
        (d / SGL_NAME).write_bytes(_trace_bytes(10))
        rundir.write_run(tmp_path / h, host=h, server_info={"disaggregation_mode": "decode" if h == "b" else "prefill"},
                         files=[{"path": f"traces/{SGL_NAME}", "host": h}])
    rundir.write_run(tmp_path, kind="multi", host="a", hosts=["a", "b"],
                     files=[{"path": f"{h}/traces/{SGL_NAME}", "host": h} for h in ("a", "b")],
                     members=[{"host": h, "dir": h} for h in ("a", "b")])
    info = rundir.read_run(tmp_path)
    assert [m.host for m in info.members] == ["a", "b"] and len(info.traces()) == 2
    assert info.server_info == {"disaggregation_mode": "prefill"}  # the first host's
    assert rundir.read_run(tmp_path / "b").server_info["disaggregation_mode"] == "decode"


def test_expected_files_and_names():
    assert expected_files({"tp_size": 8}, by_stage=False) == 8
    assert expected_files({"tp_size": 8}, by_stage=True) == 16
    assert expected_files({"tp_size": 2, "dp_size": 4}, by_stage=False) == 8
    assert expected_files({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, by_stage=False) == 8
    assert expected_files({"tp_size": 16, "nnodes": 2}, by_stage=False) == 8
    assert expected_files({}, by_stage=False) == 1
    taken: set[str] = set()
    assert [host_dirname(x, taken) for x in ("root@gpu1:22", "gpu1", "10.0.0.1")] == ["gpu1_22", "gpu1", "10.0.0.1"]


def test_nvidia_smi_and_ss_parsing():
    g = parse_nvidia_smi("0, NVIDIA H200, GPU-abc, 570.1, 143771, 1980, 3201, 1980, 3201, 700.00, 41, 0\n")
    assert g[0]["name"] == "NVIDIA H200" and g[0]["clocks_sm_mhz"] == 1980.0 and g[0]["index"] == 0
    ss = 'LISTEN 0 2048 0.0.0.0:30000 0.0.0.0:* users:(("python3",pid=4242,fd=7))\n' \
         'LISTEN 0 128 127.0.0.1:300000 0.0.0.0:* users:(("x",pid=1,fd=3))\n'
    assert listen_pid(ss, 30000) == 4242
    assert listen_pid("LISTEN 0 5 [::]:30000 [::]:* users:((\"p\",pid=9,fd=1))", 30000) == 9


def _grow(path: Path, data: bytes, chunks: int, delay: float) -> threading.Thread:
    """Write ``data`` to ``path`` in pieces, like a server gzipping a trace: the file exists with
    a growing, incomplete gzip stream before it is whole."""
    def run():
        step = max(len(data) // chunks, 1)
        with open(path, "wb") as f:
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                f.flush()
                time.sleep(delay)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("over_ssh", [True, False])
def test_wait_returns_only_complete_files(sshd, tmp_path, over_ssh):
    folder = tmp_path / "remote"
    folder.mkdir()
    data = _trace_bytes(20000)
    writer = _grow(folder / SGL_NAME, data, chunks=6, delay=0.35)
    opts = TraceOptions(timeout=30, poll_s=0.3)
    logs = []
    if over_ssh:
        with connect(sshd.target()) as s:
            got = wait_complete(SSHHost(s), str(folder), 1, set(), opts, None, threading.Event(), "h", logs.append)
    else:
        got = wait_complete(LocalHost(), str(folder), 1, set(), opts, None, threading.Event(), "h", logs.append)
    writer.join()
    assert [f.name for f in got] == [SGL_NAME] and got[0].size == len(data)
    assert gzip_intact_local(folder / SGL_NAME)


def test_truncated_file_is_detected_and_wait_is_bounded(sshd, tmp_path):
    folder = tmp_path / "remote"
    folder.mkdir()
    data = _trace_bytes(20000)
    (folder / SGL_NAME).write_bytes(data[: len(data) // 2])  # a writer that died half way
    with connect(sshd.target()) as s:
        io = SSHHost(s)
        assert io.incomplete([str(folder / SGL_NAME)]) == [str(folder / SGL_NAME)]
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match=r"did not complete within 2s \(0 of 1 trace file\(s\) complete; "
                                              r"incomplete: " + SGL_NAME.replace(".", r"\.")):
            wait_complete(io, str(folder), 1, set(), TraceOptions(timeout=2, poll_s=0.3), None,
                           threading.Event(), "h", print)
        assert time.monotonic() - t0 < 10
    assert not gzip_intact_local(folder / SGL_NAME)


def test_wait_counts_every_rank(sshd, tmp_path):
    # two ranks expected, only one file arrives: not complete
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "1.0-TP-0.trace.json.gz").write_bytes(_trace_bytes(10))
    with connect(sshd.target()) as s:
        with pytest.raises(RemoteError, match="1 of 2 trace file"):
            wait_complete(SSHHost(s), str(folder), 2, set(), TraceOptions(timeout=1.5, poll_s=0.3), None,
                           threading.Event(), "h", print)


def test_host_probes_over_ssh(sshd, tmp_path):
    with connect(sshd.target()) as s:
        io = SSHHost(s)
        d = io.mkdtemp(str(tmp_path))
        assert Path(d).is_dir() and Path(d).parent == tmp_path and Path(d).name.startswith("perfscope-trace.")
        with pytest.raises(RemoteError, match="cannot make a folder"):
            io.mkdtemp(str(tmp_path / "no such dir"))
        v = io.python_versions(io.python_candidates({}), want="torch")
        assert v.get("python") and v.get("interpreter")
        assert isinstance(io.nvidia_smi(), list)  # [] without a GPU
        # the sshd we started listens on a port: ss finds its process
        proc = io.server_process(sshd.port)
        assert proc.get("pid") == sshd.proc.pid or proc == {} or proc.get("pid")


def test_plain_json_trace_is_complete_when_it_closes(sshd, tmp_path):
    """vLLM can write uncompressed traces: such a file counts as complete once its JSON closes,
    checked on the host (python3 there) and here after the copy."""
    from perfscope.remote.hostio import trace_file_complete

    folder = tmp_path / "remote"
    folder.mkdir()
    # the end of a real Kineto trace (shared H200 trace), and the same file cut right after an event
    data = json_of((TRACES / "h200-mla-fp8-kv" / "mla_fp8_graph.json.xz"))
    whole, half = folder / "h_1.1700000000000000001.pt.trace.json", folder / "h_1.1700000000000000002.pt.trace.json"
    whole.write_bytes(data)
    half.write_bytes(data[: data.rindex(b"}", 0, data.rindex(b"]")) + 1])  # ends with an event's "}"
    with connect(sshd.target()) as s:
        io = SSHHost(s)
        assert [f.name for f in io.list_traces(str(folder))] == [whole.name, half.name]
        assert io.incomplete([str(whole), str(half)]) == [str(half)]
    assert LocalHost().incomplete([str(whole), str(half)]) == [str(half)]
    assert trace_file_complete(whole) and not trace_file_complete(half)


def test_writers_temporary_files_are_not_traces(sshd, tmp_path):
    """A server that writes under a hidden temporary name and renames when done (the repro server
    does): the temporary file is not listed, so it never counts as a rank's trace."""
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / f".tmp-{SGL_NAME}").write_bytes(_trace_bytes(10)[:20])
    (folder / SGL_NAME).write_bytes(_trace_bytes(10))
    with connect(sshd.target()) as s:
        assert [f.name for f in SSHHost(s).list_traces(str(folder))] == [SGL_NAME]
    assert [f.name for f in LocalHost().list_traces(str(folder))] == [SGL_NAME]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.slow
def test_versions_probe_reads_torchs_cuda_without_importing_torch(engine):
    """The versions probe runs with the server's interpreter: torch's CUDA/HIP versions come from its
    version.py, the same strings `import torch` gives, without the import (0.7 GB with SGLang's torch)."""
    import subprocess

    from real_engines import engine_python

    from perfscope.remote.hostio import LocalHost
    from perfscope.remote.hostio.probes import VERSIONS_PY

    py = str(engine_python(engine))
    v = LocalHost().python_versions([py], want="torch")
    real = subprocess.run([py, "-c", "import json, torch; print(json.dumps([torch.version.cuda, "
                           "getattr(torch.version, 'hip', None)]))"], capture_output=True, text=True, timeout=300)
    assert [v["cuda"], v["hip"]] == json.loads(real.stdout) and v["torch"] and v["interpreter"] == py
    probe = subprocess.run([py, "-c", VERSIONS_PY + "\nimport sys; print('torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.split()[-1] == "False"


# a real trace of 2.7 MB gzipped, 55.6 MB of JSON (20x): inflated a read block at a time, the gzip
# check held 59 MB (tracemalloc) on it; bounded on both sides it holds about 2 MB
OWL_GZ = TRACES.parent / "tracelens-hf" / "google_owlv2-large-patch14-ensemble__1016001.json.gz"
WORKING_SET = 4 << 20


def test_copy_back_and_checks_hold_a_bounded_working_set_on_a_real_trace(tmp_path):
    """What trace does with each file (the host's completeness check, its sha256, the copy, the check
    of the copy) holds a few MB of Python memory at most, however large the file and however well it
    compresses: measured with tracemalloc on a real multi-MB trace, beside a byte-exact copy."""
    import hashlib
    import subprocess
    import sys
    import tracemalloc

    from perfscope.capture.copyback import copy_back
    from perfscope.remote.hostio import RemoteFile
    from perfscope.remote.hostio.traces import COMPLETE_CHECK_PY

    data = OWL_GZ.read_bytes()
    assert len(gzip.decompress(data)) > 50 << 20  # a 1 MB block of it inflates to ~20 MB
    remote = tmp_path / "remote"
    remote.mkdir()
    src = remote / SGL_NAME
    src.write_bytes(data)
    out, files = tmp_path / "run", []
    tracemalloc.start()
    try:
        assert LocalHost().incomplete([str(src)]) == []  # the wait's check (--url)
        copy_back(LocalHost(), [RemoteFile(src.name, str(src), len(data), 0.0)], out, "h", None, None, files)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    copy = out / rundir.TRACES_DIR / SGL_NAME
    assert copy.read_bytes() == data and files[0]["sha256"] == hashlib.sha256(data).hexdigest()
    assert files[0]["bytes"] == len(data)
    assert peak < WORKING_SET, f"{peak:,} bytes held copying and checking {len(data):,} bytes"
    # the same check as the host runs it over SSH (python3 there), in a process of its own
    probe = subprocess.run([sys.executable, "-X", "tracemalloc", "-c", COMPLETE_CHECK_PY +
                            "\nimport tracemalloc; print(tracemalloc.get_traced_memory()[1])", str(src),
                            str(tmp_path / "run" / "missing.trace.json.gz")],
                           capture_output=True, text=True, timeout=120)
    bad, held = probe.stdout.split()
    assert bad.endswith("missing.trace.json.gz") and int(held) < WORKING_SET, probe.stdout


def test_gzip_check_is_bounded_on_a_stream_of_identical_events(tmp_path):
    """A run of identical events compresses ~1000x: inflated a read block at a time, 1 MB of it would be
    about 1 GB. The check stays within a few MB and gives the same answer at every cut."""
    import tracemalloc

    ev = b'{"ph": "X", "name": "k", "ts": 1, "dur": 1, "pid": 0, "tid": 0},'
    body = b'{"traceEvents": [' + ev * (3 << 20) + b'{}], "traceName": "t"}'  # 200 MB of JSON
    gz = zlib_gzip(body)
    del body
    whole = tmp_path / SGL_NAME
    whole.write_bytes(gz)
    tracemalloc.start()
    try:
        assert gzip_intact_local(whole)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < WORKING_SET, f"{peak:,} bytes held checking {len(gz):,} bytes of gzip"
    for cut in (len(gz) - 1, len(gz) - 8, len(gz) // 2, 100):
        (tmp_path / "cut.trace.json.gz").write_bytes(gz[:cut])
        assert not gzip_intact_local(tmp_path / "cut.trace.json.gz"), cut
    (tmp_path / "tail.trace.json.gz").write_bytes(gz + b"\0" * 4096)  # bytes after the stream: not read
    assert gzip_intact_local(tmp_path / "tail.trace.json.gz")


def zlib_gzip(data: bytes) -> bytes:
    """gzip of ``data`` (level 6, as torch's profiler writes), without gzip.compress's extra copy."""
    import zlib

    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()
