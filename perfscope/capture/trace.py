"""``perfscope trace``: profile a live SGLang (or vLLM) server and bring its traces home.

Per host: reach the HTTP API (through an SSH port forward, or ``--url``), read the server's config,
make a fresh folder on the host, arm the profiler, drive decode load until every rank's trace is
complete (size stable over two polls and gzip intact), copy the traces back with a sha256 check,
collect versions / GPU / timings, and write the run folder (:mod:`perfscope.capture.rundir`).
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
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from perfscope.capture import rundir
from perfscope.capture.hostio import HostIO, LocalHost, SSHHost, trace_file_complete
from perfscope.capture.ssh import SSHTarget, ServerDown, connect
from perfscope.errors import InputError, PerfscopeError, RemoteError

log_fn = Callable[[str], None]


@dataclass
class TraceOptions:
    port: int = 30000
    steps: int = 20
    engine: str = "sglang"  # or "vllm"
    concurrency: int = 1
    input_len: int = 256
    output_len: int = 256
    timeout: float = 300.0  # for the whole wait for complete traces, per host
    http_timeout: float = 30.0
    api_key: str | None = field(default=None, repr=False)  # never written anywhere
    remote_dir: str = "/tmp"  # where the fresh output folder is made (sglang)
    profile_dir: str | None = None  # vLLM: the server's torch profiler dir
    by_stage: bool | None = None  # None: when the server's version supports it
    with_stack: bool = True
    record_shapes: bool = True
    keep_remote: bool = False
    poll_s: float = 1.0
    seed: int = 0


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


# ----------------------------------------------------------------------------- server access

# The HTTP client and the load driver belong to perfscope.capture.sglang_api / workload; these two
# functions are the only places that call them.


def _api(url: str, opts: TraceOptions):
    from perfscope.capture.vllm_api import client_for

    return client_for(opts.engine, url, api_key=opts.api_key, timeout=opts.http_timeout)


class _Counting:
    """The load's client, counting streamed frames that carry a new token (vLLM's profile has no
    num_steps: perfscope stops it after about ``steps`` decode steps' worth of tokens)."""

    def __init__(self, client, on_token: Callable[[], None]):
        self._c, self._on_token = client, on_token

    def __getattr__(self, name):
        return getattr(self._c, name)

    def generate_stream(self, payload, timeout=None, stop=None):
        seen = 0
        for fr in self._c.generate_stream(payload, timeout=timeout, stop=stop):
            n = (fr.data.get("meta_info") or {}).get("completion_tokens")
            if isinstance(n, int) and n > seen:
                for _ in range(n - seen):
                    self._on_token()
                seen = n
            yield fr


class _Load:
    """Decode load in a background thread until ``stop()``: ``concurrency`` streams of
    ``output_len`` tokens with ignore_eos, new requests as old ones end (the workload driver's
    ``drive_decode``; summarised as ``perfscope bench`` summarises)."""

    def __init__(self, url: str, opts: TraceOptions):
        self.url, self.opts = url, opts
        self.stop_event = threading.Event()
        self.results: list | None = None
        self.completed = 0
        self.tokens = 0  # streamed tokens, all streams together
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.t0 = self.t1 = 0.0
        self.thread = threading.Thread(target=self._run, name="perfscope-load", daemon=True)

    def _token(self) -> None:
        with self._lock:
            self.tokens += 1

    def _done(self, rt) -> None:
        if getattr(rt, "ok", False):
            self.completed += 1

    def _run(self) -> None:
        from perfscope.capture import workload

        client = _Counting(_api(self.url, self.opts), self._token)
        self.t0 = time.perf_counter()
        try:
            self.results = workload.drive_decode(
                client, self.opts.concurrency, self.opts.input_len, self.opts.output_len, seed=self.opts.seed,
                stop=self.stop_event, timeout=self.opts.http_timeout, on_done=self._done,
            )
        except BaseException as e:  # reported by the waiter
            self.error = e
        finally:
            self.t1 = time.perf_counter()

    def start(self) -> "_Load":
        self.thread.start()
        return self

    def stop(self, wait: float = 30.0) -> None:
        self.stop_event.set()
        self.thread.join(timeout=wait)

    def summary(self) -> tuple[dict, dict]:
        """(workload dict, timings dict) for run.json. The load stops as soon as the traces are
        complete, so requests still streaming then are cut: their tokens count towards TTFT and
        TPOT (``requests_cut``), not towards end-to-end latency."""
        if not self.results:
            return {}, {}
        import dataclasses

        from perfscope.bench.core import summarize

        cut = [t for t in self.results if not t.ok and not t.error and t.output_tokens > 1]
        whole = [t for t in self.results if t.ok]
        timed = whole + [dataclasses.replace(t, ok=True) for t in cut]
        r = summarize(timed, (self.t1 or time.perf_counter()) - self.t0).to_dict()
        timings = {k: r[k] for k in ("ttft_ms", "tpot_ms", "itl_ms", "itl_p50_ms", "itl_p90_ms",
                                       "itl_p99_ms", "stats_ms", "tpot_definition", "failed",
                                       "output_tokens", "throughput_tok_s", "duration_s") if k in r}
        timings["requests"] = len(whole)
        timings["requests_cut"] = len(cut)
        timings["e2e_ms"] = summarize(whole, 1.0).e2e_ms if whole else None
        if "stats_ms" in timings:
            timings["stats_ms"] = {**timings["stats_ms"], "e2e": summarize(whole, 1.0).stats_ms["e2e"] if whole else None}
        return {}, timings


def _version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4])


def _expected_files(info: dict, by_stage: bool) -> int:
    """Trace files one profile writes: one per scheduler process (x2 with by-stage), on this node."""
    def num(k, d=1):
        try:
            return max(int(info.get(k) or d), 1)
        except (TypeError, ValueError):
            return d

    n = num("tp_size") * num("pp_size")
    if num("dp_size") > 1 and not info.get("enable_dp_attention"):
        n *= num("dp_size")
    n = max(n // num("nnodes"), 1)
    return n * (2 if by_stage else 1)


def _is_not_running(err: BaseException) -> bool:
    return bool(re.search(r"not in progress|no profil|not running|not started", str(err), re.I))


# ----------------------------------------------------------------------------------- one host


@dataclass
class HostResult:
    label: str
    run_dir: Path
    files: list[dict]
    timings: dict
    server_info: dict


def trace_host(ep: Endpoint, opts: TraceOptions, out_dir: Path, *, command: list[str],
               log: log_fn = print, progress=None, cancel: threading.Event | None = None) -> HostResult:
    """Trace one server, write ``out_dir`` as a run folder, return what was written."""
    cancel = cancel or threading.Event()
    label = ep.label
    port = ep.port or opts.port
    say = lambda m: log(f"[{label}] {m}")  # noqa: E731
    with _host_io(ep, port) as (io, url):
        api = _api(url, opts)
        info = _server_info(api, label)
        version = str(info.get("version") or "")
        say(f"server {opts.engine} {version or '(version unknown)'}, model {info.get('model_path', '?')}, "
            f"tp={info.get('tp_size', 1)}")
        proc = io.server_process(port) if ep.target is not None else {}
        versions = io.python_versions(io.python_candidates(proc), want=opts.engine)
        if version:
            versions["server"] = version
        gpu = io.nvidia_smi()
        by_stage = opts.by_stage
        if by_stage is None:
            by_stage = opts.engine == "sglang" and _version_tuple(version) >= (0, 4, 7)
        expected = _expected_files(info, by_stage) if opts.engine == "sglang" else 1
        # the folder the server writes to
        baseline: set[str] = set()
        made_dir = False
        if opts.engine == "vllm":
            if not opts.profile_dir:
                raise InputError("--engine vllm needs --profile-dir: the server's torch profiler directory "
                                 "(its --profiler-config torch_profiler_dir, or VLLM_TORCH_PROFILER_DIR)")
            remote_dir = opts.profile_dir
            try:  # traces already there are not this run's; vLLM makes the folder at its first trace
                baseline = {f.name for f in io.list_traces(remote_dir)}
            except RemoteError as e:
                if "does not exist" not in str(e):
                    raise
        else:
            remote_dir = io.mkdtemp(opts.remote_dir)
            made_dir = True
            if proc.get("uid") is not None and proc.get("uid") != _my_uid(io):
                io.chmod(remote_dir, 0o777)  # the server runs as another user and must write here
        profile = {"output_dir": remote_dir, "num_steps": opts.steps, "with_stack": opts.with_stack,
                   "record_shapes": opts.record_shapes, "activities": ["CPU", "GPU"]}
        if opts.engine == "vllm":  # vLLM's profiler is configured at server start; perfscope stops it
            profile = {"output_dir": remote_dir, "num_steps": opts.steps, "stopped_by": "perfscope",
                       "with_stack": None, "record_shapes": None, "activities": None}
        if by_stage:
            profile["profile_by_stage"] = True
        armed = complete = False
        load: _Load | None = None
        got: list = []
        t_start = time.time()
        try:
            if cancel.is_set():
                raise KeyboardInterrupt  # another host failed before this one armed: do not arm
            try:
                if opts.engine == "vllm":
                    api.start_profile()
                else:
                    api.start_profile(**profile)
            except PerfscopeError as e:
                if re.search(r"already in progress|already running|already started", str(e), re.I):
                    raise RemoteError(f"a profile is already running on {label} (someone else's?): "
                                      "not touching it; try again when it ends") from None
                raise
            armed = True
            say(f"profiler armed: {opts.steps} steps{' per stage' if by_stage else ''} -> {remote_dir}")
            load = _Load(url, opts).start()
            if opts.engine == "vllm":
                n = _wait_vllm_steps(load, opts, cancel, label)
                say(f"{n} tokens streamed while profiling: stopping the profiler (vLLM writes its traces now)")
                api.stop_profile()
            got = _wait_complete(io, remote_dir, expected, baseline, opts, load, cancel, label, say)
            complete = True  # the load stops now: requests still streaming are cut, their tokens timed
        finally:
            if load is not None:
                load.stop(wait=5 if not complete else 60)
            if armed and not complete:
                _stop_quietly(api, say)
        workload, timings = load.summary() if load else ({}, {})
        timings.setdefault("under_profiler", True)
        # copy back
        files = []
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
        if files and not opts.keep_remote:
            io.remove([f.path for f in got], remote_dir if made_dir else None)
        workload = {"concurrency": opts.concurrency, "input_len": opts.input_len, "output_len": opts.output_len,
                    "ignore_eos": True, "seed": opts.seed, **workload}
        rundir.write_run(
            out_dir, command=command, kind="trace", engine=opts.engine,
            host=label if ep.target else None, url=ep.url or f"ssh://{label} -> 127.0.0.1:{port}",
            versions=versions, server_info=info, gpu=gpu, workload=workload, timings=timings,
            profile={**profile, "remote_dir_kept": opts.keep_remote, "started": t_start,
                     "duration_s": round(time.time() - t_start, 3)},
            files=files,
        )
        say(f"{len(files)} trace file(s) -> {out_dir / rundir.TRACES_DIR}")
        return HostResult(label, out_dir, files, timings, info)


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


def _stop_quietly(api, say) -> None:
    try:
        api.stop_profile()
        say("profiler stopped")
    except Exception as e:  # 'no profile running' is fine; anything else is reported, not raised
        if not _is_not_running(e):
            say(f"warning: /stop_profile failed: {e}")


def _wait_vllm_steps(load: _Load, opts: TraceOptions, cancel: threading.Event, label: str) -> int:
    """vLLM profiles until /stop_profile: let the load stream about ``steps`` decode steps (a decode
    step gives each running stream one token, so ``steps * concurrency`` tokens, plus the first
    token of each stream, which comes from a prefill). Bounded by ``opts.timeout``; returns the
    tokens streamed while armed."""
    deadline = time.monotonic() + opts.timeout
    want = (opts.steps + 1) * opts.concurrency
    start = load.tokens
    while True:
        if cancel.is_set():
            raise KeyboardInterrupt
        if load.error is not None:
            e = load.error
            raise e if isinstance(e, PerfscopeError) else RemoteError(f"the load on {label} failed: {e}")
        got = load.tokens - start
        if got >= want:
            return got
        if not load.thread.is_alive():
            raise RemoteError(f"the load on {label} ended after {got} of {want} tokens")
        if time.monotonic() > deadline:
            raise RemoteError(f"the server on {label} streamed {got} of {want} tokens within {opts.timeout:g}s "
                              "while profiling; the profiler was stopped",
                              hint="is the server processing requests? raise --timeout for slow servers")
        time.sleep(0.02)


def _wait_complete(io: HostIO, folder: str, expected: int, baseline: set[str], opts: TraceOptions,
                   load: _Load | None, cancel: threading.Event, label: str, say) -> list:
    """Poll ``folder`` until ``expected`` new trace files are complete: size unchanged over two
    polls and the gzip stream (or plain JSON) complete (checked on the host). Bounded by ``opts.timeout``."""
    deadline = time.monotonic() + opts.timeout
    prev: dict[str, tuple[int, float]] = {}
    intact: set[str] = set()
    quiet_since: float | None = None
    while True:
        if cancel.is_set():
            raise KeyboardInterrupt
        if load is not None and load.error is not None and not isinstance(load.error, KeyboardInterrupt):
            e = load.error
            raise e if isinstance(e, PerfscopeError) else RemoteError(f"the load on {label} failed: {e}")
        files = [f for f in io.list_traces(folder) if f.name not in baseline]
        cur = {f.name: (f.size, f.mtime) for f in files}
        stable = [f for f in files if f.size > 0 and prev.get(f.name) == cur[f.name]]
        unchecked = [f.path for f in stable if f.name not in intact]
        if unchecked:
            bad = io.incomplete(unchecked)
            ok = set(unchecked) - set(bad or []) if bad is not None else set(unchecked)
            intact |= {f.name for f in stable if f.path in ok}
        for name in list(intact):
            if name in prev and prev[name] != cur.get(name):
                intact.discard(name)  # it grew again
        done = [f for f in files if f.name in intact and prev.get(f.name) == cur[f.name]]
        if len(done) >= expected and len(done) == len(files):
            # one more quiet poll: a late rank's file may still appear
            if quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= opts.poll_s:
                return sorted(done, key=lambda f: f.name)
        else:
            quiet_since = None
        if time.monotonic() > deadline:
            partial = [f.name for f in files if f.name not in intact]
            detail = f"{len(done)} of {expected} trace file(s) complete"
            if partial:
                detail += f"; incomplete: {', '.join(partial[:4])}"
            raise RemoteError(
                f"the profile on {label} did not complete within {opts.timeout:g}s ({detail}) in {folder}; "
                "the profiler was stopped",
                hint="is the server processing requests? raise --timeout for slow servers",
            )
        prev = cur
        time.sleep(opts.poll_s)


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
    out_dir = Path(out_dir)
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
    if errors:
        label, e = errors[0]
        if isinstance(e, PerfscopeError):
            raise type(e)(f"{label}: {e.message}" if label not in e.message else e.message, hint=e.hint)
        raise RemoteError(f"{label}: {e}")
    done = [r for r in results if r is not None]
    all_files = []
    for d, r in zip(dirs, done):
        for fe in r.files:
            all_files.append({**fe, "path": f"{d}/{fe['path']}"})
    rundir.write_run(
        out_dir, command=command, kind="multi", engine=opts.engine, host=done[0].label,
        hosts=[r.label for r in done], files=all_files,
        members=[{"host": r.label, "dir": d} for d, r in zip(dirs, done)],
    )
    return done
