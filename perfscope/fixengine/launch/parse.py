"""The one launch command of a launch file: its kind (shell, systemd, compose) from its name and
content, parsed; refused when there is none, more than one, or a word the shell expands into words
perfscope cannot see."""

from __future__ import annotations

import os
import re

from perfscope.fixengine.launch.compose import parse_compose
from perfscope.fixengine.launch.shell import parse_shell, parse_systemd
from perfscope.fixengine.launch.tokens import LaunchCommand, LaunchParseError, line_of


def kind_of(path: str, text: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith((".service", ".conf")) or re.search(r"^\s*ExecStart\s*=", text, re.M) and "[Service]" in text:
        return "systemd"
    if name.endswith((".yml", ".yaml")) or re.search(r"^\s*(services|version)\s*:", text, re.M):
        return "compose"
    return "shell"


def find_command(path: str, data: bytes) -> LaunchCommand:
    """The one launch command in the file, or LaunchParseError saying why not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LaunchParseError(f"{path} is not UTF-8 text") from None
    if "\r" in text:
        raise LaunchParseError(f"{path} has CR line ends (\\r): perfscope edits LF files only")
    kind = kind_of(path, text)
    cmds = {"shell": parse_shell, "systemd": parse_systemd, "compose": parse_compose}[kind](text)
    if not cmds:
        raise LaunchParseError(f"{path} ({kind}): no sglang / vllm launch command found")
    if len(cmds) > 1:
        where = ", ".join(str(c.line) for c in cmds)
        raise LaunchParseError(
            f"{path} ({kind}): {len(cmds)} launch commands (lines {where}); perfscope edits a file with exactly one"
        )
    _refuse_expanding_words(cmds[0], text)
    return cmds[0]


def _refuse_expanding_words(cmd: LaunchCommand, text: str) -> None:
    """A server argument the shell expands into words perfscope cannot see (``$A`` unquoted,
    ``"$@"``) may hold the very flag a fix sets or removes: refused, except an unquoted variable as
    the value right after a flag (``--model-path $MODEL``)."""
    toks = cmd.tokens
    for i in range(cmd.args_from, len(toks)):
        t = toks[i]
        if not t.expands:
            continue
        prev = toks[i - 1].value if i > cmd.args_from else ""
        if re.match(r"--[A-Za-z0-9][A-Za-z0-9_-]*=[^$]*\$", text[t.start : t.end]) and not t.expands.startswith("$@"):
            continue  # --model-path=$MODEL: a flag's value
        if t.expands.startswith(("$@", "${@")) or not (
            prev.startswith("-") and "=" not in prev and not t.value.startswith("-")
        ):
            raise LaunchParseError(
                f"{text[t.start : t.end]} (line {line_of(text, t.start)}): the shell expands it into "
                "words perfscope cannot see (flags, maybe); write the server's flags out in the file"
            )
