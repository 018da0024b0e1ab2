"""The command line of the server process on a port, as ``/proc`` shows it on the host."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Optional

from perfscope.fixengine.host import FixHost


@dataclass
class ServerCommandLine:
    """The command line of the process serving a port, as /proc shows it."""

    pid: Optional[int] = None
    argv: list = field(default_factory=list)

    def text(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


def server_command_line(host: FixHost, port: int) -> ServerCommandLine:
    """The argv of the process listening on ``port`` on ``host`` (a FixHost), if visible."""
    try:
        proc = host.io.server_process(port) if port else {}
    except Exception:  # a probe that cannot run says nothing
        return ServerCommandLine()
    pid = proc.get("pid")
    if not pid:
        return ServerCommandLine()
    r = host.run(["sh", "-c", 'cat "/proc/$1/cmdline" | tr "\\0" "\\n"', "sh", str(pid)], timeout=20)
    argv = [a for a in (r.stdout or "").split("\n") if a] if r.rc == 0 else []
    return ServerCommandLine(pid, argv)
