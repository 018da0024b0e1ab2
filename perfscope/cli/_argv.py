"""The command line a run folder records (run.json's ``command``): rebuilt from the parsed options
(:func:`canonical_argv`), with secrets removed (:func:`scrub_argv`)."""

from __future__ import annotations

import re
from urllib.parse import urlparse, urlunparse

import typer

_SECRET_OPT = re.compile(r"^--?(api[-_]?key|admin[-_]?api[-_]?key|token|password|passphrase)(=|$)", re.I)


def scrub_argv(argv: list[str]) -> list[str]:
    """argv for run.json: values of secret-looking options dropped, URL credentials removed.
    (``--api-key-env`` names a variable, not a secret, and is kept.)"""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            out.append("***")
            skip = False
            continue
        m = _SECRET_OPT.match(a)
        if m and not a.lower().startswith("--api-key-env"):
            if m.group(2) == "=":
                out.append(a.split("=", 1)[0] + "=***")
            else:
                out.append(a)
                skip = True
            continue
        if "://" in a and "@" in a:
            u = urlparse(a)
            if u.username or u.password:
                a = urlunparse(u._replace(netloc=(u.hostname or "") + (f":{u.port}" if u.port else "")))
        out.append(a)
    return out


def canonical_argv(ctx: typer.Context | None, name: str) -> list[str]:
    """What ``perfscope NAME`` was run with, rebuilt from the parsed options (so it is the same from a shell or a test,
    and holds no secret: the API key is only ever named by --api-key-env)."""
    argv = ["perfscope", name]
    if ctx is None:
        return argv
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if v is None or v == p.default or (isinstance(v, (list, tuple)) and not v):
            continue
        flag = max(p.opts, key=len)
        if isinstance(v, bool):
            argv.append(flag)
        elif isinstance(v, (list, tuple)):
            for x in v:
                argv += [flag, str(x)]
        else:
            argv += [flag, str(v)]
    return argv
