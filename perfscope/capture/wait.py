"""How ``perfscope trace`` knows a profile is done: how many files to expect, and the bounded waits
for vLLM's decode steps and for every rank's trace file to be complete on the host."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from perfscope.capture.load import TraceLoad
from perfscope.capture.options import TraceOptions
from perfscope.errors import PerfscopeError, RemoteError

if TYPE_CHECKING:
    from perfscope.remote.hostio import HostIO


def expected_files(info: dict, by_stage: bool) -> int:
    """Trace files one profile writes: one per scheduler process (x2 with by-stage), on this node."""

    def num(k, d=1):
        try:
            return min(max(int(info.get(k) or d), 1), 1 << 16)
        except (TypeError, ValueError, OverflowError):
            return d

    n = num("tp_size") * num("pp_size")
    if num("dp_size") > 1 and not info.get("enable_dp_attention"):
        n *= num("dp_size")
    n = max(n // num("nnodes"), 1)
    return n * (2 if by_stage else 1)


def wait_vllm_steps(load: TraceLoad, opts: TraceOptions, cancel: threading.Event, label: str) -> int:
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
            raise RemoteError(
                f"the server on {label} streamed {got} of {want} tokens within {opts.timeout:g}s "
                "while profiling; the profiler was stopped",
                hint="is the server processing requests? raise --timeout for slow servers",
            )
        time.sleep(0.02)


def wait_complete(
    io: HostIO,
    folder: str,
    expected: int,
    baseline: set[str],
    opts: TraceOptions,
    load: TraceLoad | None,
    cancel: threading.Event,
    label: str,
    say,
) -> list:
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
