"""Restarting the server a fix changed: ``--restart-cmd CMD`` run on the host, then ``/health`` waited
for (:func:`restart`), and, after a revert, the restart that makes the original take effect
(:func:`after_revert`).

CMD runs with ``sh -c``, its stdin /dev/null and its output in a temporary file on the host (the last
lines are shown when it fails), so a server it leaves running in the background never holds the
command open."""

from __future__ import annotations

import time
from typing import Callable, Optional

from perfscope.errors import InputError, PerfscopeError
from perfscope.fixengine.host import FixHost
from perfscope.fixengine.model import Failed
from perfscope.fixengine.options import RestartOptions
from perfscope.fixengine.request import FixRequest, Report

GRACE_S = 2.0  # after CMD returns, before polling /health: the old process may still answer

# CMD runs in an inner shell whose stdio is a temporary file, not the pipe (local) or SSH channel
# the outer shell's output goes through: a server CMD starts in the background inherits the file,
# so the outer shell (and the caller's read of its output) ends when CMD returns.
_WRAP = (
    "f=$(mktemp 2>/dev/null) || f=/tmp/perfscope-restart.$$; "
    'sh -c "$1" </dev/null >"$f" 2>&1; rc=$?; tail -c 2000 "$f"; rm -f "$f"; exit $rc'
)


def _run_cmd(host: FixHost, cmd: str, timeout: float) -> tuple[bool, str]:
    try:
        r = host.run(["sh", "-c", _WRAP, "perfscope-restart", cmd], timeout=max(1.0, timeout))
    except PerfscopeError as e:  # the command did not return in time, or the host went away
        if "timed out" in str(e):
            return False, f"the restart command did not return within {timeout:g}s"
        return False, f"restart command: {e}"
    if r.rc != 0:
        tail = " ".join((r.stdout or r.stderr or "").strip().splitlines()[-3:])[-300:]
        return False, f"restart command exited {r.rc}" + (f": {tail}" if tail else "")
    return True, ""


def server_pid(host: FixHost, port: Optional[int]) -> Optional[int]:
    """The pid of the process listening on ``port`` on the host, if it can be seen."""
    if not port:
        return None
    try:
        pid = host.io.server_process(port).get("pid")
    except PerfscopeError:
        return None
    return pid if isinstance(pid, int) else None


def restart(
    host: FixHost, cmd: str, client, timeout: float, *, port: Optional[int] = None, old_pid: Optional[int] = None
) -> tuple[bool, str]:
    """Run CMD, then wait for /health; both within ``timeout`` seconds. (ok, why not). With
    ``old_pid`` (the process that served ``port`` before CMD): an answer from that same process is
    no restart (a CMD that failed to stop the old server leaves it answering /health, and the new
    one cannot bind the port), and measuring it would credit the patch with the old code's speed."""
    deadline = time.monotonic() + timeout
    ok, why = _run_cmd(host, cmd, timeout)
    if not ok:
        return False, why
    time.sleep(max(0.0, min(GRACE_S, deadline - time.monotonic())))
    left = deadline - time.monotonic()
    try:
        client.wait_healthy(timeout=max(0.5, left), interval=0.5)
    except PerfscopeError:
        return False, f"no healthy answer on {client.base_url}/health within {timeout:g}s of the restart"
    if old_pid is not None and server_pid(host, port) == old_pid:
        return False, (
            f"the server was not restarted: process {old_pid}, which served port {port} before "
            "the restart command, still serves it (the command did not stop it)"
        )
    return True, ""


def after_revert(
    host: FixHost,
    req: FixRequest,
    rep: Report,
    opts: Optional[RestartOptions],
    *,
    what: str,
    log: Callable[[str], None] = print,
) -> None:
    """After a revert: restart the server with ``opts.cmd`` and wait healthy (the original takes
    effect), or say that the running server still runs what the fix changed (``what``: its kind's
    ``changes``, "code" or "flags")."""
    if opts is None:
        rep.notes.append(
            f"the running server still has the fix's {what} (it was started before this revert): "
            f"restart it, or pass --restart-cmd CMD, for the original {what} to take effect"
        )
        return
    from perfscope.remote.sglang_api import SGLangClient

    if not req.server_url:
        raise InputError(
            "--restart-cmd needs the server's HTTP API to see it healthy again: --url (local) or --host with --port"
        )
    cmd, health_timeout = opts.cmd, opts.health_timeout
    client = SGLangClient(req.server_url, api_key=req.api_key, timeout=60)
    log(f"restarting the server with the original {what}: {cmd} (healthy within {health_timeout:g}s)")
    ok, why = restart(host, cmd, client, health_timeout, port=req.port, old_pid=server_pid(host, req.port))
    rep.extra["restart"] = {"restart_cmd": cmd, "healthy": ok, "why": why or None}
    if ok:
        rep.notes.append(f"the server was restarted ({cmd}) and answers /health: it runs the original {what}")
    else:
        rep.outcome = Failed(
            f"{rep.path} was reverted byte for byte, but the restart failed ({why}): the server "
            f"may still run the fix's {what}, or not run at all: look at it now"
        )
