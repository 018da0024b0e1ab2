"""The decode load ``perfscope trace`` drives while the profiler runs: ``concurrency`` streams in a
background thread, counting streamed tokens (vLLM's profile has no num_steps), stopped once the
traces are complete, and summarised as ``perfscope bench`` summarises."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from perfscope.capture.options import TraceOptions

if TYPE_CHECKING:
    from perfscope.remote.sglang_api import SGLangClient


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


class TraceLoad:
    """Decode load in a background thread until ``stop()``: ``concurrency`` streams of
    ``output_len`` tokens with ignore_eos, new requests as old ones end (the workload driver's
    ``drive_decode``; summarised as ``perfscope bench`` summarises)."""

    def __init__(self, client: SGLangClient, opts: TraceOptions, ids: tuple[int, int] | None = None):
        self.client, self.opts, self.ids = client, opts, ids  # the engine's client (thread-safe)
        self.stop_event = threading.Event()
        self.results: list | None = None
        self.tokens = 0  # streamed tokens, all streams together
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.t0 = self.t1 = 0.0
        # the profile's own steps are past once every stream could have had steps + 1 tokens (a forward
        # step gives each running stream at most one); the engine may then stall while it writes its
        # profile, or once /stop_profile was sent (vLLM)
        self.profile_tokens = (opts.steps + 1) * opts.concurrency
        self.stop_sent = False
        self.thread = threading.Thread(target=self._run, name="perfscope-load", daemon=True)

    def writing(self) -> bool:
        """Whether the engine may be writing its profile now (its steps are past, or it was told to stop):
        a stream that stalls then is the engine busy, not a failed load."""
        return self.stop_sent or self.tokens >= self.profile_tokens

    def _token(self) -> None:
        with self._lock:
            self.tokens += 1

    def _run(self) -> None:
        from perfscope.bench import workload

        client = _Counting(self.client, self._token)
        self.t0 = time.perf_counter()
        try:
            self.results = workload.drive_decode(
                client,
                self.opts.concurrency,
                self.opts.input_len,
                self.opts.output_len,
                seed=self.opts.seed,
                stop=self.stop_event,
                timeout=self.opts.http_timeout,
                ids=self.ids,
                stall_expected=self.writing,
            )
        except BaseException as e:  # reported by the waiter
            self.error = e
        finally:
            self.t1 = time.perf_counter()

    def start(self) -> "TraceLoad":
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
        timings = {
            k: r[k]
            for k in (
                "ttft_ms",
                "tpot_ms",
                "itl_ms",
                "itl_p50_ms",
                "itl_p90_ms",
                "itl_p99_ms",
                "stats_ms",
                "tpot_definition",
                "failed",
                "output_tokens",
                "throughput_tok_s",
                "duration_s",
            )
            if k in r
        }
        timings["requests"] = len(whole)
        timings["requests_cut"] = len(cut)
        stalled = sum(1 for t in self.results if t.stalled)
        if stalled:
            timings["requests_stalled"] = stalled
        timings["e2e_ms"] = summarize(whole, 1.0).e2e_ms if whole else None
        if "stats_ms" in timings:
            timings["stats_ms"] = {
                **timings["stats_ms"],
                "e2e": summarize(whole, 1.0).stats_ms["e2e"] if whole else None,
            }
        return {}, timings
