"""`perfscope bench`: TTFT / TPOT / ITL of a live server from streamed /generate timestamps."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer
from rich.table import Table

from perfscope.cli import _apikey, _options, _paths
from perfscope.errors import InputError
from perfscope.report.escape import Console

if TYPE_CHECKING:
    from perfscope.bench.core import BenchResult
    from perfscope.remote.hostio import HostIO

NAME = "bench"
ORDER = 60
EXAMPLES = [
    ("perfscope bench --host gpu-box --out run1", "TTFT / TPOT / ITL over SSH, stored in run1/bench.json"),
    ("perfscope bench --url http://127.0.0.1:30000 --num-requests 16 --concurrency 4", "a local server, 4 streams"),
    ("perfscope bench --url http://127.0.0.1:8000 --engine vllm --json", "vLLM's /v1/completions, as JSON"),
]


@contextlib.contextmanager
def _endpoint(
    url: Optional[str], host: Optional[str], port: int, ssh: _options.SSHOptions
) -> Iterator[tuple[str, Optional[str], Optional[HostIO]]]:
    """(base URL, host label, file access on the server's host or None): ``url`` as is, or a
    local forward to ``host``'s loopback ``port``."""
    from perfscope.bench.vocab import is_loopback_url
    from perfscope.remote.hostio import LocalHost, SSHHost

    if url:
        yield url.rstrip("/"), None, LocalHost() if is_loopback_url(url) else None
        return
    from perfscope.remote.ssh import connect

    assert host is not None  # the command gives --url or --host
    target = ssh.target(host)
    session = connect(target)
    try:
        with session.forward(port) as fwd:
            yield fwd.url, target.label, SSHHost(session)
    finally:
        session.close()


def _fmt(v: Optional[float], nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def tpot_spread(res: BenchResult) -> str:
    """``TPOT median 5.05 ms, 95% CI 4.80-5.30, range 3.60-12.20 (n 8)``: how far one
    measurement can be trusted before it is compared with another."""
    from perfscope.analysis.change import median_interval, spread

    xs = [r["tpot_ms"] for r in res.per_request if r.get("ok") and r.get("tpot_ms") is not None]
    sp = spread(xs)
    if not sp["n"]:
        return "TPOT: no request measured"
    line = f"TPOT median {_fmt(sp['median'])} ms"
    iv = median_interval(xs)
    if iv is not None:
        line += f", 95% CI {_fmt(sp['median'] * (1 + iv[0]))}-{_fmt(sp['median'] * (1 + iv[1]))}"
    line += f", range {_fmt(sp['min'])}-{_fmt(sp['max'])} (n {sp['n']}"
    return line + ("; no CI under 3)" if iv is None else ")")


def _table(res: BenchResult, label: str) -> Table:
    w = res.workload
    title = (
        f"perfscope bench  {label}  in={w['input_len']} out={w['output_len']} "
        f"conc={w['concurrency']} n={res.requests}/{w['num_requests']}"
    )
    caption = [
        f"output throughput {_fmt(res.throughput_tok_s, 1)} tok/s   duration {res.duration_s:.1f} s   "
        f"failed {res.failed}",
        tpot_spread(res),
        "TPOT = (latency - TTFT) / (output_tokens - 1)",
    ]
    # the table is at least as wide as its title and caption lines (rich clips that to the screen),
    # so they are not folded at the narrow table's edge ("failed" at the end of a line, "0" on the next)
    t = Table(title=title, title_justify="left", min_width=max(len(title), *map(len, caption)))
    t.add_column("metric")
    for c in ("mean", "median", "p90", "p99"):
        t.add_column(c, justify="right")
    for name, key in (("TTFT (ms)", "ttft"), ("TPOT (ms)", "tpot"), ("ITL (ms)", "itl"), ("E2E latency (ms)", "e2e")):
        s = res.stats_ms[key]
        t.add_row(name, _fmt(s["mean"]), _fmt(s["median"]), _fmt(s["p90"]), _fmt(s["p99"]))
    t.caption = "\n".join(caption)
    t.caption_justify = "left"
    return t


def command(
    url: Optional[str] = typer.Option(None, "--url", help="Server URL (http://127.0.0.1:30000)."),
    host: Optional[str] = typer.Option(
        None,
        "--host",
        "-H",
        metavar=_options.HOST_METAVAR,
        help="Reach the server over SSH (a loopback port forward) instead of --url.",
    ),
    port: int = typer.Option(30000, "--port", help="With --host: the server's HTTP port on the host's loopback."),
    engine: str = _options.ENGINE,
    ssh_user: Optional[str] = _options.SSH_USER,
    ssh_port: Optional[int] = _options.SSH_PORT,
    identity: Optional[Path] = _options.IDENTITY,
    jump: Optional[str] = _options.JUMP,
    known_hosts: Optional[Path] = _options.KNOWN_HOSTS,
    accept_new_host_key: bool = _options.ACCEPT_NEW_HOST_KEY,
    connect_timeout: float = _options.CONNECT_TIMEOUT,
    input_len: int = typer.Option(256, "--input-len", min=1, help="Prompt tokens per request (fixed by --seed)."),
    output_len: int = typer.Option(128, "--output-len", min=2, help="Generated tokens per request (ignore_eos)."),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Requests in flight."),
    num_requests: int = typer.Option(8, "--num-requests", min=1, help="Measured requests."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Warm-up requests before measuring (not counted)."),
    seed: int = typer.Option(0, "--seed", help="Prompt seed: the same seed sends the same prompts."),
    timeout: float = typer.Option(120.0, "--timeout", min=1, help="Seconds to wait for any one reply or stream frame."),
    api_key_env: Optional[str] = _apikey.option(),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    out: Optional[Path] = _paths.out_option(
        "--out", "-o", help="Run folder to store bench.json in (an existing trace run folder gets it added)."
    ),
) -> int:
    """Measure TTFT, TPOT (as SGLang's bench_serving defines it: (latency - TTFT) / (output_tokens - 1))
    and ITL percentiles from streamed /generate (vLLM: /v1/completions) timestamps, after warm-up, with fixed prompts,
    lengths and concurrency (ignore_eos). The same measurement verifies a fix before and after.

    Exit codes: 0 ok, 2 bad option, 3 server unreachable or every request failed."""
    from perfscope.bench import measure

    eng = _options.engine(engine)
    if bool(url) == bool(host):
        raise InputError("give --url URL or --host HOST (over SSH), not both or neither")
    if url:
        _options.server_url(url)
    api_key = _apikey.read(api_key_env)
    ssh = _options.SSHOptions(ssh_user, ssh_port, identity, jump, known_hosts, accept_new_host_key, connect_timeout)
    err = Console(stderr=True, highlight=False, soft_wrap=True)  # paths and errors: never folded
    from perfscope.bench.vocab import token_ids

    with _endpoint(url, host, port, ssh) as (base, label, io):
        client = eng.client(base, api_key=api_key, timeout=timeout)
        info = client.server_info()
        ids, _ = token_ids(info, io)
        shown = label or base
        if not json_out:
            err.print(
                f"bench {shown}: {warmup} warm-up + {num_requests} requests, in={input_len} out={output_len} "
                f"concurrency={concurrency}",
                markup=False,
            )
        res = measure(
            client,
            input_len=input_len,
            output_len=output_len,
            concurrency=concurrency,
            num_requests=num_requests,
            warmup=warmup,
            seed=seed,
            timeout=timeout,
            server_info=info,
            ids=ids,
        )
    argv = (
        ["perfscope", NAME]
        + (["--url", url] if url else ["--host", str(host)])
        + [
            "--engine",
            eng.name,
            "--input-len",
            str(input_len),
            "--output-len",
            str(output_len),
            "--concurrency",
            str(concurrency),
            "--num-requests",
            str(num_requests),
            "--warmup",
            str(warmup),
            "--seed",
            str(seed),
        ]
    )
    from perfscope.bench.store import store  # here: every other command's start skips perfscope.bench

    stored = store(out, res, base, label, info, argv) if out is not None else None
    if json_out:
        d = res.to_dict()
        if stored:
            d["bench_file"] = str(stored)
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
    else:
        Console().print(_table(res, shown))
        if res.errors:
            err.print(f"failed requests: {res.failed}: {res.errors[0]}", markup=False)
        if stored:
            err.print(f"stored: {stored}", markup=False)
    return 0
