"""The benchmark: warm-up, then a fixed set of streamed requests, summarised like SGLang's
``bench_serving`` (TTFT, TPOT = (latency - TTFT) / (output_tokens - 1), ITL percentiles)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from perfscope.bench.workload import RequestTiming, drive_decode, id_range, make_prompts
from perfscope.errors import PerfscopeError, RemoteError


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (numpy's default), ``q`` in 0..100; None when empty."""
    xs = sorted(values)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats_ms(values_s: Sequence[float]) -> dict:
    v = [x * 1e3 for x in values_s]
    if not v:
        return {"n": 0, "mean": None, "median": None, "p90": None, "p99": None, "min": None, "max": None}
    return {
        "n": len(v),
        "mean": sum(v) / len(v),
        "median": percentile(v, 50),
        "p90": percentile(v, 90),
        "p99": percentile(v, 99),
        "min": min(v),
        "max": max(v),
    }


@dataclass
class BenchResult:
    """Summary of one measurement. ``ttft_ms`` / ``tpot_ms`` / ``e2e_ms`` are medians over requests
    (the headline numbers), ``itl_ms`` the ITL percentiles over all frames; ``stats_ms`` has
    n / mean / median / p90 / p99 / min / max of each."""

    workload: dict
    requests: int  # completed
    failed: int
    output_tokens: int
    input_tokens: int
    duration_s: float
    ttft_ms: Optional[float]
    tpot_ms: Optional[float]
    itl_ms: dict  # {"p50", "p90", "p99", "mean"} (run.json's shape)
    e2e_ms: Optional[float]
    itl_p50_ms: Optional[float]
    itl_p90_ms: Optional[float]
    itl_p99_ms: Optional[float]
    throughput_tok_s: Optional[float]
    request_throughput: Optional[float]
    stats_ms: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    per_request: list = field(default_factory=list)
    server: dict = field(default_factory=dict)

    def to_dict(self, per_request: bool = True) -> dict:
        d = {
            k: getattr(self, k)
            for k in (
                "workload",
                "requests",
                "failed",
                "output_tokens",
                "input_tokens",
                "duration_s",
                "ttft_ms",
                "tpot_ms",
                "itl_ms",
                "e2e_ms",
                "itl_p50_ms",
                "itl_p90_ms",
                "itl_p99_ms",
                "throughput_tok_s",
                "request_throughput",
                "stats_ms",
                "errors",
                "server",
            )
        }
        d["tpot_definition"] = "(latency - ttft) / (output_tokens - 1), per request (bench_serving)"
        if per_request:
            d["per_request"] = self.per_request
        return d


def summarize(
    timings: list[RequestTiming], duration_s: float, workload: Optional[dict] = None, server: Optional[dict] = None
) -> BenchResult:
    done = [t for t in timings if t.ok]
    failed = [t for t in timings if t.error]
    ttft = [t.ttft_s for t in done]
    tpot = [t.tpot_s for t in done if t.tpot_s is not None]
    itl = [x for t in done for x in t.itl_s]
    e2e = [t.latency_s for t in done]
    out_tok = sum(t.output_tokens for t in done)
    st = {"ttft": _stats_ms(ttft), "tpot": _stats_ms(tpot), "itl": _stats_ms(itl), "e2e": _stats_ms(e2e)}
    return BenchResult(
        workload=dict(workload or {}),
        requests=len(done),
        failed=len(failed),
        output_tokens=out_tok,
        input_tokens=sum(t.input_len for t in done),
        duration_s=duration_s,
        ttft_ms=st["ttft"]["median"],
        tpot_ms=st["tpot"]["median"],
        itl_ms={
            "p50": st["itl"]["median"],
            "p90": st["itl"]["p90"],
            "p99": st["itl"]["p99"],
            "mean": st["itl"]["mean"],
        },
        e2e_ms=st["e2e"]["median"],
        itl_p50_ms=st["itl"]["median"],
        itl_p90_ms=st["itl"]["p90"],
        itl_p99_ms=st["itl"]["p99"],
        throughput_tok_s=(out_tok / duration_s) if duration_s > 0 and done else None,
        request_throughput=(len(done) / duration_s) if duration_s > 0 and done else None,
        stats_ms=st,
        errors=sorted({t.error for t in failed})[:5],
        per_request=[
            {
                "index": t.index,
                "ok": t.ok,
                "output_tokens": t.output_tokens,
                "ttft_ms": t.ttft_s * 1e3,
                "latency_ms": t.latency_s * 1e3,
                "tpot_ms": None if t.tpot_s is None else t.tpot_s * 1e3,
                "error": t.error or None,
            }
            for t in timings
        ],
        server=dict(server or {}),
    )


def measure(
    client,
    *,
    input_len: int = 256,
    output_len: int = 128,
    concurrency: int = 1,
    num_requests: int = 8,
    warmup: int = 2,
    seed: int = 0,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    timeout: Optional[float] = None,
    on_request: Optional[Callable[[RequestTiming], None]] = None,
    server_info: Optional[dict] = None,
    ids: Optional[tuple[int, int]] = None,
) -> BenchResult:
    """Warm up with ``warmup`` requests (not counted), then send ``num_requests`` streamed requests
    of ``input_len`` fixed prompt tokens and ``output_len`` generated tokens (ignore_eos), keeping
    ``concurrency`` in flight. Same ``seed`` -> same prompts, so before/after runs compare. Prompt
    ids come from ``ids`` ([lo, hi): :func:`perfscope.bench.vocab.token_ids`), else ids every
    tokenizer has.

    Raises :class:`RemoteError` when no request completes."""
    if output_len < 2:
        raise PerfscopeError("output_len must be at least 2 (TPOT needs two tokens)")
    info = server_info
    if info is None:
        try:
            info = client.server_info()
        except PerfscopeError:
            info = {}
    return measure_until(
        client,
        None,
        input_len=input_len,
        output_len=output_len,
        concurrency=concurrency,
        num_requests=num_requests,
        max_requests=num_requests,
        warmup=warmup,
        seed=seed,
        temperature=temperature,
        ignore_eos=ignore_eos,
        timeout=timeout,
        on_request=on_request,
        server_info=info,
        ids=ids,
    )


def measure_until(
    client,
    enough: Optional[Callable[[list[float]], bool]],
    *,
    input_len: int = 256,
    output_len: int = 128,
    concurrency: int = 1,
    num_requests: int = 8,
    max_requests: int = 8,
    warmup: int = 2,
    seed: int = 0,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    timeout: Optional[float] = None,
    on_request: Optional[Callable[[RequestTiming], None]] = None,
    server_info: Optional[dict] = None,
    ids: Optional[tuple[int, int]] = None,
) -> BenchResult:
    """:func:`measure` in rounds of ``num_requests``: after each round ``enough(tpots_ms)`` (every
    completed request's TPOT so far) says whether to stop; at most ``max_requests`` in all. Round
    ``i`` sends the prompts of seed ``seed + i`` (two sides measured this way send the same
    prompts round by round). ``enough=None``: one round."""
    if output_len < 2:
        raise PerfscopeError("output_len must be at least 2 (TPOT needs two tokens)")
    info = server_info or {}
    ids = id_range(ids)
    if warmup > 0:
        warm = make_prompts(warmup, input_len, seed + 1_000_003, ids)
        drive_decode(
            client,
            min(concurrency, warmup),
            input_len,
            output_len,
            num_requests=warmup,
            prompts=warm,
            temperature=temperature,
            ignore_eos=ignore_eos,
            timeout=timeout,
        )
    t0 = time.perf_counter()
    res: list[RequestTiming] = []
    sent, rnd = 0, 0
    max_requests = max(max_requests, num_requests)
    while sent < max_requests:
        n = min(num_requests, max_requests - sent)
        prompts = make_prompts(n, input_len, seed + rnd, ids)
        got = drive_decode(
            client,
            concurrency,
            input_len,
            output_len,
            num_requests=n,
            prompts=prompts,
            temperature=temperature,
            ignore_eos=ignore_eos,
            timeout=timeout,
            on_done=on_request,
        )
        for t in got:
            t.index += sent
        res.extend(got)
        sent += n
        rnd += 1
        if enough is None or enough([t.tpot_s * 1e3 for t in res if t.ok and t.tpot_s is not None]):
            break
    dur = time.perf_counter() - t0
    workload = {
        "input_len": input_len,
        "output_len": output_len,
        "concurrency": concurrency,
        "num_requests": sent,
        "warmup": warmup,
        "seed": seed,
        "temperature": temperature,
        "ignore_eos": ignore_eos,
    }
    if rnd > 1:
        workload["rounds"] = rnd
    server = {
        k: info.get(k)
        for k in (
            "version",
            "model_path",
            "kv_cache_dtype",
            "attention_backend",
            "disable_cuda_graph",
            "max_total_num_tokens",
            "kv_strategy",
        )
        if k in info
    }
    out = summarize(res, dur, workload, server)
    if out.requests == 0:
        raise RemoteError(f"no benchmark request completed: {out.errors[0] if out.errors else 'unknown error'}")
    return out


def drive(
    url: str,
    *,
    concurrency: int = 1,
    input_len: int = 256,
    output_len: int = 256,
    seed: int = 0,
    api_key: Optional[str] = None,
    stop: Optional[threading.Event] = None,
    timeout: float = 30.0,
    num_requests: Optional[int] = None,
    duration_s: Optional[float] = None,
    ids: Optional[tuple[int, int]] = None,
):
    """The load ``perfscope trace`` runs while profiling: :func:`drive_decode` on ``url`` until
    ``stop``; returns a :class:`perfscope.bench.BenchResult` (``to_dict()`` has ``ttft_ms``,
    ``tpot_ms``, ``itl_ms``, ``e2e_ms``, ``requests``, ``output_tokens``, ``throughput_tok_s``,
    ``duration_s``, ``workload``), measured under the profiler."""
    from perfscope.remote.sglang_api import SGLangClient

    client = SGLangClient(url, api_key=api_key, timeout=timeout)
    t0 = time.perf_counter()
    res = drive_decode(
        client,
        concurrency,
        input_len,
        output_len,
        num_requests=num_requests,
        seed=seed,
        stop=stop,
        duration_s=duration_s,
        timeout=timeout,
        ids=ids,
    )
    return summarize(
        res,
        time.perf_counter() - t0,
        workload={
            "concurrency": concurrency,
            "input_len": input_len,
            "output_len": output_len,
            "ignore_eos": True,
            "seed": seed,
            "temperature": 0.0,
        },
    )
