"""``perfscope trace``: profile a live SGLang (or vLLM) server and bring its traces home.

Per host: reach the HTTP API (through an SSH port forward, or ``--url``), read the server's config,
make a fresh folder on the host, arm the profiler, drive decode load until every rank's trace is
complete (size stable over two polls and gzip or JSON intact: :mod:`perfscope.capture.wait`; the
load: :mod:`perfscope.capture.load`), copy the traces back with a sha256 check, collect versions /
GPU / timings, and write the run folder (:mod:`perfscope.rundir`).
Whatever happens after the profiler was armed (error, timeout, Ctrl-C), ``/stop_profile`` is sent
before returning, so no profiler is left running on the server.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence
from urllib.parse import urlparse

from perfscope import rundir
from perfscope.bench.vocab import is_loopback_url, token_ids
from perfscope.capture.load import TraceLoad
from perfscope.capture.load import api as _api
from perfscope.capture.options import TraceOptions
from perfscope.capture.wait import expected_files, wait_complete, wait_vllm_steps
from perfscope.errors import InputError, PerfscopeError, RemoteError
from perfscope.remote.hostio import HostIO, LocalHost, SSHHost, trace_file_complete
from perfscope.remote.sglang_api import HTTPStatusError, gpu_trace_after_note, profile_activities, server_has_gpu
from perfscope.remote.ssh import ServerDown, SSHTarget, connect
from perfscope.util.files import user_path

log_fn = Callable[[str], None]


@dataclass
class Endpoint:
    """Where to trace: an SSH target (server on its loopback ``port``), or a URL on this machine."""

    target: SSHTarget | None = None
    url: str | None = None
    port: int | None = None  # the server's HTTP port on the host (None: TraceOptions.port)

    @property
    def label(self) -> str:
        if self.target is not None:
            return self.target.label
        return urlparse(self.url).netloc or "local"


def _version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4])


def _url_port(url: str) -> int | None:
    try:
        u = urlparse(url if "://" in url else "http://" + url)
        return u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None


def _is_not_running(err: BaseException) -> bool:
    """A /stop_profile refusal meaning no profile runs (nothing left to stop). SGLang 0.5.x answers
    a bare HTTP 500 'Internal Server Error' (its log: 'Profiling is not in progress'), e.g. after
    a num_steps profile stopped by itself; older servers and the emulator say so in the body."""
    if isinstance(err, HTTPStatusError) and err.status == 500 and \
            err.body.strip().lower() in ("internal server error", ""):
        return True
    return bool(re.search(r"not in progress|no profil|not running|not started", str(err), re.I))


# ----------------------------------------------------------------------------------- one host


@dataclass
class HostResult:
    label: str
    run_dir: Path
    files: list[dict]
    timings: dict
    server_info: dict
    remote_files: list = field(default_factory=list)  # --analyse-on-host: the traces left on the host


def trace_host(ep: Endpoint, opts: TraceOptions, out_dir: Path, *, command: list[str],
               log: log_fn = print, progress=None, cancel: threading.Event | None = None) -> HostResult:
    """Trace one server, write ``out_dir`` as a run folder, return what was written."""
    cancel = cancel or threading.Event()
    out_dir = user_path(out_dir)
    label = ep.label
    port = ep.port or opts.port
    if ep.url:
        port = _url_port(ep.url) or port
    say = lambda m: log(f"[{label}] {m}")  # noqa: E731
    again = {"reconnect": (lambda: _host_io(ep, port)) if ep.target is not None else None,
             "make_api": lambda u: _api(u, opts)}
    with _host_io(ep, port) as (io, url):
        api = _api(url, opts)
        info = _server_info(api, label)
        version = str(info.get("version") or "")
        say(f"server {opts.engine} {version or '(version unknown)'}, model {info.get('model_path', '?')}, "
            f"tp={info.get('tp_size', 1)}")
        # the server's process (its interpreter has its versions): on the host, or here for a loopback URL
        proc = io.server_process(port) if ep.target is not None or is_loopback_url(ep.url) else {}
        versions = io.python_versions([opts.python] if opts.python else io.python_candidates(proc), want=opts.engine)
        if proc.get("python_note") and not opts.python:
            say(f"note: {proc['python_note']}")
        onhost_py = None
        if opts.analyse_on_host:
            if ep.target is None:
                raise InputError("--analyse-on-host goes with --host: with --url the traces are on this machine")
            if opts.analyse_on_host == "analyse":  # before anything is profiled: a host that cannot, said now
                from perfscope.cluster.onhost import pick_python

                onhost_py = pick_python(io, [opts.python] if opts.python else io.python_candidates(dict(proc)), label)
        if version:
            versions["server"] = version
        gpu = io.nvidia_smi()
        ids, ids_from = token_ids(info, io if ep.target is not None or is_loopback_url(ep.url) else None)
        say(f"load: prompt token ids {ids[0]}..{ids[1] - 1} ({ids_from})")
        # without any profiler first: a GPU trace leaves CUPTI attached to the server (its host slower after)
        bench_res = _bench_measure(api, opts, info, say, ids) if opts.bench_requests and not cancel.is_set() else None
        if opts.host_timing and opts.engine == "sglang" and not opts.gpu_only and server_has_gpu(info, gpu) \
                and not cancel.is_set():
            _host_timing(ep, opts, out_dir, command, log, cancel, say)
        by_stage = opts.by_stage
        if by_stage is None:
            by_stage = opts.engine == "sglang" and _version_tuple(version) >= (0, 4, 7)
        if by_stage and opts.engine == "sglang":
            by_stage = _stage_profile_safe(api, opts, label, say)
        expected = expected_files(info, by_stage) if opts.engine == "sglang" else 1
        # the folder the server writes to
        baseline: set[str] = set()
        baseline_tables: dict = {}
        made_dir = False
        if opts.engine == "vllm":
            if not opts.profile_dir:
                raise InputError("--engine vllm needs --profile-dir: the server's torch profiler directory "
                                 "(its --profiler-config torch_profiler_dir, or VLLM_TORCH_PROFILER_DIR)")
            remote_dir = opts.profile_dir
            try:  # traces already there are not this run's; vLLM makes the folder at its first trace
                baseline = {f.name for f in io.list_traces(remote_dir)}
                baseline_tables = {f.name: (f.size, f.mtime) for f in io.list_traces(remote_dir, _is_table)}
            except RemoteError as e:
                if "does not exist" not in str(e):
                    raise
        else:
            remote_dir = io.mkdtemp(opts.remote_dir)
            made_dir = True
            if proc.get("uid") is not None and proc.get("uid") != _my_uid(io):
                io.chmod(remote_dir, 0o777)  # the server runs as another user and must write here
        profile = {"output_dir": remote_dir, "num_steps": opts.steps, "with_stack": opts.with_stack,
                   "record_shapes": opts.record_shapes, "activities": profile_activities(info, gpu)}
        if opts.gpu_only:
            if opts.engine != "sglang":
                raise InputError("--gpu-only is for SGLang (vLLM's profiler activities are set at its launch)")
            if not server_has_gpu(info, gpu):
                raise InputError(f"--gpu-only: {label} reports no GPU (device {info.get('device')!r}): nothing to record")
            profile.update(activities=["GPU"], with_stack=False, record_shapes=False)
        if opts.engine == "sglang" and not by_stage and (not version or _version_tuple(version) >= (0, 4, 10)):
            # start at the next forward step: SGLang then refuses (HTTP 500) while another profile
            # runs, where a plain /start_profile silently throws that one away and starts anew
            profile["start_step"] = 1
        if opts.profile_prefix:
            if opts.engine != "sglang":
                raise InputError("--profile-prefix is for SGLang (vLLM names its files itself)")
            if version and _version_tuple(version) < (0, 5, 10):
                raise RemoteError(f"--profile-prefix needs SGLang 0.5.10+; {label} runs {version}")
            profile["profile_prefix"] = opts.profile_prefix
        if opts.engine == "vllm":  # vLLM's profiler is configured at server start; perfscope stops it
            profile = {"output_dir": remote_dir, "num_steps": opts.steps, "stopped_by": "perfscope",
                       "with_stack": None, "record_shapes": None, "activities": None}
        if by_stage:
            profile["profile_by_stage"] = True
        armed = complete = False
        load: TraceLoad | None = None
        got: list = []
        t_start = time.time()
        try:
            if cancel.is_set():
                raise KeyboardInterrupt  # another host failed before this one armed: do not arm
            # from the moment /start_profile is sent the profiler may be arming: an interrupt or a
            # timeout while it has not answered still sends /stop_profile. The wait is bounded by --timeout.
            armed = True
            wait_s = min(max(opts.http_timeout, 120.0), opts.timeout)
            try:
                if opts.engine == "vllm":
                    api.start_profile(request_timeout=wait_s)
                else:
                    api.start_profile(**profile, request_timeout=wait_s,
                                      server_has_gpu=server_has_gpu(info, gpu))
            except PerfscopeError as e:
                if re.search(r"already in progress|already running|already started", str(e), re.I):
                    armed = False  # someone else's profile: not ours to stop
                    raise RemoteError(f"a profile is already running on {label} (someone else's?): "
                                      "not touching it; try again when it ends") from None
                if isinstance(e, HTTPStatusError) and e.status == 500 and opts.engine == "sglang":
                    # SGLang 0.5.x turns a refused start into a bare 500 (its log has the reason):
                    # nothing of ours was armed, and a /stop_profile would stop someone else's
                    armed = False
                    reply = " ".join((e.body or "").split())[:300]  # redacted with the message (errors.redact)
                    said = f" saying {reply!r}" if reply and reply.lower() != "internal server error" else ""
                    raise HTTPStatusError(f"{label} refused /start_profile (HTTP 500){said}: SGLang answers so while a "
                                          "profile is already running (someone else's?) or when its profiler "
                                          "cannot start; nothing was armed, and perfscope left it alone", status=500,
                                          body=e.body, hint="see the server's log for the reason; try again when that "
                                          "profile ends") from None
                raise
            say(f"profiler armed: {opts.steps} steps{' per stage' if by_stage else ''} -> {remote_dir}")
            load = TraceLoad(url, opts, ids=ids).start()
            if opts.engine == "vllm":
                n = wait_vllm_steps(load, opts, cancel, label)
                say(f"{n} tokens streamed while profiling: stopping the profiler (vLLM writes its traces now)")
                load.stop_sent = True
                api.stop_profile()
            got = wait_complete(io, remote_dir, expected, baseline, opts, load, cancel, label, say)
            complete = True  # the load stops now: requests still streaming are cut, their tokens timed
        except BaseException as e:
            _abandon(io, api, say, out_dir, remote_dir if made_dir and not opts.keep_remote else None, armed, e,
                     load=load, command=command, engine=opts.engine, host=label if ep.target else None,
                     stop_timeout=opts.timeout, **again)
            raise
        finally:
            if load is not None:
                load.stop(wait=5 if not complete else 60)
        workload, timings = load.summary() if load else ({}, {})
        timings.setdefault("under_profiler", True)
        if timings.get("requests_stalled"):
            say(f"note: {timings['requests_stalled']} request(s) of the load got no stream line within "
                f"{opts.http_timeout:g}s after the profile's steps (the engine was writing its profile); "
                "not counted as failures")
        # copy back (or, analysed on the host, list them where they stay)
        files: list = []
        remote = [_remote_entry(f, label) for f in got] if opts.analyse_on_host else []
        try:
            if not opts.analyse_on_host:
                _copy_back(io, got, out_dir, label, ep, progress, files)
        except BaseException as e:
            _abandon(io, api, say, out_dir, remote_dir if made_dir and not opts.keep_remote else None, False, e,
                     got=got, command=command, engine=opts.engine, host=label if ep.target else None,
                     stop_timeout=opts.timeout, **again)
            raise
        for fe in files + remote:
            if fe.get("role") == "frontend":
                say(f"{Path(fe['path']).name}: {rundir.FRONTEND_NOTE}; kept, not analysed")
        tables = _fetch_tables(io, remote_dir, baseline_tables, out_dir, [f.name for f in got],
                               wait_s=min(30.0, opts.timeout), say=say) if opts.engine == "vllm" else []
        if files and not opts.keep_remote and not opts.analyse_on_host:
            if made_dir:  # perfscope's own folder: removed with whatever else is in it (links, FIFOs)
                io.discard_dir(remote_dir)
            else:
                io.remove([f.path for f in got], None)
        workload = {"concurrency": opts.concurrency, "input_len": opts.input_len, "output_len": opts.output_len,
                    "ignore_eos": True, "seed": opts.seed, **workload}
        after_note = gpu_trace_after_note(profile.get("activities"), server_has_gpu(info, gpu))
        rundir.write_run(
            out_dir, command=command, kind="trace", engine=opts.engine,
            host=label if ep.target else None, url=ep.url or f"ssh://{label} -> 127.0.0.1:{port}",
            versions=versions, server_info=info, gpu=gpu, workload=workload, timings=timings,
            profile={**profile, "remote_dir_kept": opts.keep_remote or bool(opts.analyse_on_host), "started": t_start,
                     "duration_s": round(time.time() - t_start, 3), "after_trace": after_note},
            files=files, extra={**({"profiler_tables": tables} if tables else {}),
                                **({"remote_files": remote, "analysis": {"where": "host", "status": "pending"}}
                                   if opts.analyse_on_host else {})} or None,
        )
        if not opts.analyse_on_host:
            say(f"{len(files)} trace file(s) -> {out_dir / rundir.TRACES_DIR}")
        if after_note:
            say(f"note: {after_note}")
        if bench_res is not None:
            timings = dict(timings, bench=_bench_store(bench_res, opts, out_dir, url, label if ep.target else None,
                                                       info))
        if onhost_py:  # the run folder complete (bench included): the config diagnose would build
            from perfscope.cluster.onhost import analyse_run

            try:
                ha = analyse_run(io, out_dir, python=onhost_py, label=label, timeout=opts.analysis_timeout, say=say)
            except BaseException as e:
                listed = remote
                with contextlib.suppress(BaseException):
                    listed = rundir.read_run(out_dir).data.get("remote_files") or remote
                for entry in listed:  # the analysis records each trace's sha256: where it died, ask the host
                    if not entry.get("sha256"):
                        with contextlib.suppress(Exception):
                            entry["sha256"] = io.sha256(entry["remote_path"])
                with contextlib.suppress(BaseException):
                    rundir.mark_incomplete(out_dir, reason=f"{_reason(e)} (the traces stay on {label}: {remote_dir})",
                                           command=command, engine=opts.engine, host=label, remote_files=listed)
                raise
            say(f"analysed on the host in {ha.seconds:.1f} s: {ha.results_bytes} bytes of results copied back, "
                f"{ha.trace_bytes} bytes of traces left in {remote_dir}")
            remote = rundir.read_run(out_dir).data.get("remote_files") or remote
        return HostResult(label, out_dir, files, timings, info, remote)


# how long a by-stage profile waits for requests to leave the server (perfscope's own, cut when the
# host-timing profile's load stopped, leave within a step or two)
IDLE_WAIT_S = 5.0


def _stage_profile_safe(api, opts: TraceOptions, label: str, say) -> bool:
    """Whether a by-stage profile can start now. SGLang starts the DECODE file at the first decode batch
    after /start_profile and the EXTEND file at the first prefill; when a decode batch comes first (the
    server already serving requests) and a prefill arrives during the decode capture, that prefill
    starts a second torch profiler over the running one (SGLang 0.5.13 and 0.5.23 alike): the DECODE
    file holds whatever that one recorded, no EXTEND file is ever written, and the
    first is left to itself (SGLang 0.5.13 on an H200, the server still decoding the requests of the
    profile before: the DECODE file came, the EXTEND file never did, and the trace timed out). So a
    by-stage profile starts only on an idle server; otherwise ``--steps`` forward steps go into one
    file per rank (decode and the prefills between them; ``diagnose`` tells them apart). An explicit
    ``--by-stage`` on a busy server is refused. A server that does not report its load (no
    ``/v1/loads``) is profiled by stage as asked."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        try:
            n = api.requests_in_server()
        except PerfscopeError:
            n = None
        if n is None or n == 0:
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if opts.by_stage:
        raise InputError(f"--by-stage: {label} is serving {n} request(s); SGLang's by-stage profile then "
                         "starts its DECODE file first and never writes the EXTEND one (a second profiler "
                         "is started over the first)",
                         hint="trace with --no-by-stage (the default picks it on a busy server), or when the "
                              "server is idle")
    say(f"{n} request(s) in the server: profiling {opts.steps} forward steps in one file per rank "
        "(a by-stage profile is safe on an idle SGLang only)")
    return False


# steps of the GPU-only host-timing profile: its host time per step is the quickest tenth of them, and
# on the H200 the profiled host's busy time varied 3.1-4.5 ms between the steps of one 8-step profile;
# kernels and runtime calls only, so 32 steps stay small (a CUDA-graph step is a few dozen events)
HOST_TIMING_STEPS = 32


def _host_timing(ep: Endpoint, opts: TraceOptions, out_dir: Path, command: list[str], log, cancel, say) -> None:
    """A short GPU-only profile (kernels and CUDA runtime calls, no CPU ops) before the full one, as a
    run folder of its own in ``out_dir/host-timing``: its host timeline carries CUPTI's cost but not the
    CPU profiler's, and diagnose reads the host's time per step from it (perfscope.analysis.hosttime).
    An extra: when it fails, the trace goes on and the predictions use the full trace's host time."""
    from dataclasses import replace

    sub = replace(opts, gpu_only=True, steps=HOST_TIMING_STEPS, bench_requests=0, host_timing=False,
                  by_stage=False, analyse_on_host="keep" if opts.analyse_on_host else "")  # decode steps are what it times: one file of forward steps
    say("host timing: a short GPU-only profile first (no CPU ops recorded: the host as unprofiled as it gets)")
    try:
        trace_host(ep, sub, out_dir / rundir.HOST_TIMING_DIR, command=command + ["(host timing: --gpu-only)"],
                   log=lambda m: log(f"  {m}"), cancel=cancel)
    except PerfscopeError as e:
        say(f"note: the host-timing profile failed ({e}); predictions scale the full trace's host time instead")


def _bench_measure(api, opts: TraceOptions, info: dict, say, ids: tuple[int, int] | None = None):
    """TPOT without the profiler, before any profile of this run: ``perfscope bench`` with the trace's
    workload."""
    from perfscope.bench import measure

    say(f"measuring without the profiler first: 1 warm-up + {opts.bench_requests} request(s) "
        f"(in={opts.input_len} out={opts.output_len} concurrency={opts.concurrency})")
    res = measure(api, input_len=opts.input_len, output_len=opts.output_len, concurrency=opts.concurrency,
                  num_requests=opts.bench_requests, warmup=1, seed=opts.seed, timeout=opts.http_timeout,
                  server_info=info, ids=ids)
    say(f"TPOT without the profiler: {res.tpot_ms:.2f} ms (TTFT {res.ttft_ms:.1f} ms)")
    return res


def _bench_store(res, opts: TraceOptions, out_dir: Path, url: str, host: str | None, info: dict) -> dict:
    """The bench taken before the trace, stored in the run folder (``bench.json``, ``timings.bench``
    in run.json), which diagnose and compare prefer."""
    from perfscope.bench.store import run_summary, store

    argv = ["perfscope", "bench", "--url" if host is None else "--host", url if host is None else host,
            "--engine", opts.engine, "--input-len", str(opts.input_len), "--output-len", str(opts.output_len),
            "--concurrency", str(opts.concurrency), "--num-requests", str(opts.bench_requests), "--warmup", "1",
            "--seed", str(opts.seed)]
    store(out_dir, res, url, host, info, argv)
    return run_summary(res)


TABLES_DIR = "profiler_tables"


def _is_table(name: str) -> bool:
    """vLLM's torch profiler writes each process's op table (key_averages) as *profiler_out.txt."""
    return name.endswith("profiler_out.txt") and not name.startswith(".")


def _fetch_tables(io: HostIO, folder: str, baseline: dict, out_dir: Path, traces: Sequence[str] = (),
                  wait_s: float = 0.0, say=None) -> list[str]:
    """Copy the op tables vLLM wrote with this profile (new or rewritten since it was armed) to
    ``out_dir/profiler_tables/``; returns their paths relative to ``out_dir``. vLLM rewrites them
    in place at every stop, so a table whose size and time are unchanged is not this run's. A worker
    may write its table after its trace: wait up to ``wait_s`` for ``rank<N>.profiler_out.txt`` of
    each ``rank<N>.*`` trace (bounded; what is there then is taken)."""
    want = {f"rank{m.group(1)}.profiler_out.txt" for m in (re.match(r"rank(\d+)\.", n) for n in traces) if m}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            found = [f for f in io.list_traces(folder, _is_table) if baseline.get(f.name) != (f.size, f.mtime)]
        except RemoteError:
            return []
        if all(any(f.name.endswith(w) for f in found) for w in want) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    lost = sorted(w for w in want if not any(f.name.endswith(w) for f in found))
    if lost and say is not None:  # vLLM: a worker whose key_averages() failed ("Failed to stop profiler") writes none
        say(f"note: vLLM wrote no {', '.join(lost)} within {wait_s:g}s (its log says why, e.g. 'Failed to stop "
            "profiler'); the traces are complete")
    got = []
    for f in found:
        local = out_dir / TABLES_DIR / f.name
        io.fetch(f.path, local, "", None)
        got.append(f"{TABLES_DIR}/{f.name}")
    return got


def _copy_back(io: HostIO, got: list, out_dir: Path, label: str, ep: Endpoint, progress, files: list) -> None:
    """Fetch each trace (sha256-checked, atomic) into ``out_dir/traces``, appending run.json entries."""
    for f in got:
        local = out_dir / rundir.TRACES_DIR / f.name
        digest_remote = io.sha256(f.path)
        task = progress.add_task(f"{label} {f.name}", total=f.size) if progress else None
        cb = (lambda done, total, t=task: progress.update(t, completed=done)) if progress else None
        digest = io.fetch(f.path, local, digest_remote, cb)
        if not trace_file_complete(local):
            local.unlink()
            raise RemoteError(f"{f.name} from {label} is truncated (its gzip stream or JSON does not end): "
                              "the server may have crashed while writing it")
        files.append(rundir.file_entry(out_dir, local, host=label if ep.target else None, sha256=digest))


def _remote_entry(f, label: str) -> dict:
    """The run.json entry of a trace left on the host: where ``trace --fetch`` puts it (``path``), where
    it is (``remote_path``), its size; its sha256 comes with the analysis on the host."""
    meta = rundir.parse_trace_name(f.name)
    return {"path": f"{rundir.TRACES_DIR}/{f.name}", "remote_path": f.path, "sha256": None, "bytes": f.size,
            "rank": meta["rank"], "stage": meta["stage"], "host": label, "parallel": meta["parallel"],
            **({"role": meta["role"]} if meta["role"] else {})}


def _abandon(io: HostIO, api, say, out_dir: Path, remote_dir: str | None, armed: bool, err: BaseException, *,
             load=None, got=(), command=(), engine="sglang", host=None, stop_timeout: float = 600.0,
             reconnect=None, make_api=None) -> None:
    """A trace that will not finish (error, timeout, SIGINT/TERM/HUP): stop the profiler if it is
    (or may be) armed, stop the load, remove the folder perfscope made on the host, and leave the
    run folder with a run.json that says it is incomplete. Never raises. ``reconnect`` (SSH): a
    context manager giving a fresh (io, url), used when the first connection died."""
    wait = max(5.0, min(600.0, stop_timeout))
    try:
        if load is not None:
            load.stop(wait=5)
        dead = reconnect is not None and not io.alive()
        if armed and not dead:
            failed = _stop_quietly(api, say, timeout=wait, warn=False)
            dead = bool(failed) and reconnect is not None and not io.alive()
            if failed and not dead:
                say(f"warning: /stop_profile failed: {failed}")
        if dead:  # the SSH connection died: a fresh one stops the profiler and removes the folder
            say("the SSH connection is gone: stopping the profiler over a fresh one")
            with reconnect() as (io, url):
                if armed:
                    _stop_quietly(make_api(url), say, timeout=wait)
                if remote_dir:
                    io.discard_dir(remote_dir)
        elif remote_dir:
            io.discard_dir(remote_dir)
    except BaseException as e:  # noqa: BLE001 - cleanup must not replace the error being reported
        say(f"warning: cleanup after the failure was cut short: {type(e).__name__}")
    with contextlib.suppress(BaseException):
        rundir.mark_incomplete(out_dir, reason=_reason(err), command=command, engine=engine, host=host)


def _reason(err: BaseException) -> str:
    from perfscope.errors import Interrupted

    if isinstance(err, Interrupted):
        import signal as _signal

        return f"interrupted by {_signal.Signals(err.signum).name}"
    if isinstance(err, KeyboardInterrupt):
        return "interrupted"
    return str(err) or type(err).__name__


def _my_uid(io: HostIO) -> int | None:
    r = io.run(["id", "-u"])
    return int(r.stdout.strip()) if r.ok and r.stdout.strip().isdigit() else None


@contextlib.contextmanager
def _host_io(ep: Endpoint, port: int) -> Iterator[tuple[HostIO, str]]:
    if ep.target is None:
        yield LocalHost(), ep.url.rstrip("/")
        return
    session = connect(ep.target)
    try:
        with session.forward(port) as fwd:
            yield SSHHost(session), fwd.url
    finally:
        session.close()


def _server_info(api, label: str) -> dict:
    try:
        info = api.server_info()
    except ServerDown:
        raise
    except PerfscopeError as e:
        raise RemoteError(f"cannot read the server configuration on {label}: {e}") from None
    if not isinstance(info, dict):
        raise RemoteError(f"the server on {label} answered /server_info with something that is not a JSON object")
    return info


def _stop_quietly(api, say, timeout: float | None = None, warn: bool = True) -> str:
    """/stop_profile, waiting at most ``timeout`` s for the reply (the server stops profiling when
    the request arrives; writing the traces may go on after that). Returns "" when the server
    answered (stopped, or nothing was running), else the error (said unless ``warn`` is False)."""
    try:
        api.stop_profile(request_timeout=timeout)
        say("profiler stopped")
        return ""
    except Exception as e:  # 'no profile running' is fine; anything else is reported, not raised
        if _is_not_running(e):
            return ""
        if warn:
            say(f"warning: /stop_profile failed: {e}")
        return str(e) or type(e).__name__


# ------------------------------------------------------------------------------- several hosts


def host_dirname(label: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", label.split("@")[-1]).strip("._") or "host"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    taken.add(name)
    return name


def trace(endpoints: list[Endpoint], opts: TraceOptions, out_dir: Path, *, command: list[str],
          log: log_fn = print, progress=None) -> list[HostResult]:
    """Trace one or several servers. One host: ``out_dir`` is its run folder. Several: in
    parallel threads, ``out_dir/<host>/`` each, plus ``out_dir/run.json`` listing them. Ctrl-C
    stops every host's profiler before it returns."""
    out_dir = user_path(out_dir)  # relative paths are joined onto below: resolve once
    if len(endpoints) == 1:
        return [trace_host(endpoints[0], opts, out_dir, command=command, log=log, progress=progress)]
    cancel = threading.Event()
    taken: set[str] = set()
    dirs = [host_dirname(ep.label, taken) for ep in endpoints]
    results: list[HostResult | None] = [None] * len(endpoints)
    errors: list[tuple[str, BaseException]] = []
    with ThreadPoolExecutor(max_workers=len(endpoints), thread_name_prefix="perfscope-host") as pool:
        futs = [pool.submit(trace_host, ep, opts, out_dir / d, command=command, log=log, progress=progress,
                            cancel=cancel) for ep, d in zip(endpoints, dirs)]
        try:
            while not all(f.done() for f in futs):
                time.sleep(0.1)
                if any(f.done() and f.exception() is not None for f in futs):
                    cancel.set()  # one host failed: stop the others' profiles too
        except KeyboardInterrupt:
            cancel.set()
            for f in futs:
                with contextlib.suppress(BaseException):
                    f.result(timeout=60)
            raise
    for i, (ep, f) in enumerate(zip(endpoints, futs)):
        e = f.exception()
        if e is None:
            results[i] = f.result()
        elif not isinstance(e, KeyboardInterrupt):
            errors.append((ep.label, e))
    if errors or any(isinstance(f.exception(), KeyboardInterrupt) for f in futs):
        with contextlib.suppress(BaseException):
            rundir.mark_incomplete(out_dir, reason=str(errors[0][1]) if errors else "interrupted",
                                   command=command, engine=opts.engine, host=None)
    if errors:
        label, e = errors[0]
        if isinstance(e, PerfscopeError):
            err = Exception.__new__(type(e))  # the same class (exit code) and fields, the host named first
            err.__dict__.update(e.__dict__)
            err.message = f"{label}: {e.message}" if label not in e.message else e.message
            err.args = (err.message,)
            raise err from None
        raise e
    done = [r for r in results if r is not None]
    all_files, all_remote = [], []
    for d, r in zip(dirs, done):
        for fe in r.files:
            all_files.append({**fe, "path": f"{d}/{fe['path']}"})
        for fe in r.remote_files:
            all_remote.append({**fe, "path": f"{d}/{fe['path']}"})
    rundir.write_run(
        out_dir, command=command, kind="multi", engine=opts.engine, host=done[0].label,
        hosts=[r.label for r in done], files=all_files,
        members=[{"host": r.label, "dir": d} for d, r in zip(dirs, done)],
        extra={"remote_files": all_remote, "analysis": {"where": "host", "status": "done"}} if all_remote else None,
    )
    return done
