"""`perfscope trace` end to end: through a real OpenSSH server (tests/sshd.py) to the real
reproduction server (examples/repro_server, on CPU), plus the failure paths."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import need
from clirun import invoke

from perfscope import rundir
from perfscope.load.reader import parse
from perfscope.remote.sglang_api import SGLangClient
from net import StubHandler
from sshd import free_port, keygen, public_line

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("no_agent")


def ssh_args(sshd, known_hosts=None):
    return ["--host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port), "--identity", str(sshd.user_key),
            "--known-hosts", str(known_hosts or sshd.known_hosts)]


@pytest.fixture(scope="module")
def repro_server(tmp_path_factory):
    """The real reproduction server on CPU, small enough to profile in seconds."""
    proc, port = start_repro(tmp_path_factory.mktemp("repro") / "server.log")
    yield port
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def start_repro(log: Path) -> tuple[subprocess.Popen, int]:
    """Start a reproduction server (its admin key: s3cret-admin-key); (its process, its port)."""
    need.module("torch")
    env = {**os.environ, "REPRO_ADMIN_API_KEY": "s3cret-admin-key"}
    proc = subprocess.Popen(
        # a context as long as the pool: one request can stream for the length of a test
        [sys.executable, "-m", "examples.repro_server", "--port", "0", "--num-layers", "2", "--threads", "1",
         "--context-length", "32768"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=open(log, "wb"), env=env, text=True,
    )
    port = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        m = re.search(r"(?:port[ =:]+|127\.0\.0\.1:)(\d{2,5})", line or "")
        if m:
            port = int(m.group(1))
            break
    if port is None:
        proc.kill()
        pytest.fail(f"repro server did not start: {log.read_text()[-2000:]}")
    return proc, port


def test_trace_end_to_end_through_sshd(sshd, repro_server, tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    kh = tmp_path / "known_hosts"  # unknown host, recorded by --accept-new-host-key
    out = tmp_path / "run"
    rc, stdout, err = invoke("trace", *ssh_args(sshd, kh), "--accept-new-host-key", "--port", str(repro_server), "--steps", "4",
         "--input-len", "16", "--output-len", "24", "--api-key-env", "REPRO_KEY", "--timeout", "120",
         "--out", str(out), "--json")
    assert rc == 0, err
    assert "s3cret" not in stdout + err
    assert kh.read_text() == sshd.host_key_line
    summary = json.loads(stdout)
    info = rundir.read_run(out, verify=True)
    assert summary["run_dir"] == str(out) and len(summary["files"]) == len(info.files) >= 1
    raw = (out / "run.json").read_text()
    assert "s3cret" not in raw and "--api-key-env" in raw
    assert info.engine == "sglang" and info.host == f"{sshd.user}@127.0.0.1:{sshd.port}"
    assert info.server_info["kv_cache_dtype"] == "fp8_e4m3" and info.versions.get("server")
    assert info.versions.get("torch")  # from the server's own interpreter
    assert info.timings.get("tpot_ms") and info.timings.get("ttft_ms")
    assert info.profile["num_steps"] == 4
    for f in info.files:
        assert f.rel.startswith("traces/") and f.rel.endswith(".trace.json.gz") and f.rank == 0
        data = f.path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == f.sha256
        # a complete Kineto trace (perfscope's loader: it also repairs torch's unescaped names)
        assert parse(gzip.decompress(data), f.rel).meta.events > 0
    assert {f.stage for f in info.files} <= {"DECODE", "EXTEND", None}
    # the remote folder was removed after the verified copy
    assert not Path(info.profile["output_dir"]).exists()


def test_trace_refuses_unknown_host_key(sshd, repro_server, tmp_path):
    kh = tmp_path / "kh"
    kh.write_text("")
    rc, _, err = invoke("trace", *ssh_args(sshd, kh), "--port", str(repro_server), "--out", str(tmp_path / "r"))
    assert rc == 3 and "not in" in err and "--accept-new-host-key" in err
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_trace_refuses_changed_host_key(sshd, repro_server, tmp_path):
    kh = tmp_path / "kh"
    other = keygen(tmp_path / "other")
    kh.write_text(f"[127.0.0.1]:{sshd.port} {public_line(other)}\n")
    rc, _, err = invoke("trace", *ssh_args(sshd, kh), "--accept-new-host-key", "--port", str(repro_server),
                          "--out", str(tmp_path / "r"))
    assert rc == 3 and "CHANGED" in err and "attack" in err


def test_trace_wrong_user_key(sshd, repro_server, tmp_path):
    wrong = keygen(tmp_path / "wrong")
    args = ssh_args(sshd)
    args[args.index("--identity") + 1] = str(wrong)
    rc, _, err = invoke("trace", *args, "--port", str(repro_server), "--out", str(tmp_path / "r"))
    assert rc == 3 and "authentication" in err and "refused" in err


def test_trace_server_down(sshd, tmp_path):
    port = free_port()  # nothing listens there on the host
    rc, _, err = invoke("trace", *ssh_args(sshd), "--port", str(port), "--out", str(tmp_path / "r"))
    assert rc == 3 and f"nothing answers on 127.0.0.1:{port}" in err
    assert "Traceback" not in err


def test_trace_bad_options(tmp_path, monkeypatch):
    rc, _, err = invoke("trace", "--out", str(tmp_path / "r"))
    assert rc == 2 and "--host" in err
    monkeypatch.delenv("NOPE_KEY", raising=False)
    rc, _, err = invoke("trace", "--url", "http://127.0.0.1:1", "--api-key-env", "NOPE_KEY")
    assert rc == 2 and "NOPE_KEY" in err
    rc, _, err = invoke("trace", "--url", "http://127.0.0.1:1", "--engine", "vllm")
    assert rc == 2 and "--profile-dir" in err
    for flag in ("--no-stack", "--no-shapes"):  # vLLM's profiler is configured at its launch
        rc, _, err = invoke("trace", "--url", "http://127.0.0.1:1", "--engine", "vllm", "--profile-dir",
                            str(tmp_path), flag, "--out", str(tmp_path / "r"))
        assert rc == 2 and "torch_profiler_with_stack=false" in err and "Traceback" not in err, err


# A server that accepts /start_profile and then never writes a trace (a hung scheduler, a full
# disk) cannot be made from the real repro server, whose profiler always finishes: this one case
# uses a tiny stub speaking the same endpoints. It records /stop_profile calls.
class _NeverCompletes(StubHandler):
    calls: list[str] = []

    def _json(self, obj, code=200):
        self._send(code, json.dumps(obj).encode())

    def do_GET(self):
        self.calls.append(self.path)
        if self.path in ("/server_info", "/get_server_info"):
            return self._json({"version": "0.5.5", "tp_size": 1, "model_path": "stub"})
        if self.path in ("/start_profile", "/stop_profile"):
            return self._json({"ok": True})
        if self.path == "/health":
            return self._json({})
        self._json({"error": "not found"}, 404)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        self.calls.append(self.path)
        if self.path in ("/start_profile", "/stop_profile"):
            return self._json({"ok": True})
        if self.path == "/generate":
            req = json.loads(body or b"{}")
            max_new = (req.get("sampling_params") or {}).get("max_new_tokens", 8)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(max_new):
                frame = {"text": f" t{i}", "output_ids": [i],
                         "meta_info": {"completion_tokens": i + 1, "prompt_tokens": 4,
                                       "finish_reason": None if i + 1 < max_new else {"type": "length"}}}
                self.wfile.write(f"data: {json.dumps(frame)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.01)
            self.wfile.write(b"data: [DONE]\n\n")
            return
        self._json({"error": "not found"}, 404)


@pytest.fixture
def stuck_server():
    _NeverCompletes.calls = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NeverCompletes)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield httpd.server_address[1], _NeverCompletes.calls
    httpd.shutdown()


def test_profile_that_never_completes(sshd, stuck_server, tmp_path):
    port, calls = stuck_server
    t0 = time.monotonic()
    rc, _, err = invoke("trace", *ssh_args(sshd), "--port", str(port), "--timeout", "3", "--steps", "2",
                          "--output-len", "8", "--input-len", "4", "--out", str(tmp_path / "r"))
    assert rc == 3 and "did not complete within 3s" in err and "profiler was stopped" in err
    assert time.monotonic() - t0 < 60
    assert "/start_profile" in calls and calls.index("/stop_profile") > calls.index("/start_profile")


def test_one_host_failing_stops_the_others_profiles(sshd, stuck_server, tmp_path, monkeypatch):
    # host 1: the stuck server (armed, waiting up to --timeout 60); host 2 points at a port where
    # no SSH server listens. host 2's failure must end the run well
    # before host 1's timeout, and whatever host 1 armed must be stopped.
    port, calls = stuck_server
    good = f"{sshd.user}@127.0.0.1:{sshd.port}"
    bad = f"127.0.0.1:{free_port()}"  # no SSH server there
    t0 = time.monotonic()
    rc, _, err = invoke("trace", "--host", good, "--host", bad, "--identity", str(sshd.user_key), "--known-hosts",
                          str(sshd.known_hosts), "--port", str(port), "--timeout", "60",
                          "--output-len", "8", "--input-len", "4", "--out", str(tmp_path / "r"))
    assert rc == 3 and "unreachable" in err
    assert time.monotonic() - t0 < 45
    if "/start_profile" in calls:
        assert calls.index("/stop_profile") > calls.index("/start_profile")


def test_a_long_output_len_does_not_hold_the_trace(repro_server, tmp_path, monkeypatch):
    """The load stops once the traces are complete: a request still streaming then is cut, and its
    tokens are timed (TTFT, TPOT) without waiting for the rest of its --output-len."""
    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    out = tmp_path / "run"
    rc, stdout, err = invoke("trace", "--url", f"http://127.0.0.1:{repro_server}", "--steps", "4", "--input-len", "16",
         "--output-len", "4000", "--api-key-env", "REPRO_KEY", "--timeout", "120", "--out", str(out), "--json")
    assert rc == 0, err
    info = rundir.read_run(out, verify=True)
    t = info.timings
    assert t["requests"] == 0 and t["requests_cut"] == 1, t
    assert 4 <= t["output_tokens"] < 4000 and t["tpot_ms"] > 0 and t["ttft_ms"] > 0, t
    assert t["e2e_ms"] is None  # no request ended: no end-to-end latency
    assert info.workload["output_len"] == 4000 and len(info.files) >= 1


def test_trace_with_bench_measures_without_the_profiler(repro_server, tmp_path, monkeypatch):
    """--bench N: before the profiler is armed (a GPU trace leaves CUPTI attached to the server), the
    same workload is measured with no profiler running and stored in the run folder; diagnose then
    reports that TPOT, not the profiled one."""
    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    out = tmp_path / "run"
    rc, stdout, err = invoke("trace", "--url", f"http://127.0.0.1:{repro_server}", "--steps", "3", "--input-len", "16",
         "--output-len", "8", "--bench", "2", "--api-key-env", "REPRO_KEY", "--timeout", "120", "--out", str(out),
         "--json")
    assert rc == 0, err
    assert "without the profiler" in err
    assert err.index("measuring without the profiler first") < err.index("profiler armed")
    bench = json.loads((out / "bench.json").read_text())
    assert bench["requests"] == 2 and bench["workload"]["output_len"] == 8 and bench["tpot_ms"] > 0
    t = rundir.read_run(out).timings
    assert t["bench"]["tpot_ms"] == bench["tpot_ms"] and t["tpot_ms"] > 0  # both kept
    assert json.loads(stdout)["timings"]["bench"]["tpot_ms"] == bench["tpot_ms"]
    rc, dout, err = invoke("diagnose", str(out), "--json")
    assert rc == 0, err
    timing = json.loads(dout)["run"]["timings"]
    assert timing["bench"]["tpot_ms"] == bench["tpot_ms"]


def test_a_busy_server_is_not_profiled_by_stage(repro_server, tmp_path, monkeypatch):
    """SGLang starts a by-stage profile's DECODE file at the first decode batch and its EXTEND file at
    the first prefill: on a server already decoding, the DECODE file starts first, a later prefill
    starts a second profiler over it, and the EXTEND file never comes (SGLang 0.5.13 on the H200: the
    trace timed out and the server stayed slower). With another client's request streaming, trace
    profiles --steps forward steps in one file instead and says why; an explicit --by-stage is refused
    before anything is armed; once the server is idle again the default is by stage."""
    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    url = f"http://127.0.0.1:{repro_server}"
    other = SGLangClient(url, api_key="s3cret-admin-key", timeout=60)
    stop, seen = threading.Event(), []

    def someone_else():
        for fr in other.generate_stream({"input_ids": [5, 6, 7], "sampling_params": {
                "max_new_tokens": 30000, "temperature": 0, "ignore_eos": True}}, timeout=60, stop=stop):
            seen.append(fr)

    th = threading.Thread(target=someone_else, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 30
        while other.requests_in_server() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.requests_in_server() >= 1, (len(seen), th.is_alive())
        common = ["--url", url, "--steps", "3", "--input-len", "16", "--output-len", "8",
                  "--api-key-env", "REPRO_KEY", "--timeout", "120"]
        rc, _, err = invoke("trace", *common, "--by-stage", "--out", str(tmp_path / "refused"))
        assert rc == 2 and "--by-stage:" in err and "request(s)" in " ".join(err.split()), err
        assert "profiler armed" not in err and not (tmp_path / "refused" / "run.json").exists()
        out = tmp_path / "busy"
        rc, _, err = invoke("trace", *common, "--out", str(out))
        assert rc == 0, err
        assert "request(s) in the server: profiling 3 forward steps in one file per rank" in " ".join(err.split())
        names = [Path(f.path).name for f in rundir.read_run(out, verify=True).files]
        assert len(names) == 1 and "-DECODE" not in names[0] and "-EXTEND" not in names[0], names
    finally:
        stop.set()
        th.join(30)
    deadline = time.monotonic() + 30
    while other.requests_in_server() and time.monotonic() < deadline:
        time.sleep(0.05)
    out = tmp_path / "idle"
    rc, _, err = invoke("trace", *common, "--out", str(out))
    assert rc == 0, err
    names = sorted(Path(f.path).name.rsplit("-", 1)[1] for f in rundir.read_run(out).files)
    assert names == ["DECODE.trace.json.gz", "EXTEND.trace.json.gz"], names


@pytest.mark.parametrize("columns", ["80", "200"])
def test_the_run_folder_and_the_next_command_are_one_line_each(repro_server, tmp_path, monkeypatch, columns):
    """Piped (a log), at 80 and 200 columns: trace's last lines name the run folder and the next
    command (perfscope diagnose RUN) whole, each on one line, however deep the folder (at 80 columns
    the command was folded inside the path)."""
    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    monkeypatch.setenv("COLUMNS", columns)
    out = tmp_path / "a-rather-long-folder-name-for-the-runs" / "with-another-long-subfolder-name" / "run-one"
    assert len(f"next: perfscope diagnose {out}") > 80
    rc, stdout, err = invoke("trace", "--url", f"http://127.0.0.1:{repro_server}", "--steps", "3", "--input-len", "16",
         "--output-len", "8", "--api-key-env", "REPRO_KEY", "--timeout", "120", "--out", str(out))
    assert rc == 0, err
    lines = stdout.splitlines()
    assert f"next: perfscope diagnose {out}" in lines, stdout
    assert any(ln.startswith(f"run folder: {out}  ") for ln in lines), stdout


def test_no_stack_traces_without_python_frames_and_diagnose_says_what_is_lost(repro_server, tmp_path, monkeypatch):
    """--no-stack: the profile request asks for no Python stacks (the server's profiler records no
    python_function events), run.json says so, and diagnose of the run works as usual (its finding
    included) but says that its ops carry no source line. --no-shapes: no input dims, and diagnose
    says what that costs (here the cast finding, read from shapes on a trace without GPU kernels)."""
    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")

    def traced(flag: str, name: str):
        """``trace`` of the reproduction server with ``flag`` into tmp_path/name: the run folder and each
        of its trace files' events."""
        out = tmp_path / name
        rc, _, err = invoke("trace", "--url", f"http://127.0.0.1:{repro_server}", "--steps", "3", "--input-len",
                            "16", "--output-len", "24", flag, "--api-key-env", "REPRO_KEY", "--timeout", "120",
                            "--out", str(out))
        assert rc == 0, err
        info = rundir.read_run(out, verify=True)
        return out, info, [(f.rel, json.loads(gzip.decompress(f.path.read_bytes()))["traceEvents"]) for f in info.files]

    out, info, files = traced("--no-stack", "run")
    assert info.profile["with_stack"] is False and info.profile["record_shapes"] is True
    for rel, events in files:
        assert any(e.get("cat") == "cpu_op" for e in events)
        assert not any(e.get("cat") == "python_function" for e in events), rel
    rc, stdout, err = invoke("diagnose", str(out), "--json")
    assert rc == 0, err
    d = json.loads(stdout)
    lost = [n for n in d["notes"] if n.startswith("traced without Python stacks (--no-stack)")]
    assert len(lost) == 1 and "source line" in lost[0], d["notes"]
    ops = d["ranks"][0]["ops"]
    assert ops and all(not (o.get("attribution") or {}).get("source") for o in ops)
    assert "fp8-kv-cast" in [f["id"] for f in d["findings"]]  # read from the ops' dtypes and shapes
    rc, stdout, err = invoke("diagnose", str(out))
    assert rc == 0 and "traced without Python stacks" in stdout + err and "Traceback" not in err
    # --no-shapes: no input dims recorded, so the cast rule cannot read the copy of this CPU-only trace
    out, info, files = traced("--no-shapes", "noshapes")
    assert info.profile["with_stack"] is True and info.profile["record_shapes"] is False
    for rel, events in files:
        assert not any("Input Dims" in (e.get("args") or {}) for e in events if e.get("cat") == "cpu_op"), rel
    rc, stdout, err = invoke("diagnose", str(out), "--json")
    assert rc == 0, err
    d = json.loads(stdout)
    assert [n for n in d["notes"] if n.startswith("traced without shapes (--no-shapes)")], d["notes"]
    assert not [n for n in d["notes"] if "without Python stacks" in n]
    assert "fp8-kv-cast" not in [f["id"] for f in d["findings"]]


def _trace_until_armed(port: int, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """``perfscope trace`` of an endless load on the reproduction server at ``port`` in a child process,
    its stderr read up to the line saying the profiler is armed: (the child, the lines read)."""
    trace = subprocess.Popen(
        [sys.executable, "-m", "perfscope", "trace", "--url", f"http://127.0.0.1:{port}", "--steps", "100000",
         "--input-len", "16", "--output-len", "100000", "--api-key-env", "REPRO_KEY", *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    assert trace.stderr is not None
    for line in trace.stderr:
        lines.append(line)
        if "profiler armed" in line:
            break
    return trace, lines


@pytest.mark.slow
def test_a_server_that_dies_during_the_profile_ends_the_trace_in_one_line(tmp_path, monkeypatch):
    """The server's process dies while it profiles (here a SIGSEGV, as torch's profiler has killed real
    SGLang servers): trace ends at once with one line saying the server is gone, the likely cause and
    the retry, exit 3 (a server failure), no traceback, and the run folder marked incomplete."""
    import signal

    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    proc, port = start_repro(tmp_path / "server.log")
    out = tmp_path / "run"
    try:
        trace, lines = _trace_until_armed(port, "--timeout", "300", "--out", str(out))
        assert lines and "profiler armed" in lines[-1], "".join(lines)
        time.sleep(1.0)  # the load streaming under the profiler
        os.kill(proc.pid, signal.SIGSEGV)
        t0 = time.monotonic()
        _, rest = trace.communicate(timeout=120)
        assert proc.wait(10) == -signal.SIGSEGV
    finally:
        proc.kill()
    err = "".join(lines) + rest
    assert trace.returncode == 3, err
    assert time.monotonic() - t0 < 60  # at once, not at --timeout
    (last,) = [ln for ln in err.splitlines() if ln.startswith("perfscope: error:")]
    assert f"the server on 127.0.0.1:{port} stopped during the profile (its process (pid {proc.pid}) is gone)" in last
    assert "torch profiler" in last and "--no-by-stage" in last and "--no-stack" in last, last
    assert "Traceback" not in err and "/stop_profile failed" not in err
    assert json.loads((out / "run.json").read_text())["status"] == "incomplete"


@pytest.mark.slow
def test_a_server_that_stops_answering_during_the_profile_is_said_in_one_line(tmp_path, monkeypatch):
    """The server's process still there but answering nothing (here SIGSTOPped mid-profile, as a hung
    scheduler leaves it): once the load's stream stalls past --http-timeout, trace ends with one line
    saying /health fails, the likely cause and the retry, exit 3, no traceback."""
    import signal

    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    proc, port = start_repro(tmp_path / "server.log")
    try:
        trace, lines = _trace_until_armed(port, "--timeout", "20", "--http-timeout", "3", "--out", str(tmp_path / "run"))
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGSTOP)
        _, rest = trace.communicate(timeout=120)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)
    err = "".join(lines) + rest
    assert trace.returncode == 3, err
    (last,) = [ln for ln in err.splitlines() if ln.startswith("perfscope: error:")]
    assert f"the server on 127.0.0.1:{port} stopped during the profile (/health fails for 10s)" in last, last
    assert "--no-stack" in last and "Traceback" not in err
