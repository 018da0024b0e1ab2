"""Launch commands in shell scripts and in systemd units' ``ExecStart=``."""

from __future__ import annotations

import re

from perfscope.fixengine.launch.engines import find_engine
from perfscope.fixengine.launch.tokens import OPS, LaunchCommand, LaunchParseError, check_shlex, line_of, tokenize_shell


def _logical_lines(text: str) -> list[tuple[int, int]]:
    """[start, end) of each logical shell line (continuations joined; end excludes the newline)."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        j = i
        while True:
            k = text.find("\n", j)
            if k < 0:
                k = n
                break
            # an odd run of backslashes before the newline continues the line
            m = k
            while m > i and text[m - 1] == "\\":
                m -= 1
            if (k - m) % 2 == 1 and not _in_comment(text, i, k):
                j = k + 1
                continue
            break
        out.append((i, k))
        i = k + 1
    return out


def _in_comment(text: str, a: int, k: int) -> bool:
    """Whether a '#' starts a comment on the physical line holding offset k (a rough look: a '#'
    at a word start outside quotes)."""
    ls = text.rfind("\n", 0, k) + 1
    line = text[ls:k]
    q = None
    for idx, c in enumerate(line):
        if q:
            if c == q:
                q = None
            continue
        if c in "'\"":
            q = c
        elif c == "#" and (idx == 0 or line[idx - 1] in " \t"):
            return True
    return False


def _shell_commands(text: str, a: int, b: int, line_hint: int) -> list[LaunchCommand]:
    """Launch commands in one logical shell line [a, b)."""
    out = []
    i = a
    while i < b:
        toks, stop = tokenize_shell(text, i, b)
        if toks:
            eng = find_engine([t.value for t in toks])
            if eng:
                check_shlex(text, toks)
                out.append(LaunchCommand("shell", eng[0], toks, eng[1], line_of(text, toks[0].start)))
        if stop is None:
            break
        if text[stop] == "#" or text[stop] == "\n":
            break
        # skip the operator(s) and the words of redirections (`> log`, `2>&1`)
        j = stop
        while j < b and text[j] in OPS:
            j += 1
        i = j
    return out


def parse_shell(text: str) -> list[LaunchCommand]:
    cmds = []
    for a, b in _logical_lines(text):
        seg = text[a:b]
        if not seg.strip() or seg.lstrip().startswith("#"):
            continue
        if not re.search(r"sglang|vllm|repro_server", seg):
            continue
        if "<<" in seg and not re.search(r"""['"][^'"]*<<""", seg):
            raise LaunchParseError(f"a here-document at line {line_of(text, a)}")
        cmds.extend(_shell_commands(text, a, b, line_of(text, a)))
    return cmds


def parse_systemd(text: str) -> list[LaunchCommand]:
    cmds = []
    for a, b in _logical_lines(text):
        m = re.match(r"[ \t]*ExecStart[ \t]*=[ \t]*", text[a:b])
        if not m:
            continue
        i = a + m.end()
        while i < b and text[i] in "-@:+!":
            i += 1
        toks, stop = tokenize_shell(text, i, b, systemd=True)
        if stop is not None and text[stop] != "\n":
            raise LaunchParseError(f"ExecStart= at line {line_of(text, a)}: text perfscope does not read")
        eng = find_engine([t.value for t in toks])
        if not eng:
            continue
        check_shlex(text, toks)
        cmds.append(LaunchCommand("systemd", eng[0], toks, eng[1], line_of(text, a)))
    return cmds
