"""What ``perfscope trace`` does when a trace will not finish (error, timeout, SIGINT/TERM/HUP): stop
the profiler it armed, stop the load, remove the folder it made on the host, and mark the run folder
incomplete. Never raises over the error being reported."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Callable, ContextManager, Iterable

from perfscope import rundir
from perfscope.capture.load import TraceLoad
from perfscope.errors import Interrupted, RemoteError
from perfscope.remote.hostio import HostIO
from perfscope.remote.sglang_api import HTTPStatusError, SGLangClient

Say = Callable[[str], None]


def is_not_running(err: BaseException) -> bool:
    """A /stop_profile refusal meaning no profile runs (nothing left to stop). SGLang 0.5.x answers
    a bare HTTP 500 'Internal Server Error' (its log: 'Profiling is not in progress'), e.g. after
    a num_steps profile stopped by itself; older servers and the emulator say so in the body."""
    if (
        isinstance(err, HTTPStatusError)
        and err.status == 500
        and err.body.strip().lower() in ("internal server error", "")
    ):
        return True
    return bool(re.search(r"not in progress|no profil|not running|not started", str(err), re.I))


def stop_quietly(api: SGLangClient, say: Say, timeout: float | None = None, warn: bool = True) -> str:
    """/stop_profile, waiting at most ``timeout`` s for the reply (the server stops profiling when
    the request arrives; writing the traces may go on after that). Returns "" when the server
    answered (stopped, or nothing was running), else the error (said unless ``warn`` is False)."""
    try:
        api.stop_profile(request_timeout=timeout)
        say("profiler stopped")
        return ""
    except Exception as e:  # 'no profile running' is fine; anything else is reported, not raised
        if is_not_running(e):
            return ""
        if warn:
            say(f"warning: /stop_profile failed: {e}")
        return str(e) or type(e).__name__


def server_gone(io: HostIO, api: SGLangClient, pid: int | None, wait_s: float = 10.0) -> str | None:
    """Why the server is gone after a profile failed: "its process (pid N) is gone", or "/health fails"
    when it still does not answer after ``wait_s``; None when it answers /health (or the SSH connection
    itself is what failed: then nothing is known of the server)."""
    if not io.alive():
        return None
    deadline = time.monotonic() + wait_s
    while True:
        if pid is not None and not _running(io, int(pid)):
            return f"its process (pid {pid}) is gone"
        if _answers(api):
            return None
        if time.monotonic() > deadline:
            return f"/health fails for {wait_s:g}s"
        time.sleep(0.5)


def _answers(api: SGLangClient) -> bool:
    """Whether the server answers /health: 2xx, or a 4xx of a server without that endpoint (it is there);
    not a refused connection, a timeout or a 5xx (SGLang's when its scheduler is gone)."""
    try:
        api.request("GET", "/health", timeout=3.0)
        return True
    except HTTPStatusError as e:
        return e.status < 500
    except Exception:  # noqa: BLE001 - any other failure: it does not answer
        return False


def _running(io: HostIO, pid: int) -> bool:
    """Whether process ``pid`` runs on the host (a zombie, dead but not yet reaped, does not)."""
    r = io.run(["cat", f"/proc/{pid}/stat"], timeout=20)
    return r.ok and r.stdout.rpartition(")")[2].split()[:1] not in ([], ["Z"], ["X"])


def died(label: str, why: str, engine: str) -> RemoteError:
    """The one line ``trace`` ends with when the server died or stopped answering during the profile."""
    retry = (
        "restart the server and retry; if it dies again, retry with --no-by-stage (one profile, not two "
        "back to back), or with --no-stack where its log shows the crash in torch's Python stack tracer"
        if engine == "sglang"
        else "restart the server and retry; if it dies again, with --profiler-config.torch_profiler_with_stack=false "
        "where its log shows the crash in torch's Python stack tracer"
    )
    return RemoteError(
        f"the server on {label} stopped during the profile ({why}): its torch profiler most likely crashed it "
        "(torch's profiler has known segfaults; the server's log shows it); nothing was traced",
        hint=retry,
    )


def reason(err: BaseException) -> str:
    """Why the run folder is incomplete, in one line."""
    if isinstance(err, Interrupted):
        import signal as _signal

        return f"interrupted by {_signal.Signals(err.signum).name}"
    if isinstance(err, KeyboardInterrupt):
        return "interrupted"
    return str(err) or type(err).__name__


def abandon(
    io: HostIO,
    api: SGLangClient,
    say: Say,
    out_dir: Path,
    remote_dir: str | None,
    armed: bool,
    err: BaseException,
    *,
    load: TraceLoad | None = None,
    command: Iterable[str] = (),
    engine: str = "sglang",
    host: str | None = None,
    stop_timeout: float = 600.0,
    reconnect: Callable[[], ContextManager[tuple[HostIO, str]]] | None = None,
    make_api: Callable[[str], SGLangClient] | None = None,
) -> None:
    """A trace that will not finish: stop the profiler if it is (or may be) ``armed``, stop the load,
    remove ``remote_dir`` (the folder perfscope made on the host, None for the engine's own), and
    leave the run folder with a run.json that says it is incomplete. Never raises. ``reconnect``
    (SSH): a context manager giving a fresh (io, url), used when the first connection died."""
    wait = max(5.0, min(600.0, stop_timeout))
    try:
        if load is not None:
            load.stop(wait=5)
        dead = reconnect is not None and not io.alive()
        if armed and not dead:
            failed = stop_quietly(api, say, timeout=wait, warn=False)
            dead = bool(failed) and reconnect is not None and not io.alive()
            if failed and not dead:
                say(f"warning: /stop_profile failed: {failed}")
        if (
            dead and reconnect is not None
        ):  # the SSH connection died: a fresh one stops the profiler, removes the folder
            say("the SSH connection is gone: stopping the profiler over a fresh one")
            with reconnect() as (io, url):
                if armed and make_api is not None:
                    stop_quietly(make_api(url), say, timeout=wait)
                if remote_dir:
                    io.discard_dir(remote_dir)
        elif remote_dir:
            io.discard_dir(remote_dir)
    except BaseException as e:  # noqa: BLE001 - cleanup must not replace the error being reported
        say(f"warning: cleanup after the failure was cut short: {type(e).__name__}")
    with contextlib.suppress(BaseException):
        rundir.mark_incomplete(out_dir, reason=reason(err), command=command, engine=engine, host=host)
