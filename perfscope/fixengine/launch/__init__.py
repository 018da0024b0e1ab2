"""The server's launch command in a launch file, read as tokens and edited in place.

Three kinds of file are understood (``kind_of`` picks one from the name and the content):

* ``shell``: a shell script; the launch command is the one simple command (after ``VAR=x``
  assignments and ``exec`` / ``nohup`` / ``env`` / ``setsid`` / ``numactl ...`` style wrappers) that
  runs ``python -m sglang.launch_server``, ``sglang serve``, ``vllm serve``,
  ``python -m vllm.entrypoints.openai.api_server`` or perfscope's ``examples.repro_server``. Line
  continuations (``\\`` at a line's end), comments, quoting and ``$VARS`` are kept as written;
  the command ends at its first operator (``&``, ``>``, ``|``, ``;`` ...);
* ``systemd``: a unit's ``ExecStart=`` (prefixes ``-@:+!`` kept, continuations too);
* ``compose``: a compose/YAML ``command:`` given as a one-line string (plain or simply quoted),
  a flow list (``["python3", "-m", ...]``) or a block list (``- item`` lines).

The command is tokenized with positions and checked against :func:`shlex.split` of the same text:
what does not split exactly the same way (command substitution, a continuation inside a word, a
``#`` inside a systemd command, a YAML block scalar, escapes in a quoted YAML string...) is refused
with one line, never edited by guess. Edits change only the bytes of the flag tokens they touch;
everything else in the file is kept byte for byte.

One job a module: ``tokens`` (the words and their spans, checked against shlex), ``engines`` (which
server a command runs), ``shell`` and ``compose`` (the commands in each kind of file), ``parse`` (the
one command of a file), ``edit`` (flag edits and the argv they must give), ``process`` (the command
line of the process serving a port).
"""

from __future__ import annotations

from perfscope.fixengine.launch.compose import parse_compose
from perfscope.fixengine.launch.edit import FlagChange, Occurrence, edit_flags, expected_argv, flag_value, occurrences
from perfscope.fixengine.launch.engines import find_engine
from perfscope.fixengine.launch.parse import find_command, kind_of
from perfscope.fixengine.launch.process import ServerCommandLine, server_command_line
from perfscope.fixengine.launch.shell import parse_shell, parse_systemd
from perfscope.fixengine.launch.tokens import LaunchCommand, LaunchParseError, Token

__all__ = [
    "FlagChange",
    "LaunchCommand",
    "LaunchParseError",
    "Occurrence",
    "ServerCommandLine",
    "Token",
    "edit_flags",
    "expected_argv",
    "find_command",
    "find_engine",
    "flag_value",
    "kind_of",
    "occurrences",
    "parse_compose",
    "parse_shell",
    "parse_systemd",
    "server_command_line",
]
