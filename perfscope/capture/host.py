"""``perfscope trace`` on one host (:func:`trace_host`): reach the server (:mod:`.endpoint`), read its
configuration, optionally bench it without a profiler (:mod:`.prebench`) and take a short GPU-only
profile for its host timing, make the profiler's folder, arm the profiler, drive decode load until
every rank's trace is complete (:mod:`.load`, :mod:`.wait`), copy the traces back
(:mod:`.copyback`) and write the run folder (:mod:`perfscope.rundir`). What differs between serving
engines is asked of the engine's adapter (:mod:`.engines`). Whatever happens after the profiler was
armed (error, timeout, Ctrl-C), ``/stop_profile`` is sent before returning (:mod:`.cleanup`)."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from perfscope import rundir
from perfscope.bench.vocab import is_loopback_url, token_ids
from perfscope.capture import copyback, engines, prebench
from perfscope.capture.cleanup import abandon, died, reason, server_gone
from perfscope.capture.endpoint import Endpoint, host_io, server_info, url_port
from perfscope.capture.engines import Engine, RemoteDir, Server
from perfscope.capture.load import TraceLoad
from perfscope.capture.options import TraceOptions
from perfscope.capture.wait import wait_complete
from perfscope.errors import InputError, PerfscopeError, RemoteError
from perfscope.remote.hostio import HostIO, RemoteFile
from perfscope.remote.sglang_api import SGLangClient, gpu_trace_after_note, server_has_gpu
from perfscope.util.files import user_path

Log = Callable[[str], None]


@dataclass
class HostResult:
    label: str
    run_dir: Path
    files: list[dict]
    timings: dict
    server_info: dict
    remote_files: list = field(default_factory=list)  # --analyse-on-host: the traces left on the host


@dataclass
class _Run:
    """One host's trace in progress: what every step after the connection needs."""

    ep: Endpoint
    opts: TraceOptions
    engine: Engine
    out_dir: Path
    command: list[str]
    port: int
    io: HostIO
    url: str
    api: SGLangClient
    say: Log
    cancel: threading.Event

    @property
    def host(self) -> str | None:
        """The SSH host's label; None for a server at a URL on this machine."""
        return self.ep.label if self.ep.target is not None else None

    def abandon(self, folder: RemoteDir | None, armed: bool, err: BaseException, load: TraceLoad | None = None) -> None:
        """Stop what this run left on the server and mark the run folder incomplete (never raises)."""
        keep = folder is None or not folder.made or self.opts.keep_remote
        reconnect = (lambda: host_io(self.ep, self.port)) if self.ep.target is not None else None
        abandon(
            self.io,
            self.api,
            self.say,
            self.out_dir,
            None if keep else folder.path if folder else None,
            armed,
            err,
            load=load,
            command=self.command,
            engine=self.opts.engine,
            host=self.host,
            stop_timeout=self.opts.timeout,
            reconnect=reconnect,
            make_api=self.client,
        )

    def client(self, url: str) -> SGLangClient:
        return self.engine.client(url, api_key=self.opts.api_key, timeout=self.opts.http_timeout)


def trace_host(
    ep: Endpoint,
    opts: TraceOptions,
    out_dir: Path,
    *,
    command: list[str],
    log: Log = print,
    progress: Any = None,
    cancel: threading.Event | None = None,
) -> HostResult:
    """Trace one server, write ``out_dir`` as a run folder, return what was written."""
    cancel = cancel or threading.Event()
    engine = engines.get(opts.engine)
    engine.check_options(opts)
    if opts.analyse_on_host and ep.target is None:
        raise InputError("--analyse-on-host goes with --host: with --url the traces are on this machine")
    out_dir = user_path(out_dir)
    label = ep.label
    port = ep.port or opts.port
    if ep.url:
        port = url_port(ep.url) or port
    say: Log = lambda m: log(f"[{label}] {m}")  # noqa: E731
    with host_io(ep, port) as (io, url):
        api = engine.client(url, api_key=opts.api_key, timeout=opts.http_timeout)
        run = _Run(ep, opts, engine, out_dir, command, port, io, url, api, say, cancel)
        server, versions, onhost_py = _server(run)
        has_host = ep.target is not None or is_loopback_url(ep.url)
        ids, ids_from = token_ids(server.info, io if has_host else None)
        say(f"load: prompt token ids {ids[0]}..{ids[1] - 1} ({ids_from})")
        # without any profiler first: a GPU trace leaves CUPTI attached to the server (its host slower after)
        bench_res = (
            prebench.measure(api, opts, server.info, say, ids) if opts.bench_requests and not cancel.is_set() else None
        )
        if opts.host_timing and engine.host_timing and not opts.gpu_only and server.has_gpu and not cancel.is_set():
            _host_timing(ep, opts, out_dir, command, log, cancel, say)
        by_stage = engine.by_stage(api, opts, server, say)
        expected = engine.expected_files(server, by_stage)
        plan = engine.profile(opts, server, by_stage)
        folder = engine.output_dir(io, opts, server)
        profile = {"output_dir": folder.path, **plan}
        if by_stage:
            profile["profile_by_stage"] = True
        t_start = time.time()
        got, workload, timings = _profile(run, server, folder, profile, expected, by_stage, ids)
        files: list[dict] = []
        remote = [copyback.remote_entry(f, label) for f in got] if opts.analyse_on_host else []
        try:
            if not opts.analyse_on_host:
                copyback.copy_back(io, got, out_dir, label, run.host, progress, files)
        except BaseException as e:
            run.abandon(folder, False, e)
            raise
        for fe in files + remote:
            if fe.get("role") == "frontend":
                say(f"{Path(fe['path']).name}: {rundir.FRONTEND_NOTE}; kept, not analysed")
        extra = engine.extras(io, folder, out_dir, got, opts, say)
        if files and not opts.keep_remote and not opts.analyse_on_host:
            if folder.made:  # perfscope's own folder: removed with whatever else is in it (links, FIFOs)
                io.discard_dir(folder.path)
            else:
                io.remove([f.path for f in got], None)
        workload = {
            "concurrency": opts.concurrency,
            "input_len": opts.input_len,
            "output_len": opts.output_len,
            "ignore_eos": True,
            "seed": opts.seed,
            **workload,
        }
        after_note = gpu_trace_after_note(profile.get("activities"), server.has_gpu)
        rundir.write_run(
            out_dir,
            command=command,
            kind="trace",
            engine=opts.engine,
            host=run.host,
            url=ep.url or f"ssh://{label} -> 127.0.0.1:{port}",
            versions=versions,
            server_info=server.info,
            gpu=server.gpu,
            workload=workload,
            timings=timings,
            profile={
                **profile,
                "remote_dir_kept": opts.keep_remote or bool(opts.analyse_on_host),
                "started": t_start,
                "duration_s": round(time.time() - t_start, 3),
                "after_trace": after_note,
            },
            files=files,
            extra={
                **extra,
                **(
                    {"remote_files": remote, "analysis": {"where": "host", "status": "pending"}}
                    if opts.analyse_on_host
                    else {}
                ),
            }
            or None,
        )
        if not opts.analyse_on_host:
            say(f"{len(files)} trace file(s) -> {out_dir / rundir.TRACES_DIR}")
        if after_note:
            say(f"note: {after_note}")
        if bench_res is not None:
            timings = dict(timings, bench=prebench.store(bench_res, opts, out_dir, url, run.host, server.info))
        if onhost_py:  # the run folder complete (bench included): the config diagnose would build
            remote = _analyse_on_host(run, onhost_py, folder.path, remote)
        return HostResult(label, out_dir, files, timings, server.info, remote)


def _server(run: _Run) -> tuple[Server, dict, str | None]:
    """The server's configuration, versions and GPUs; the host's Python for --analyse-on-host (asked
    now, before anything is profiled: a host that cannot analyse is said at once)."""
    opts, io, label = run.opts, run.io, run.ep.label
    info = server_info(run.api, label)
    version = str(info.get("version") or "")
    run.say(
        f"server {opts.engine} {version or '(version unknown)'}, model {info.get('model_path', '?')}, "
        f"tp={info.get('tp_size', 1)}"
    )
    # the server's process (its interpreter has its versions): on the host, or here for a loopback URL
    proc = io.server_process(run.port) if run.ep.target is not None or is_loopback_url(run.ep.url) else {}
    versions = io.python_versions([opts.python] if opts.python else io.python_candidates(proc), want=opts.engine)
    if proc.get("python_note") and not opts.python:
        run.say(f"note: {proc['python_note']}")
    onhost_py = None
    if opts.analyse_on_host == "analyse":
        from perfscope.cluster.onhost import pick_python

        onhost_py = pick_python(io, [opts.python] if opts.python else io.python_candidates(dict(proc)), label)
    if version:
        versions["server"] = version
    gpu = io.nvidia_smi()
    return Server(label, info, version, gpu, server_has_gpu(info, gpu), proc), versions, onhost_py


def _profile(
    run: _Run, server: Server, folder: RemoteDir, profile: dict, expected: int, by_stage: bool, ids: tuple[int, int]
) -> tuple[list[RemoteFile], dict, dict]:
    """Arm the profiler, drive the load until the traces are complete; (the traces on the host, the
    load's workload and timings for run.json). On any failure the profiler is stopped."""
    opts, label, say = run.opts, run.ep.label, run.say
    armed = complete = False
    load: TraceLoad | None = None
    try:
        if run.cancel.is_set():
            raise KeyboardInterrupt  # another host failed before this one armed: do not arm
        # from the moment /start_profile is sent the profiler may be arming: an interrupt or a
        # timeout while it has not answered still sends /stop_profile. The wait is bounded by --timeout.
        armed = True
        wait_s = min(max(opts.http_timeout, 120.0), opts.timeout)
        try:
            run.engine.start(run.api, profile, wait_s=wait_s, server=server)
        except PerfscopeError as e:
            if re.search(r"already in progress|already running|already started", str(e), re.I):
                armed = False  # someone else's profile: not ours to stop
                raise RemoteError(
                    f"a profile is already running on {label} (someone else's?): "
                    "not touching it; try again when it ends"
                ) from None
            refused = run.engine.refused(e, label)
            if refused is not None:
                armed = False
                raise refused from None
            raise
        say(f"profiler armed: {opts.steps} steps{' per stage' if by_stage else ''} -> {folder.path}")
        load = TraceLoad(run.client(run.url), opts, ids=ids).start()
        run.engine.after_load(load, run.api, opts, run.cancel, label, say)
        got = wait_complete(run.io, folder.path, expected, folder.baseline, opts, load, run.cancel, label, say)
        complete = True  # the load stops now: requests still streaming are cut, their tokens timed
    except BaseException as e:
        # the server died or stopped answering under the profiler: that, not the load's failure, is the news
        why = server_gone(run.io, run.api, server.proc.get("pid")) if armed and isinstance(e, Exception) else None
        gone = died(label, why, opts.engine) if why else None
        run.abandon(folder, armed and not (why or "").endswith("is gone"), gone or e, load=load)
        if gone is not None:
            raise gone from None
        raise
    finally:
        if load is not None:
            load.stop(wait=5 if not complete else 60)
    assert load is not None  # set before the wait that returned
    workload, timings = load.summary()
    timings.setdefault("under_profiler", True)
    if timings.get("requests_stalled"):
        say(
            f"note: {timings['requests_stalled']} request(s) of the load got no stream line within "
            f"{opts.http_timeout:g}s after the profile's steps (the engine was writing its profile); "
            "not counted as failures"
        )
    return got, workload, timings


def _analyse_on_host(run: _Run, python: str, remote_dir: str, remote: list[dict]) -> list[dict]:
    """--analyse-on-host: the host's Python analyses the traces where they are; returns run.json's
    ``remote_files`` as the analysis left them. Where it dies, the run folder is marked incomplete
    with the traces' host paths and sha256."""
    from perfscope.cluster.onhost import analyse_run

    label, out_dir = run.ep.label, run.out_dir
    try:
        ha = analyse_run(run.io, out_dir, python=python, label=label, timeout=run.opts.analysis_timeout, say=run.say)
    except BaseException as e:
        listed = remote
        with contextlib.suppress(BaseException):
            listed = rundir.read_run(out_dir).data.get("remote_files") or remote
        for entry in listed:  # the analysis records each trace's sha256: where it died, ask the host
            if not entry.get("sha256"):
                with contextlib.suppress(Exception):
                    entry["sha256"] = run.io.sha256(entry["remote_path"])
        with contextlib.suppress(BaseException):
            rundir.mark_incomplete(
                out_dir,
                reason=f"{reason(e)} (the traces stay on {label}: {remote_dir})",
                command=run.command,
                engine=run.opts.engine,
                host=label,
                remote_files=listed,
            )
        raise
    run.say(
        f"analysed on the host in {ha.seconds:.1f} s: {ha.results_bytes} bytes of results copied back, "
        f"{ha.trace_bytes} bytes of traces left in {remote_dir}"
    )
    return rundir.read_run(out_dir).data.get("remote_files") or remote


# steps of the GPU-only host-timing profile: its host time per step is the quickest tenth of them, and
# on the H200 the profiled host's busy time varied 3.1-4.5 ms between the steps of one 8-step profile;
# kernels and runtime calls only, so 32 steps stay small (a CUDA-graph step is a few dozen events)
HOST_TIMING_STEPS = 32


def _host_timing(
    ep: Endpoint, opts: TraceOptions, out_dir: Path, command: list[str], log: Log, cancel: threading.Event, say: Log
) -> None:
    """A short GPU-only profile (kernels and CUDA runtime calls, no CPU ops) before the full one, as a
    run folder of its own in ``out_dir/host-timing``: its host timeline carries CUPTI's cost but not the
    CPU profiler's, and diagnose reads the host's time per step from it (perfscope.analysis.hosttime).
    An extra: when it fails, the trace goes on and the predictions use the full trace's host time."""
    # decode steps are what it times: one file of forward steps
    sub = replace(
        opts,
        gpu_only=True,
        steps=HOST_TIMING_STEPS,
        bench_requests=0,
        host_timing=False,
        by_stage=False,
        analyse_on_host="keep" if opts.analyse_on_host else "",
    )
    say("host timing: a short GPU-only profile first (no CPU ops recorded: the host as unprofiled as it gets)")
    try:
        trace_host(
            ep,
            sub,
            out_dir / rundir.HOST_TIMING_DIR,
            command=command + ["(host timing: --gpu-only)"],
            log=lambda m: log(f"  {m}"),
            cancel=cancel,
        )
    except PerfscopeError as e:
        say(f"note: the host-timing profile failed ({e}); predictions scale the full trace's host time instead")
