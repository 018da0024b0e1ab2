"""Remote command lines: every argument shell-quoted, and the result of a run."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence


def quote_argv(argv: Sequence[str] | str) -> str:
    """One shell command line with every argument quoted. A plain ``str`` is taken as already
    written shell (use it only for fixed text, never with user or server input)."""
    if isinstance(argv, str):
        return argv
    return " ".join(shlex.quote(str(a)) for a in argv)


@dataclass
class CommandResult:
    argv: str
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0
