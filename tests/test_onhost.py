"""``trace --analyse-on-host``: the traces analysed by the host's own Python over a real OpenSSH
server on loopback (tests/sshd.py), only the results copied back, the diagnosis the one ``diagnose``
makes of the same traces fetched into the run folder (``trace --fetch``), byte for byte (its
``parallel`` object aside, which says how the files were analysed). The failure paths: a host Python
without msgspec (Debian's /usr/bin/python3 here), a rank file gone from the host, the analysis killed
or past its timeout. Nothing is mocked."""

from __future__ import annotations

import json
from html import escape
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clirun import invoke
from paths import GPU_LOOP, HTA, REPO
from perfscope import rundir
from perfscope.cluster import onhost
from perfscope.errors import InputError, RemoteError
from perfscope.remote.hostio import SSHHost
from perfscope.remote.ssh import connect
import test_trace

pytestmark = pytest.mark.usefixtures("no_agent")
PY = sys.executable  # the host's Python: this venv's (it has msgspec; perfscope comes from the zip)


def _rank_trace(r: int) -> bytes:
    """A real rank trace as gzip, rank ``r`` (HTA's two sampled ranks of one NCCL job; ranks 2, 3, ... are
    those again with their distributedInfo rank made ``r``: distinct bytes), as tests/test_ray.py makes them."""
    import gzip
    import lzma

    b = lzma.open(HTA / "trace_filter" / f"sampled_rank-{r % 2}.json.xz").read()
    b = b.replace(b'"rank": %d,' % (r % 2), b'"rank": %d,' % r, 1)
    return gzip.compress(b, mtime=0)


def ssh_opts(sshd) -> list[str]:
    return ["--ssh-user", sshd.user, "--identity", str(sshd.user_key), "--known-hosts", str(sshd.known_hosts)]


def _on_host_folder(run: Path, remote: Path, label: str, traces: dict[str, bytes], like: dict | None = None) -> Path:
    """A run folder as ``trace --analyse-on-host`` writes it before the analysis: run.json (``like``'s
    server config, workload and timings) listing ``traces`` {name: bytes}, written into ``remote``
    (the host's folder), under remote_files."""
    remote.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, data in traces.items():
        (remote / name).write_bytes(data)
        meta = rundir.parse_trace_name(name)
        entries.append({"path": f"traces/{name}", "remote_path": str(remote / name), "sha256": None,
                        "bytes": len(data), "rank": meta["rank"], "stage": meta["stage"], "host": label,
                        "parallel": meta["parallel"]})
    like = like or {}
    rundir.write_run(run, command=["perfscope", "trace", "--analyse-on-host"], host=label, engine="sglang",
                     server_info=like.get("server_info"), workload=like.get("workload"), timings=like.get("timings"),
                     versions=like.get("versions"), gpu=like.get("gpu"), files=[],
                     extra={"remote_files": entries, "analysis": {"where": "host", "status": "pending"}})
    return run


def _four_ranks(tmp_path: Path, label: str, n: int = 4) -> tuple[Path, Path]:
    remote = tmp_path / "host" / "perfscope-trace.abc"
    traces = {f"1790000000.1-TP-{r}.trace.json.gz": _rank_trace(r) for r in range(n)}
    return _on_host_folder(tmp_path / "run", remote, label, traces), remote


def _host(sshd):
    s = connect(sshd.target())
    return s, SSHHost(s)


def _same(stored: bytes, local: bytes) -> None:
    a, b = json.loads(stored), json.loads(local)
    assert a.pop("parallel")["bound"] == "host"
    b.pop("parallel")
    from perfscope.report.jsonout import dumps

    assert dumps(a) == dumps(b)


def test_four_ranks_on_host_equal_the_local_diagnosis(sshd, tmp_path):
    s, io = _host(sshd)
    label = s.target.label
    run, remote = _four_ranks(tmp_path, label)
    trace_bytes = sum(p.stat().st_size for p in remote.iterdir())
    with s:
        ha = onhost.analyse_run(io, run, python=PY, label=label)
    # only the results came back: the run folder holds run.json and the results, no trace
    assert sorted(p.name for p in run.iterdir()) == ["ranks.json.gz", "run.json"]
    assert ha.trace_bytes == trace_bytes and 0 < ha.results_bytes < trace_bytes / 4, (ha, trace_bytes)
    data = json.loads((run / "run.json").read_text())
    assert data["analysis"]["status"] == "done" and data["analysis"]["results_bytes"] == ha.results_bytes
    import hashlib

    for e in data["remote_files"]:  # each raw trace listed where it stays, with its sha256 and size
        raw = Path(e["remote_path"]).read_bytes()
        assert e["sha256"] == hashlib.sha256(raw).hexdigest() and e["bytes"] == len(raw) and e["host"] == label
    rc, stored, err = invoke("diagnose", str(run), "--json")
    assert rc == 0, err
    # a per-rank option needs the traces: one line, exit 2
    rc, _, err = invoke("diagnose", str(run), "--batch", "8")
    assert rc == 2 and "--batch" in err and "trace --fetch" in err and len(err.strip().splitlines()) == 1, err
    # the HTML report is drawn from the stored results, as diagnose is: no trace needed
    rc, _, err = invoke("report", str(run), "-o", str(tmp_path / "r.html"))
    assert rc == 0 and "report written" in err, err
    html = (tmp_path / "r.html").read_text()
    top = json.loads(stored)["ops"][0]["short"]  # the stored diagnosis' dominant op is the report's
    assert top in html or escape(top) in html, top
    # fetched later: the same folder is an ordinary run folder, analysed here
    rc, out, err = invoke("trace", "--fetch", str(run), *ssh_opts(sshd), "--json")
    assert rc == 0, err
    assert json.loads(out)["bytes"] == trace_bytes
    assert rundir.read_run(run, verify=True).files
    rc, local, err = invoke("diagnose", str(run), "--json")
    assert rc == 0, err
    _same(stored.encode(), local.encode())
    assert len(json.loads(local)["ranks"]) == 4


def test_run_folder_with_host_timing_and_bench(sshd, tmp_path):
    """A real H200 run folder (DECODE and EXTEND files, its GPU-only host-timing profile, its bench): the
    host timing is read on the host, the predictions are the local ones."""
    src = GPU_LOOP / "h200-2026-12-02-predict/dense-495000-c1/bug"
    like = json.loads((src / "run.json").read_text())
    s, io = _host(sshd)
    label = s.target.label
    run = _on_host_folder(tmp_path / "run", tmp_path / "host/perfscope-trace.main", label,
                          {p.name: p.read_bytes() for p in sorted((src / "traces").iterdir())}, like)
    shutil.copy(src / "bench.json", run / "bench.json")
    ht_like = json.loads((src / "host-timing/run.json").read_text())
    _on_host_folder(run / "host-timing", tmp_path / "host/perfscope-trace.ht", label,
                    {p.name: p.read_bytes() for p in sorted((src / "host-timing/traces").iterdir())}, ht_like)
    with s:
        onhost.analyse_run(io, run, python=PY, label=label)
    rc, stored, err = invoke("diagnose", str(run), "--json")
    assert rc == 0, err
    rc, _, err = invoke("trace", "--fetch", str(run), *ssh_opts(sshd))
    assert rc == 0, err
    assert rundir.read_run(run / "host-timing", verify=True).files
    rc, local, err = invoke("diagnose", str(run), "--json")
    assert rc == 0, err
    _same(stored.encode(), local.encode())
    d = json.loads(stored)
    assert [f for f in d["findings"] if f.get("id") == "fp8-kv-cast"]
    assert d["ranks"][0]["steps"].get("count")


def test_host_python_without_msgspec_is_one_line(sshd, tmp_path):
    py = "/usr/bin/python3"
    if subprocess.run([py, "-c", "import msgspec"], capture_output=True).returncode == 0:
        pytest.fail(f"{py} has msgspec here: this test needs a Python without it")
    s, io = _host(sshd)
    with s, pytest.raises(RemoteError) as ei:
        onhost.pick_python(io, [py, "/nonexistent/python"], s.target.label)
    msg = str(ei.value)
    assert "\n" not in msg and f"{py} (Python 3." in msg and "lacks msgspec" in msg and "not found" in msg
    assert "--python" in msg
    assert onhost.pick_python(_host(sshd)[1], ["/nonexistent/python", py, PY], "h") == PY


def test_rank_file_missing_on_host_is_one_line(sshd, tmp_path):
    s, io = _host(sshd)
    run, remote = _four_ranks(tmp_path, s.target.label)
    gone = remote / "1790000000.1-TP-2.trace.json.gz"
    gone.unlink()
    with s, pytest.raises(InputError) as ei:
        onhost.analyse_run(io, run, python=PY, label=s.target.label)
    msg = str(ei.value)
    assert "\n" not in msg and "missing on" in msg and "rank 2" in msg and str(gone) in msg
    assert not (run / onhost.RESULTS).exists()
    rc, _, err = invoke("diagnose", str(run))  # never diagnosed as if complete
    assert rc == 2 and "did not finish" in err and len(err.strip().splitlines()) == 1, err


def test_analysis_past_its_timeout_is_one_line(sshd, tmp_path):
    s, io = _host(sshd)
    run, _ = _four_ranks(tmp_path, s.target.label)
    t0 = time.monotonic()
    with s, pytest.raises(RemoteError) as ei:
        onhost.analyse_run(io, run, python=PY, label=s.target.label, timeout=0.5)
    assert "timed out" in str(ei.value) and "\n" not in str(ei.value)
    assert time.monotonic() - t0 < 60
    assert not (run / onhost.RESULTS).exists()
    assert json.loads((run / "run.json").read_text())["analysis"]["status"] == "pending"


def _job_pids(job_marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(job_marker.encode() in c for c in cmd) and any(c.endswith(b"/job.json") for c in cmd):
                out.append(int(d.name))
    return out


def _kill_the_next_analysis(within_s: float) -> tuple[threading.Thread, list[int]]:
    """A thread that SIGKILLs the first on-host analysis started after this call (as the OOM killer or a
    dying node does), watching for up to ``within_s``; the list receives its pid."""
    before = set(_job_pids(onhost.JOB_PREFIX))
    killed: list[int] = []

    def killer():
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and not killed:
            for pid in set(_job_pids(onhost.JOB_PREFIX)) - before:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.01)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    return t, killed


def test_killed_analysis_is_one_line(sshd, tmp_path):
    """The host's Python killed mid-run (SIGKILL, as the OOM killer or a dying node does): one line, no
    results stored, no hang."""
    s, io = _host(sshd)
    run, _ = _four_ranks(tmp_path, s.target.label, n=8)
    t, killed = _kill_the_next_analysis(60)
    with s, pytest.raises(RemoteError) as ei:
        onhost.analyse_run(io, run, python=PY, label=s.target.label)
    t.join(5)
    assert killed
    msg = str(ei.value)
    assert "\n" not in msg and "killed by a signal" in msg and "trace --fetch" in msg
    assert not (run / onhost.RESULTS).exists()


def test_dependencies_are_what_the_analysis_imports(tmp_path):
    """DEPENDENCIES (checked on the host before profiling) is every module beyond the standard library
    that the loader and the analysis import, run from the zip as on the host."""
    from perfscope.cluster.onhost_task import DEPENDENCIES

    z = tmp_path / "perfscope.zip"
    z.write_bytes(onhost.package_zip())
    trace = tmp_path / "1790000000.1-TP-0.trace.json.gz"
    trace.write_bytes(_rank_trace(0))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import perfscope; assert perfscope.__file__.startswith(sys.argv[1])\n"
            "from pathlib import Path\nfrom perfscope.analysis.split import rank_task\n"
            "from perfscope.load.discover import TraceFile\n"
            "assert 'ok' in rank_task(TraceFile(path=Path(sys.argv[2])), {})\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))")
    r = subprocess.run([PY, "-E", "-c", code, str(z), str(trace)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    third = set(r.stdout.split()) - {"perfscope", "__main__", "__mp_main__", "_distutils_hack", "typing_extensions"}
    assert third == set(DEPENDENCIES)
    assert len(onhost.package_zip()) < onhost.MAX_ZIP_BYTES


def test_cli_refuses_bad_combinations(tmp_path):
    rc, _, err = invoke("trace", "--url", "http://127.0.0.1:1", "--analyse-on-host", "--out", str(tmp_path / "r"))
    assert rc == 2 and "--analyse-on-host goes with --host" in err
    rc, _, err = invoke("trace", "--fetch", str(REPO / "nonexistent"))
    assert rc == 2 and len(err.strip().splitlines()) == 1


repro_server = test_trace.repro_server  # the real reproduction server on CPU (a module fixture of test_trace.py)


def test_trace_analyse_on_host_end_to_end(sshd, repro_server, tmp_path, monkeypatch):
    """``perfscope trace --analyse-on-host`` through sshd to the real reproduction server: the server's own
    interpreter (it runs as this user) analyses the traces; the run folder holds results only; diagnose of
    it is the diagnose of the traces fetched later."""
    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    out = tmp_path / "run"
    rc, stdout, err = invoke("trace", "--host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port), "--identity", str(sshd.user_key),
         "--known-hosts", str(sshd.known_hosts), "--port", str(repro_server), "--steps", "4", "--input-len", "16",
         "--output-len", "24", "--api-key-env", "REPRO_KEY", "--timeout", "120", "--analyse-on-host",
         "--out", str(out), "--json")
    assert rc == 0, err
    assert "--keep-remote implied" in err
    summary = json.loads(stdout)
    assert summary["files"] == [] and summary["remote_files"]
    assert not (out / "traces").exists() and (out / onhost.RESULTS).is_file()
    data = json.loads((out / "run.json").read_text())
    a = data["analysis"]
    assert a["status"] == "done" and a["interpreter"] == sys.executable  # the server's own interpreter
    trace_bytes = 0
    for e in data["remote_files"]:
        assert Path(e["remote_path"]).is_file() and e["sha256"]  # left on the host
        trace_bytes += e["bytes"]
    assert a["trace_bytes"] == trace_bytes and a["results_bytes"] < trace_bytes
    assert data["profile"]["remote_dir_kept"] is True
    rc, stored, err = invoke("diagnose", str(out), "--json")
    assert rc == 0, err
    rc, _, err = invoke("trace", "--fetch", str(out), *ssh_opts(sshd))
    assert rc == 0, err
    rc, local, err = invoke("diagnose", str(out), "--json")
    assert rc == 0, err
    _same(stored.encode(), local.encode())
    shutil.rmtree(data["profile"]["output_dir"], ignore_errors=True)  # the host's folder this test made


def test_two_hosts_folder_equals_the_local_diagnosis(sshd, tmp_path):
    """A run folder of two hosts (``trace --host a --host b --analyse-on-host``: one member folder each,
    analysed on its host; the top run.json lists them as trace() writes it): the stored diagnosis is the
    one of the traces fetched from both hosts."""
    labels = [f"{sshd.user}@127.0.0.1:{sshd.port}", f"{sshd.user}@localhost:{sshd.port}"]  # one sshd, two names
    run = tmp_path / "run"
    remote_all = []
    for k, (label, d) in enumerate(zip(labels, ("h1", "h2"))):
        traces = {f"1790000000.1-TP-{r}.trace.json.gz": _rank_trace(r) for r in (2 * k, 2 * k + 1)}
        member = _on_host_folder(run / d, tmp_path / f"host{k}/perfscope-trace.x", label, traces)
        s, io = _host(sshd)
        with s:
            onhost.analyse_run(io, member, python=PY, label=label)
        remote_all += [{**e, "path": f"{d}/{e['path']}"} for e in json.loads((member / "run.json").read_text())["remote_files"]]
    rundir.write_run(run, command=["perfscope", "trace"], kind="multi", host=labels[0], hosts=labels, files=[],
                     members=[{"host": h, "dir": d} for h, d in zip(labels, ("h1", "h2"))],
                     extra={"remote_files": remote_all, "analysis": {"where": "host", "status": "done"}})
    rc, stored, err = invoke("diagnose", str(run), "--json")
    assert rc == 0, err
    kh = tmp_path / "known_hosts"
    shutil.copy(sshd.known_hosts, kh)
    rc, _, err = invoke("trace", "--fetch", str(run), "--identity", str(sshd.user_key), "--known-hosts", str(kh),
                          "--accept-new-host-key")
    assert rc == 0, err
    rc, local, err = invoke("diagnose", str(run), "--json")
    assert rc == 0, err
    _same(stored.encode(), local.encode())
    d = json.loads(stored)
    assert [r["meta"]["host"] for r in d["ranks"]] == [labels[0]] * 2 + [labels[1]] * 2


def test_trace_whose_host_analysis_dies_keeps_the_list_of_traces(sshd, repro_server, tmp_path, monkeypatch):
    """``trace --analyse-on-host`` whose analysis on the host is killed (SIGKILL, as a dying node or the OOM
    killer does): one line, exit 3, the run folder marked incomplete, and it still lists every trace left on
    the host with its path and sha256 (nothing the user had is lost: the traces can be fetched by hand)."""
    import hashlib

    monkeypatch.setenv("REPRO_KEY", "s3cret-admin-key")
    out = tmp_path / "run"
    t, killed = _kill_the_next_analysis(180)
    rc, _, err = invoke("trace", "--host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port), "--identity", str(sshd.user_key),
         "--known-hosts", str(sshd.known_hosts), "--port", str(repro_server), "--steps", "4", "--input-len", "16",
         "--output-len", "24", "--api-key-env", "REPRO_KEY", "--timeout", "120", "--analyse-on-host",
         "--out", str(out))
    t.join(5)
    assert killed and rc == 3, err
    assert len(err.strip().splitlines()[-1]) > 0 and "Traceback" not in err
    data = json.loads((out / "run.json").read_text())
    assert data["status"] == "incomplete" and "the traces stay on" in data["incomplete_reason"]
    assert data["remote_files"]
    for e in data["remote_files"]:
        p = Path(e["remote_path"])
        assert p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() == e["sha256"]
    shutil.rmtree(Path(data["remote_files"][0]["remote_path"]).parent, ignore_errors=True)  # this test's host folder
