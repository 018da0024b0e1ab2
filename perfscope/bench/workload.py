"""The decode load: streamed /generate requests with fixed prompts, timed per frame.

One implementation serves ``perfscope trace`` (load while the profiler records: :func:`perfscope.bench.core.drive`),
``perfscope bench`` and the fix verification (:func:`perfscope.bench.measure`), so before/after
numbers are measured the same way.

Per request, from client-side stream timestamps (field-facts §1; SGLang's ``bench_serving``):
TTFT = first frame carrying a token - request sent; each later frame adds one ITL (the gap since
the previous frame); latency = last frame - sent; TPOT = (latency - TTFT) / (output_tokens - 1).
Tokens are counted from ``meta_info.completion_tokens`` (cumulative), falling back to the length
of ``output_ids``, so cumulative and incremental streaming both count right.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from perfscope.bench.vocab import SAFE_IDS
from perfscope.errors import PerfscopeError, RemoteError, StreamStall

DEFAULT_ID_RANGE = SAFE_IDS  # ids every real tokenizer has (perfscope.bench.vocab)


@dataclass
class RequestTiming:
    index: int
    input_len: int
    ok: bool = False
    error: str = ""
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    start: float = 0.0  # perf_counter at send
    finish_reason: Optional[str] = None
    complete: bool = False  # the stream reached [DONE] (not abandoned by stop)
    stalled: bool = False  # its error: the server sent nothing within the per-line limit (errors.StreamStall)

    @property
    def tpot_s(self) -> Optional[float]:
        if self.output_tokens > 1:
            return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tpot_s"] = self.tpot_s
        return d


def id_range(ids: Optional[tuple[int, int]] = None) -> tuple[int, int]:
    """The prompt ids to draw from: ``ids`` (from :func:`perfscope.bench.vocab.token_ids`, which
    reads the model's config where it can), else ids every real tokenizer has. No server API says
    the vocabulary size (SGLang's /server_info and /model_info, vLLM's /v1/models), and an id past
    it crashes a real server."""
    return (ids[0], ids[1]) if ids else DEFAULT_ID_RANGE


def make_prompts(n: int, input_len: int, seed: int = 0, ids: tuple[int, int] = DEFAULT_ID_RANGE) -> list[list[int]]:
    """``n`` fixed prompts of exactly ``input_len`` token ids (same seed -> same prompts)."""
    rng = random.Random(seed)
    lo, hi = ids
    return [[rng.randrange(lo, hi) for _ in range(input_len)] for _ in range(n)]


def payload(input_ids: list[int], output_len: int, temperature: float = 0.0, ignore_eos: bool = True) -> dict:
    return {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": output_len, "temperature": temperature, "ignore_eos": ignore_eos},
    }


def stream_one(
    client,
    input_ids: list[int],
    output_len: int,
    *,
    index: int = 0,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    timeout: Optional[float] = None,
    stop: Optional[threading.Event] = None,
) -> RequestTiming:
    """Send one streamed /generate and time it. Errors are recorded, not raised (a load run
    reports how many requests failed)."""
    rt = RequestTiming(index=index, input_len=len(input_ids))
    rt.start = t0 = time.perf_counter()
    prev = None
    tokens = 0
    try:
        for fr in client.generate_stream(
            payload(input_ids, output_len, temperature, ignore_eos), timeout=timeout, stop=stop
        ):
            meta = fr.data.get("meta_info") or {}
            n = meta.get("completion_tokens")
            if not isinstance(n, int):
                ids = fr.data.get("output_ids")
                n = tokens + (len(ids) if isinstance(ids, list) else 1)
            if n <= tokens:  # a frame with no new token (e.g. a final summary): no ITL
                if meta.get("finish_reason"):
                    rt.finish_reason = _reason(meta["finish_reason"])
                continue
            if prev is None:
                rt.ttft_s = fr.t - t0
            else:
                rt.itl_s.append(fr.t - prev)
            prev = fr.t
            tokens = n
            if meta.get("finish_reason"):
                rt.finish_reason = _reason(meta["finish_reason"])
        else:
            rt.complete = not (stop is not None and stop.is_set())
    except PerfscopeError as e:
        rt.error = str(e)
        rt.stalled = isinstance(e, StreamStall)
    except Exception as e:  # noqa: BLE001 - any failure of one request is data, not a crash
        rt.error = f"{type(e).__name__}: {e}"
    rt.output_tokens = tokens
    if prev is not None:
        rt.latency_s = prev - t0
    rt.ok = rt.complete and not rt.error and tokens > 0
    return rt


def _reason(fr) -> str:
    return fr.get("type", str(fr)) if isinstance(fr, dict) else str(fr)


def drive_decode(
    client,
    concurrency: int = 1,
    input_len: int = 256,
    output_len: int = 256,
    *,
    num_requests: Optional[int] = None,
    seed: int = 0,
    stop: Optional[threading.Event] = None,
    duration_s: Optional[float] = None,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    timeout: Optional[float] = None,
    prompts: Optional[list[list[int]]] = None,
    on_done: Optional[Callable[[RequestTiming], None]] = None,
    max_consecutive_errors: int = 3,
    ids: Optional[tuple[int, int]] = None,
    stall_expected: Optional[Callable[[], bool]] = None,
) -> list[RequestTiming]:
    """Keep ``concurrency`` streams busy: each worker sends the next request as its previous one
    ends, until ``num_requests`` were sent, ``stop`` is set, or ``duration_s`` passed (any that is
    given; with none of them, until ``stop``). Prompts are fixed by ``seed``, their token ids drawn
    from ``ids`` ([lo, hi); default: ids every tokenizer has). Returns the timing of
    every request, in send order; requests cut by ``stop`` have ``complete=False``.

    Raises :class:`RemoteError` when the first requests all fail (server down, bad key): a load
    that never ran must not look like a measurement. A request that stalled (no stream line within
    ``timeout``) while ``stall_expected()`` is true is recorded and does not count towards that: the
    server is busy, not failing (an engine writing its profile streams nothing meanwhile)."""
    if concurrency < 1 or input_len < 1 or output_len < 1:
        raise ValueError("concurrency, input_len and output_len must be >= 1")
    if num_requests is None and stop is None and duration_s is None:
        raise ValueError("give num_requests, stop or duration_s")
    stop = stop or threading.Event()
    if prompts is None:
        pool = num_requests if num_requests is not None else max(64, concurrency * 4)
        prompts = make_prompts(min(pool, 4096), input_len, seed, id_range(ids))
    deadline = None if duration_s is None else time.monotonic() + duration_s
    lock = threading.Lock()
    counter = [0]
    results: list[RequestTiming] = []
    errors = [0]
    fatal: list[str] = []

    def next_index() -> Optional[int]:
        with lock:
            if stop.is_set() or fatal:
                return None
            if num_requests is not None and counter[0] >= num_requests:
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return None
            i = counter[0]
            counter[0] += 1
            return i

    def worker() -> None:
        while True:
            i = next_index()
            if i is None:
                return
            rt = stream_one(
                client,
                prompts[i % len(prompts)],
                output_len,
                index=i,
                temperature=temperature,
                ignore_eos=ignore_eos,
                timeout=timeout,
                stop=stop,
            )
            with lock:
                results.append(rt)
                if (
                    rt.error
                    and not stop.is_set()
                    and not (rt.stalled and stall_expected is not None and stall_expected())
                ):
                    errors[0] += 1
                    if errors[0] >= max_consecutive_errors and not any(r.ok for r in results):
                        fatal.append(rt.error)
                elif rt.ok:
                    errors[0] = 0
            if on_done is not None:
                on_done(rt)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="perfscope-load") as ex:
        for f in [ex.submit(worker) for _ in range(concurrency)]:
            f.result()
    if fatal:
        raise RemoteError(f"the load's requests fail: {fatal[0]}")
    results.sort(key=lambda r: r.index)
    return results
