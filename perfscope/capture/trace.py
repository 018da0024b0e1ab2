"""``perfscope trace``: profile live SGLang or vLLM servers and bring their traces home.

One host: :func:`perfscope.capture.host.trace_host` (its steps, each in a module of its own: the
endpoint, the engine's adapter, the load, the waits, the copy back, the cleanup). Several hosts: in
parallel threads here, one run folder each under a multi-host run folder (:mod:`perfscope.rundir`);
a failure or Ctrl-C on one stops every host's profiler.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from perfscope import rundir
from perfscope.capture.endpoint import Endpoint
from perfscope.capture.host import HostResult, Log, trace_host
from perfscope.capture.options import TraceOptions
from perfscope.errors import PerfscopeError
from perfscope.util.files import user_path

__all__ = ["Endpoint", "HostResult", "TraceOptions", "host_dirname", "trace", "trace_host"]


# ------------------------------------------------------------------------------- several hosts


def host_dirname(label: str, taken: set[str]) -> str:
    """A subfolder name for the host ``label``, not in ``taken`` (which it joins): its host name, made safe."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", label.split("@")[-1]).strip("._") or "host"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    taken.add(name)
    return name


def trace(
    endpoints: list[Endpoint],
    opts: TraceOptions,
    out_dir: Path,
    *,
    command: list[str],
    log: Log = print,
    progress: Any = None,
) -> list[HostResult]:
    """Trace one or several servers. One host: ``out_dir`` is its run folder. Several: in
    parallel threads, ``out_dir/<host>/`` each, plus ``out_dir/run.json`` listing them. Ctrl-C
    stops every host's profiler before it returns."""
    out_dir = user_path(out_dir)  # relative paths are joined onto below: resolve once
    if len(endpoints) == 1:
        return [trace_host(endpoints[0], opts, out_dir, command=command, log=log, progress=progress)]
    cancel = threading.Event()
    taken: set[str] = set()
    dirs = [host_dirname(ep.label, taken) for ep in endpoints]
    results: list[HostResult | None] = [None] * len(endpoints)
    errors: list[tuple[str, BaseException]] = []
    with ThreadPoolExecutor(max_workers=len(endpoints), thread_name_prefix="perfscope-host") as pool:
        futs = [
            pool.submit(trace_host, ep, opts, out_dir / d, command=command, log=log, progress=progress, cancel=cancel)
            for ep, d in zip(endpoints, dirs)
        ]
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
    if errors or any(isinstance(f.exception(), KeyboardInterrupt) for f in futs):
        with contextlib.suppress(BaseException):
            rundir.mark_incomplete(
                out_dir,
                reason=str(errors[0][1]) if errors else "interrupted",
                command=command,
                engine=opts.engine,
                host=None,
            )
    if errors:
        label, e = errors[0]
        if isinstance(e, PerfscopeError):
            err = Exception.__new__(type(e))  # the same class (exit code) and fields, the host named first
            err.__dict__.update(e.__dict__)
            err.message = f"{label}: {e.message}" if label not in e.message else e.message
            err.args = (err.message,)
            raise err from None
        raise e
    done = [r for r in results if r is not None]
    all_files, all_remote = [], []
    for d, r in zip(dirs, done):
        for fe in r.files:
            all_files.append({**fe, "path": f"{d}/{fe['path']}"})
        for fe in r.remote_files:
            all_remote.append({**fe, "path": f"{d}/{fe['path']}"})
    rundir.write_run(
        out_dir,
        command=command,
        kind="multi",
        engine=opts.engine,
        host=done[0].label,
        hosts=[r.label for r in done],
        files=all_files,
        members=[{"host": r.label, "dir": d} for d, r in zip(dirs, done)],
        extra={"remote_files": all_remote, "analysis": {"where": "host", "status": "done"}} if all_remote else None,
    )
    return done
