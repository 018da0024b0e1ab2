"""The one fix command every renderer prints for a finding (terminal, Markdown, HTML, ``--json``):
the command that works from where the user is.

``perfscope fix ID``, aimed at the server the trace came from when its run folder says (``--host``
as ``perfscope trace`` recorded it; ``--port`` when not SGLang's 30000), and reading the trace it
was diagnosed from (``--trace``) when there was one input. A trace with no recorded host (a bare
trace file or profile folder, or a run of ``trace --url``) gets :func:`where`: what to add, or
where to run it, for the command to reach the server.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional, Sequence


def _run(d) -> dict:
    return getattr(d, "run", None) or {}


def command(d, f: dict) -> Optional[str]:
    """The check command (diff, nothing changed) of finding ``f`` of diagnosis ``d``; None when
    the finding has no fix module."""
    if not f.get("fix"):
        return None
    run = _run(d)
    cmd = f"perfscope fix {f['fix']}"
    host = run.get("host")
    if host:
        cmd += f" --host {shlex.quote(str(host))}"
        port = (run.get("server_info") or {}).get("port")
        if isinstance(port, int) and not isinstance(port, bool) and port != 30000:
            cmd += f" --port {port}"
    if f.get("fix_trace"):
        cmd += f" --trace {shlex.quote(str(f['fix_trace']))}"
    return cmd


def where(d, short: bool = False) -> Optional[str]:
    """What the command needs to reach the server when the trace does not say where it runs
    (``short``: one line of a terminal panel)."""
    run = _run(d)
    if run.get("host"):
        return None
    if short:
        return "no host recorded: add --host HOST, or run it on the server's machine"
    if run.get("url"):
        return (f"the trace was taken through {run['url']}: run the command on that server's machine, or add "
                "--host HOST to reach it over SSH")
    return ("this trace does not say where its server runs: run the command on the server's machine, or add "
            "--host HOST (its SSH name; --port PORT when not 30000) to reach it over SSH")


def point_at(d, paths: Sequence[Path]) -> None:
    """Set every finding's ``fix_command`` (and ``fix_where``) as :func:`command` / :func:`where`
    say, reading the one input given (``--trace``); what ``--json`` and the HTML then carry."""
    trace = str(paths[0]) if len(paths) == 1 else None
    hint = where(d)
    for r in d.ranks:
        for f in r.findings:
            if not f.get("fix"):
                continue
            if trace:
                f["fix_trace"] = trace
            f["fix_command"] = command(d, f)
            f["fix_where"] = hint
