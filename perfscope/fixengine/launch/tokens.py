"""The launch command's words with their spans in the file: the tokenizer of shell (and systemd)
text, checked against :func:`shlex.split` of the same text; what it does not read exactly is a
:class:`LaunchParseError` (one line), never a guess."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Optional


class LaunchParseError(ValueError):
    """The launch file cannot be read exactly: refuse (one line)."""


@dataclass
class Token:
    value: str  # after quote removal (what the program sees in argv)
    start: int  # offsets in the file's text (str), [start, end)
    end: int
    quote: str = ""  # compose lists: the YAML quote around the item ('' plain)
    expands: str = ""  # the shell expansion that can split this word into other words ("$A", "$@")


@dataclass
class LaunchCommand:
    kind: str  # shell | systemd | compose-string | compose-flow | compose-block
    engine: str  # sglang | vllm | repro
    tokens: list[Token]  # the whole command (wrappers included)
    args_from: int  # index in tokens of the first server argument
    line: int  # line number (from 1) where the command starts
    container_quote: str = ""  # compose-string: the YAML quote around the string
    block_indent: str = ""  # compose-block: "    - " prefix of the items
    newline: str = "\n"

    @property
    def args(self) -> list[Token]:
        return self.tokens[self.args_from :]

    @property
    def argv(self) -> list[str]:
        return [t.value for t in self.tokens]

    def text(self) -> str:
        return " ".join(shlex.quote(v) for v in self.argv)


OPS = set(";&|<>()")
_EXPANSION = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*|\{[^}]*\}|[@*#?$!0-9-])")


def tokenize_shell(text: str, a: int, b: int, *, systemd: bool = False) -> tuple[list[Token], Optional[int]]:
    """Words of the shell text [a, b) with their spans. Stops at the first operator outside quotes
    (returns its offset) or at a comment. Raises LaunchParseError for what it does not read exactly."""
    toks: list[Token] = []
    i = a
    while i < b:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        if c == "\\" and i + 1 < b and text[i + 1] == "\n":
            i += 2
            continue
        if c == "\n":
            return toks, i
        if c == "#":
            if systemd:
                raise LaunchParseError("a '#' inside ExecStart= (systemd does not read it as a comment)")
            return toks, i
        if c in OPS and not systemd:
            return toks, i
        start = i
        val = []
        expands = ""
        while i < b:
            c = text[i]
            if c in " \t\n":
                break
            if c in OPS and not systemd:
                break
            if c == "\\":
                if i + 1 >= b:
                    raise LaunchParseError("a backslash at the end of the file")
                if text[i + 1] == "\n":
                    raise LaunchParseError(f"a line continuation inside a word (line {text.count(chr(10), 0, i) + 1})")
                val.append(text[i + 1])
                i += 2
                continue
            if c == "'":
                j = text.find("'", i + 1, b)
                if j < 0:
                    raise LaunchParseError(f"an unclosed ' (line {text.count(chr(10), 0, i) + 1})")
                val.append(text[i + 1 : j])
                i = j + 1
                continue
            if c == '"':
                j = i + 1
                while j < b and text[j] != '"':
                    if text[j] == "\\" and j + 1 < b:
                        if text[j + 1] == "\n":
                            raise LaunchParseError("a line continuation inside a quoted word")
                        val.append(text[j + 1] if text[j + 1] in '$`"\\' else text[j : j + 2])
                        j += 2
                        continue
                    if text[j] == "`" or text.startswith("$(", j):
                        raise LaunchParseError("command substitution in the launch command")
                    if text.startswith(("$@", "${@"), j):
                        expands = expands or text[j : j + 2]  # "$@" is one word per argument
                    val.append(text[j])
                    j += 1
                if j >= b:
                    raise LaunchParseError(f'an unclosed " (line {text.count(chr(10), 0, i) + 1})')
                i = j + 1
                continue
            if c == "`" or text.startswith("$(", i):
                raise LaunchParseError("command substitution in the launch command")
            if c == "$" and not expands:
                m = _EXPANSION.match(text, i, b)
                if m:
                    expands = m.group(0)  # unquoted: split into words (flags, maybe) when it runs
            val.append(c)
            i += 1
        if i < b and text[i] in "<>" and not systemd and text[start:i].isdigit():
            return toks, i  # `2>&1`: a redirection's file descriptor, not a word
        toks.append(Token("".join(val), start, i, expands=expands))
    return toks, None


def check_shlex(text: str, toks: list[Token]) -> None:
    """The tokens must be what shlex reads from the same text (continuations as blanks)."""
    if not toks:
        return
    region = text[toks[0].start : toks[-1].end].replace("\\\n", "  ")
    try:
        ref = shlex.split(region, comments=False, posix=True)
    except ValueError as e:
        raise LaunchParseError(f"shlex cannot split the launch command ({e})") from None
    if ref != [t.value for t in toks]:
        raise LaunchParseError(
            "the launch command does not split into the same words with shlex (quoting perfscope does not read exactly)"
        )


def line_of(text: str, off: int) -> int:
    return text.count("\n", 0, off) + 1
