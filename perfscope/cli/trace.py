"""`perfscope trace`: profile a live server over SSH (or a local URL) into a run folder."""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional
from urllib.parse import urlparse

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from perfscope.cli import _apikey, _argv, _options, _paths
from perfscope.errors import InputError
from perfscope.report.escape import Console

if TYPE_CHECKING:
    from perfscope.capture.trace import Endpoint, HostResult
    from perfscope.rundir import RunInfo

NAME = "trace"
ORDER = 10
EXAMPLES = [
    (
        "perfscope trace --host gpu-box --port 30000 --out run1",
        "SSH (known_hosts checked): every rank's trace + run.json in ./run1",
    ),
    (
        "perfscope trace --host gpu-box --bench 8 --no-stack --out run1",
        "the same, plus TTFT/TPOT of 8 requests without the profiler, and no Python stacks in the profile "
        "(for a server whose profiler crashed in its stack tracer; diagnose then names no source lines)",
    ),
    (
        "perfscope trace --url http://127.0.0.1:8000 --engine vllm --profile-dir /tmp/vllm-prof",
        "a local vLLM server, no SSH",
    ),
    (
        "perfscope trace --host gpu-box --analyse-on-host --out run1",
        "the host's Python analyses the traces (needs msgspec there): only the results come back, the traces stay "
        "(perfscope trace --fetch run1 copies them later)",
    ),
]


def command(
    ctx: typer.Context,
    host: List[str] = typer.Option(
        [],
        "--host",
        "-H",
        metavar=_options.HOST_METAVAR,
        help="Server host reached over SSH; repeat for several hosts (traced in parallel, "
        "one subfolder each). ~/.ssh/config aliases work.",
    ),
    url: Optional[str] = typer.Option(
        None,
        "--url",
        help="Server URL reachable without SSH (http://127.0.0.1:30000); "
        "the server must write its traces on this machine.",
    ),
    ssh_user: Optional[str] = _options.SSH_USER,
    ssh_port: Optional[int] = _options.SSH_PORT,
    identity: Optional[Path] = _options.IDENTITY,
    jump: Optional[str] = _options.JUMP,
    known_hosts: Optional[Path] = _options.KNOWN_HOSTS,
    accept_new_host_key: bool = _options.ACCEPT_NEW_HOST_KEY,
    port: List[int] = typer.Option(
        [],
        "--port",
        help="The server's HTTP port on the host's loopback (default 30000). "
        "With several --host: one --port for all, or one per --host "
        "in the same order.",
    ),
    engine: str = _options.ENGINE,
    profile_dir: Optional[str] = typer.Option(
        None, "--profile-dir", help="vLLM: the server's torch profiler directory (where it writes traces)."
    ),
    remote_dir: str = typer.Option(
        "/tmp",
        "--remote-dir",
        help="SGLang: where on the host to make the fresh trace folder (in a container: a mounted path).",
    ),
    steps: int = typer.Option(
        20, "--steps", min=1, help="Forward steps to profile (num_steps; per stage with SGLang 0.4.7+)."
    ),
    by_stage: Optional[bool] = typer.Option(
        None,
        "--by-stage/--no-by-stage",
        help="SGLang: one EXTEND and one DECODE file per rank, --steps each (default: on for SGLang 0.4.7+).",
    ),
    profile_prefix: Optional[str] = typer.Option(
        None,
        "--profile-prefix",
        metavar="PREFIX",
        help="SGLang 0.5.10+: start the trace file names with PREFIX "
        "(then the run id, TP rank and the rest of SGLang's name).",
    ),
    gpu_only: bool = typer.Option(
        False,
        "--gpu-only",
        help="SGLang on a GPU: record GPU activity only (kernels and CUDA runtime calls, "
        "no CPU ops, stacks or shapes), so the host's timeline carries almost none of "
        "the CPU profiler's per-event cost; diagnose reads such a run for the host's "
        "own time per step.",
    ),
    stack: bool = typer.Option(
        True,
        "--stack/--no-stack",
        help="SGLang: record the Python stack of each op (with_stack). --no-stack leaves torch's stack "
        "tracer out of the server's profiler (it has crashed servers); diagnose then cannot name the "
        "source line that launched an op, and eager-decode predicts from the kernel time alone. vLLM "
        "sets this at its launch "
        "(--profiler-config.torch_profiler_with_stack=false).",
    ),
    shapes: bool = typer.Option(
        True,
        "--shapes/--no-shapes",
        help="SGLang: record the input dtypes and shapes of each op (record_shapes). --no-shapes: a "
        "smaller trace; diagnose then has no roofline or FLOP figures and no rule that reads shapes. "
        "vLLM sets this at its launch.",
    ),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Parallel request streams while profiling."),
    input_len: int = typer.Option(256, "--input-len", min=1, help="Prompt tokens per request."),
    output_len: int = typer.Option(
        128,
        "--output-len",
        min=1,
        help="Generated tokens per request (ignore_eos; 128, as bench and fix --bench-output-len); requests still streaming when the traces are complete are cut.",
    ),
    timeout: float = typer.Option(300.0, "--timeout", min=1, help="Seconds to wait for complete traces, per host."),
    poll: float = typer.Option(
        1.0,
        "--poll",
        min=0.05,
        metavar="SECONDS",
        help="Seconds between two looks at the trace files being written: one is complete when its size held "
        "over a look and its gzip stream is whole, the set when it stayed so for one more look.",
    ),
    connect_timeout: float = _options.CONNECT_TIMEOUT,
    http_timeout: float = typer.Option(
        30.0,
        "--http-timeout",
        min=1,
        metavar="SECONDS",
        help="Longest wait for a reply or for the next line of a stream from the "
        "server. A stream that stalls past it once the profile's steps are "
        "done (the engine writing its profile) is noted, not a failure.",
    ),
    bench: int = typer.Option(
        0,
        "--bench",
        min=0,
        metavar="N",
        help="First, before any profile, measure TTFT/TPOT without the profiler with N "
        "requests of the same workload (perfscope bench), stored in the run folder: "
        "diagnose holds its predictions and idle findings to it. (A GPU trace leaves "
        "CUPTI attached to the server: a bench after it measures a slower host.)",
    ),
    no_host_timing: bool = typer.Option(
        False,
        "--no-host-timing",
        help="Skip the short GPU-only profile that SGLang on a GPU gets first "
        "(RUN/host-timing/: its host timeline the CPU profiler did not slow; "
        "diagnose reads the host's time per step from it).",
    ),
    api_key_env: Optional[str] = _apikey.option(),
    keep_remote: bool = typer.Option(False, "--keep-remote", help="Leave the traces on the host after the copy."),
    python: Optional[str] = typer.Option(
        None,
        "--python",
        metavar="PY",
        help="The server's interpreter on the host, asked for its versions (default: "
        "the process on --port's, when it runs as the SSH user).",
    ),
    analyse_on_host: bool = typer.Option(
        False,
        "--analyse-on-host",
        help="Analyse each trace on its host with the host's own Python (3.10+ with "
        "msgspec; perfscope itself is shipped as a zip for the run) and copy "
        "back only the results (~10 KB a rank); the traces stay on the host "
        "(implies --keep-remote), listed in run.json with their sha256. "
        "diagnose reads the results; --fetch RUN copies the traces later.",
    ),
    analysis_timeout: float = typer.Option(
        3600.0,
        "--analysis-timeout",
        min=1,
        metavar="SECONDS",
        help="--analyse-on-host: the longest the host's analysis may run.",
    ),
    fetch: Optional[Path] = typer.Option(
        None,
        "--fetch",
        metavar="RUN_DIR",
        help="Copy the traces a --analyse-on-host run left on its host(s) into "
        "RUN_DIR/traces/ (sha256-checked), making it an ordinary run folder "
        "(diagnose's per-rank options then work). The SSH options apply.",
    ),
    out: Optional[Path] = _paths.out_option(
        "--out", "-o", help="Run folder to create (default ./perfscope-run-<time>)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the run summary as JSON on stdout."),
) -> int:
    """Profile a live SGLang (or vLLM) server and bring its traces home: reads the server's config,
    arms /start_profile with a fresh folder on the host, drives decode load while it records, waits
    for every rank's complete trace, copies them back over SFTP with a sha256 check, and writes a
    run folder (run.json + traces/) for `perfscope diagnose`. The HTTP API is reached through the
    SSH connection (a loopback port forward); nothing is opened to the network. The profiler is
    stopped on any failure or Ctrl-C.

    Exit codes: 0 ok, 2 bad option, 3 host / SSH / server failure (also a server that died or stopped
    answering during the profile: said in one line, with the retry)."""
    from perfscope import rundir
    from perfscope.capture.trace import TraceOptions, trace

    err = Console(stderr=True, highlight=False, soft_wrap=True)  # hosts, paths, commands: never folded
    ssh = _options.SSHOptions(ssh_user, ssh_port, identity, jump, known_hosts, accept_new_host_key, connect_timeout)
    if fetch is not None:
        if host or url or analyse_on_host:
            raise InputError(
                "--fetch RUN_DIR takes the hosts from RUN_DIR's run.json: no --host, --url or --analyse-on-host with it"
            )
        return _fetch(fetch, err, ssh, json_out=json_out)
    if analyse_on_host and url:
        raise InputError("--analyse-on-host goes with --host: with --url the traces are on this machine already")
    if bool(host) == bool(url):
        raise InputError("give --host HOST (over SSH) or --url URL (no SSH), not both or neither")
    eng = _options.engine(engine)
    api_key = _apikey.read(api_key_env)
    if output_len < 2:
        raise InputError("--output-len must be at least 2 (decode steps need generated tokens)")
    if profile_prefix is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._]{0,63}", profile_prefix):
        raise InputError(f"--profile-prefix {profile_prefix!r}: letters, digits, '.' and '_' only (up to 64)")
    opts = TraceOptions(
        port=30000,
        steps=steps,
        engine=eng.name,
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        timeout=timeout,
        poll_s=poll,
        api_key=api_key,
        remote_dir=remote_dir,
        profile_dir=profile_dir,
        keep_remote=keep_remote,
        bench_requests=bench,
        by_stage=by_stage,
        profile_prefix=profile_prefix,
        gpu_only=gpu_only,
        with_stack=stack,
        record_shapes=shapes,
        python=python,
        host_timing=not no_host_timing,
        http_timeout=http_timeout,
        analyse_on_host="analyse" if analyse_on_host else "",
        analysis_timeout=analysis_timeout,
    )
    eng.check_options(opts)
    endpoints = _endpoints(host, url, port, ssh, remote_dir, err)
    if out is None:
        out = _paths.resolve(Path(f"perfscope-run-{datetime.now().strftime('%Y%m%d-%H%M%S')}"))
        assert out is not None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out {out} exists and is not empty: pick a new folder")
    if analyse_on_host and not keep_remote:
        err.print(
            "note: --analyse-on-host keeps the traces on the host (--keep-remote implied); "
            "perfscope trace --fetch RUN copies them later",
            markup=False,
            highlight=False,
        )
    argv = _argv.scrub_argv(_argv.canonical_argv(ctx, NAME))
    from perfscope.errors import redact

    log = lambda m: err.print(redact(m), markup=False, highlight=False)  # noqa: E731  (no key in any line)
    with _progress(err) as prog:
        results = trace(endpoints, opts, out, command=argv, log=log, progress=prog)
    _report(rundir.read_run(out), out, results, analyse_on_host, json_out)
    return 0


def _endpoints(
    host: list[str], url: str | None, port: list[int], ssh: _options.SSHOptions, remote_dir: str, err: Console
) -> list[Endpoint]:
    """Where to trace: each --host with its --port (one for all, or one each), or the --url."""
    from perfscope.capture.trace import Endpoint

    if port and any(not 0 < p < 65536 for p in port):
        raise InputError(f"--port {port}: expected port numbers 1-65535")
    if url and port:
        raise InputError("--port goes with --host; with --url the port is in the URL")
    if len(port) > 1 and len(port) != len(host):
        raise InputError(
            f"{len(port)} --port values for {len(host)} --host: give one --port for all hosts, "
            "or one per --host in the same order"
        )
    if url:
        url = _options.server_url(url)
        if not _options.is_local(url):
            err.print(
                f"[yellow]note:[/] {urlparse(url).hostname} is not this machine: the traces must appear in "
                f"{remote_dir} here (shared storage), else use --host"
            )
        return [Endpoint(url=url)]
    ports: list[int | None] = [*port] * len(host) if len(port) == 1 else [*port] if port else [None] * len(host)
    return [Endpoint(target=ssh.target(h), port=p) for h, p in zip(host, ports)]


def _progress(err: Console) -> Progress:
    """The copy's progress bars, on a terminal only."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=not err.is_terminal,
        disable=not err.is_terminal,
    )


def _report(info: RunInfo, out: Path, results: list[HostResult], analyse_on_host: bool, json_out: bool) -> None:
    """The run summary: JSON on stdout, or the run folder, what it holds and the next command."""
    summary: dict[str, Any] = {
        "run_dir": str(out),
        "hosts": info.hosts,
        "files": [
            {"path": f.rel, "bytes": f.bytes, "sha256": f.sha256, "rank": f.rank, "stage": f.stage} for f in info.files
        ],
        "timings": {r.label: r.timings for r in results} if len(results) > 1 else results[0].timings,
    }
    if analyse_on_host:
        summary["remote_files"] = [
            {k: e.get(k) for k in ("host", "remote_path", "bytes", "sha256", "rank", "stage")}
            for e in info.data.get("remote_files") or []
        ]
        summary["analysis"] = [m.data.get("analysis") for m in (info.members or [info])]
    if json_out:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    t = summary["timings"] if len(results) == 1 else {}
    extra = ""
    if t.get("ttft_ms") is not None and t.get("tpot_ms") is not None:
        extra = f"  (under the profiler: TTFT {t['ttft_ms']:.1f} ms, TPOT {t['tpot_ms']:.2f} ms)"
    b = t.get("bench") or {}
    if b.get("tpot_ms") is not None:
        extra += f"\nwithout the profiler: TTFT {b['ttft_ms']:.1f} ms, TPOT {b['tpot_ms']:.2f} ms (bench.json)"
    what = (
        f"{len(info.data.get('remote_files') or [])} trace file(s) analysed on the host, left there"
        if analyse_on_host
        else f"{len(info.files)} trace file(s)"
    )
    Console(soft_wrap=True).print(
        f"run folder: {out}  {what}{extra}\nnext: perfscope diagnose {out}", markup=False, highlight=False
    )


def _fetch(run_dir: Path, err: Console, ssh: _options.SSHOptions, *, json_out: bool) -> int:
    """``--fetch RUN_DIR``: the traces an --analyse-on-host run left on its host(s), copied into it."""
    import contextlib
    from typing import Iterator

    from perfscope.cluster.onhost_fetch import fetch as fetch_traces
    from perfscope.errors import redact
    from perfscope.remote.hostio import SSHHost
    from perfscope.remote.ssh import connect

    @contextlib.contextmanager
    def connect_host(label: str) -> Iterator[SSHHost]:
        session = connect(ssh.target(label))
        try:
            yield SSHHost(session)
        finally:
            session.close()

    log = lambda m: err.print(redact(m), markup=False, highlight=False)  # noqa: E731
    with _progress(err) as prog:
        n = fetch_traces(run_dir, connect_host, say=log, progress=prog)
    if json_out:
        sys.stdout.write(json.dumps({"run_dir": str(run_dir), "bytes": n}) + "\n")
    else:
        Console(soft_wrap=True).print(
            f"run folder: {run_dir}  {n} bytes of traces fetched\nnext: perfscope diagnose {run_dir}",
            markup=False,
            highlight=False,
        )
    return 0
