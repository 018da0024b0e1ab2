"""``trace --bench N``: TPOT / TTFT measured without any profiler, before this run's first profile (a GPU
trace leaves CUPTI attached to the server), with the trace's workload; stored in the run folder
(``bench.json``, ``timings.bench`` in run.json), which diagnose and compare prefer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from perfscope.capture.options import TraceOptions
from perfscope.remote.sglang_api import SGLangClient

if TYPE_CHECKING:
    from perfscope.bench.core import BenchResult


def measure(
    api: SGLangClient, opts: TraceOptions, info: dict, say: Callable[[str], None], ids: tuple[int, int] | None = None
) -> BenchResult:
    """``perfscope bench`` with the trace's workload: 1 warm-up + ``opts.bench_requests`` requests."""
    from perfscope.bench import measure as bench_measure

    say(
        f"measuring without the profiler first: 1 warm-up + {opts.bench_requests} request(s) "
        f"(in={opts.input_len} out={opts.output_len} concurrency={opts.concurrency})"
    )
    res = bench_measure(
        api,
        input_len=opts.input_len,
        output_len=opts.output_len,
        concurrency=opts.concurrency,
        num_requests=opts.bench_requests,
        warmup=1,
        seed=opts.seed,
        timeout=opts.http_timeout,
        server_info=info,
        ids=ids,
    )
    say(f"TPOT without the profiler: {res.tpot_ms:.2f} ms (TTFT {res.ttft_ms:.1f} ms)")
    return res


def store(res: BenchResult, opts: TraceOptions, out_dir: Path, url: str, host: str | None, info: dict) -> dict:
    """The bench stored in the run folder as ``perfscope bench`` would store it; returns its summary
    for run.json's timings."""
    from perfscope.bench.store import run_summary
    from perfscope.bench.store import store as bench_store

    argv = [
        "perfscope",
        "bench",
        "--url" if host is None else "--host",
        url if host is None else host,
        "--engine",
        opts.engine,
        "--input-len",
        str(opts.input_len),
        "--output-len",
        str(opts.output_len),
        "--concurrency",
        str(opts.concurrency),
        "--num-requests",
        str(opts.bench_requests),
        "--warmup",
        "1",
        "--seed",
        str(opts.seed),
    ]
    bench_store(out_dir, res, url, host, info, argv)
    return run_summary(res)
