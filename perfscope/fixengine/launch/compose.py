"""Launch commands in compose (YAML) files: ``command:`` as a one-line string, a flow list or a block
list; YAML perfscope does not read exactly (block scalars, escapes) is refused."""

from __future__ import annotations

import re

from perfscope.fixengine.launch.engines import find_engine
from perfscope.fixengine.launch.tokens import (
    LaunchCommand,
    LaunchParseError,
    Token,
    check_shlex,
    line_of,
    tokenize_shell,
)


_YAML_PLAIN_BAD = re.compile(r"(^[\[\]{}!&*%@`|>'\"])|(: )|( #)")


def _yaml_item(text: str, a: int, b: int) -> Token:
    """One YAML scalar in [a, b) (surrounding blanks stripped): plain, '...' or "..." without escapes."""
    while a < b and text[a] in " \t":
        a += 1
    while b > a and text[b - 1] in " \t":
        b -= 1
    s = text[a:b]
    if not s:
        raise LaunchParseError(f"an empty item at line {line_of(text, a)}")
    if s[0] == "'":
        if len(s) < 2 or s[-1] != "'" or "'" in s[1:-1]:
            raise LaunchParseError(f"a single-quoted YAML item perfscope does not read at line {line_of(text, a)}")
        return Token(s[1:-1], a, b, "'")
    if s[0] == '"':
        if len(s) < 2 or s[-1] != '"' or '"' in s[1:-1] or "\\" in s:
            raise LaunchParseError(f"a double-quoted YAML item with escapes at line {line_of(text, a)}")
        return Token(s[1:-1], a, b, '"')
    if _YAML_PLAIN_BAD.search(s) or s.endswith(":"):
        raise LaunchParseError(f"a YAML item perfscope does not read exactly at line {line_of(text, a)}: {s[:40]}")
    return Token(s, a, b, "")


def parse_compose(text: str) -> list[LaunchCommand]:
    cmds = []
    lines = text.split("\n")
    offs = [0]
    for ln in lines:
        offs.append(offs[-1] + len(ln) + 1)
    for li, ln in enumerate(lines):
        m = re.match(r"^([ \t]*)command[ \t]*:[ \t]*", ln)
        if not m:
            continue
        a = offs[li] + m.end()
        b = offs[li] + len(ln)
        rest = text[a:b]
        # a trailing comment
        cm = re.search(r"[ \t]#", rest) if not rest.startswith(("'", '"', "[")) else None
        if cm:
            b = a + cm.start()
            rest = text[a:b]
        if rest.startswith(("|", ">")):
            raise LaunchParseError(
                f"command: at line {li + 1} is a YAML block scalar; perfscope reads a one-line string or a list"
            )
        if rest.strip() == "":
            # a block list on the lines below
            toks = []
            indent = None
            j = li + 1
            while j < len(lines):
                lj = lines[j]
                if not lj.strip() or lj.lstrip().startswith("#"):
                    j += 1
                    continue
                im = re.match(r"^([ \t]*)-[ \t]+", lj)
                if not im or (indent is not None and im.group(0) != indent):
                    break
                if len(im.group(1)) < len(m.group(1)):
                    break
                indent = im.group(0)
                ib = offs[j] + len(lj)
                cmt = re.search(r"[ \t]#", lj[im.end() :]) if not lj[im.end() :].startswith(("'", '"')) else None
                if cmt:
                    ib = offs[j] + im.end() + cmt.start()
                toks.append(_yaml_item(text, offs[j] + im.end(), ib))
                j += 1
            if j < len(lines) and re.match(r"^[ \t]*-", lines[j]) and lines[j].strip():
                raise LaunchParseError(
                    f"command: list at line {li + 1}: an item perfscope does not read at line {j + 1}"
                )
            eng = find_engine([t.value for t in toks])
            if eng:
                cmds.append(LaunchCommand("compose-block", eng[0], toks, eng[1], li + 1, block_indent=indent or ""))
            continue
        if rest.startswith("["):
            close = rest.rfind("]")
            if close < 0 or rest[close + 1 :].strip() not in ("",) and not rest[close + 1 :].lstrip().startswith("#"):
                raise LaunchParseError(f"command: at line {li + 1}: a flow list that does not close on its line")
            inner_a, inner_b = a + 1, a + close
            toks = []
            k = inner_a
            for part in text[inner_a:inner_b].split(","):
                if part.strip():
                    toks.append(_yaml_item(text, k, k + len(part)))
                k += len(part) + 1
            eng = find_engine([t.value for t in toks])
            if eng:
                cmds.append(LaunchCommand("compose-flow", eng[0], toks, eng[1], li + 1))
            continue
        quote = ""
        s = rest.rstrip()
        b = a + len(s)
        if s[:1] in ("'", '"'):
            quote = s[0]
            if len(s) < 2 or s[-1] != quote or quote in s[1:-1] or "\\" in s:
                raise LaunchParseError(
                    f"command: at line {li + 1}: a quoted YAML string perfscope does not read "
                    "exactly (escapes or quotes inside)"
                )
            a, b = a + 1, b - 1
        elif _YAML_PLAIN_BAD.search(s):
            raise LaunchParseError(f"command: at line {li + 1}: a YAML string perfscope does not read exactly")
        toks, stop = tokenize_shell(text, a, b, systemd=True)
        eng = find_engine([t.value for t in toks])
        if eng:
            check_shlex(text, toks)
            cmds.append(LaunchCommand("compose-string", eng[0], toks, eng[1], li + 1, container_quote=quote))
    return cmds
