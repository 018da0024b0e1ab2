"""Flag edits on a launch command: remove a flag (with its value), set it, or add a boolean flag,
changing only the bytes of the tokens they touch; and the argv the command must have after them."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Optional

from perfscope.fixengine.launch.tokens import LaunchCommand, LaunchParseError

_BLANKS = re.compile(r"[ \t]*")


@dataclass(frozen=True)
class FlagChange:
    """One flag edit: ``remove`` a flag (with its value), ``set`` it to ``value`` (adding it when
    absent), or ``add`` a boolean flag."""

    op: str  # remove | set | add
    flag: str  # "--disable-cuda-graph"
    value: Optional[str] = None
    takes_value: bool = False  # for remove: whether a separate value token follows
    why: str = ""

    def describe(self) -> str:
        if self.op == "remove":
            return f"remove {self.flag}"
        if self.op == "add":
            return f"add {self.flag}"
        return f"set {self.flag} {self.value}"


@dataclass
class Occurrence:
    index: int  # index in cmd.tokens of the flag token
    value: Optional[str]  # its value (None for a boolean flag)
    value_index: Optional[int]  # index of the value token (None if `--f=v` or boolean)
    inline: bool  # `--f=v`


def occurrences(cmd: LaunchCommand, flag: str, takes_value: bool) -> list[Occurrence]:
    out = []
    toks = cmd.tokens
    i = cmd.args_from
    while i < len(toks):
        v = toks[i].value
        if v == flag:
            if takes_value:
                if i + 1 >= len(toks) or toks[i + 1].value.startswith("--"):
                    raise LaunchParseError(f"{flag} at the end of the command without a value")
                out.append(Occurrence(i, toks[i + 1].value, i + 1, False))
                i += 2
                continue
            out.append(Occurrence(i, None, None, False))
        elif v.startswith(flag + "="):
            out.append(Occurrence(i, v[len(flag) + 1 :], None, True))
        i += 1
    return out


def flag_value(cmd: LaunchCommand, flag: str, takes_value: bool = True):
    """None if absent, True for a present boolean flag, the (last) value otherwise."""
    occ = occurrences(cmd, flag, takes_value)
    if not occ:
        return None
    return occ[-1].value if takes_value else True


@dataclass
class _Splice:
    a: int
    b: int
    text: str


def _quote_for(cmd: LaunchCommand, value: str) -> str:
    if cmd.kind in ("compose-flow", "compose-block"):
        q = cmd.tokens[-1].quote if cmd.kind == "compose-flow" else ""
        plain = re.fullmatch(r"[A-Za-z0-9_./=+-]+", value) and not re.fullmatch(
            r"[-+]?[0-9.]+|true|false|null|yes|no|on|off|~", value, re.I
        )
        if plain and not q:
            return value
        q = q or '"'
        if q in value or "\\" in value:
            raise LaunchParseError(f"value {value!r} needs YAML escapes")
        return f"{q}{value}{q}"
    q = shlex.quote(value)
    if q != value and cmd.container_quote == "'":
        raise LaunchParseError(f"value {value!r} needs quoting inside a single-quoted YAML string")
    if '"' in q and cmd.container_quote == '"':
        raise LaunchParseError(f"value {value!r} needs quoting inside a double-quoted YAML string")
    return q


def _remove_span(text: str, cmd: LaunchCommand, first: int, last: int) -> _Splice:
    toks = cmd.tokens
    if cmd.kind == "compose-block":
        a = text.rfind("\n", 0, toks[first].start) + 1
        b = text.find("\n", toks[last].end)
        b = len(text) if b < 0 else b + 1
        return _Splice(a, b, "")
    if cmd.kind == "compose-flow":
        # the separator before the item (", "), from the previous item's end
        return _Splice(toks[first - 1].end, toks[last].end, "")
    return _Splice(toks[first - 1].end, toks[last].end, "")


def _insert_after_last(text: str, cmd: LaunchCommand, words: list[str]) -> _Splice:
    last = cmd.tokens[-1]
    if cmd.kind == "compose-block":
        b = text.find("\n", last.end)
        b = len(text) if b < 0 else b + 1
        lines = "".join(f"{cmd.block_indent}{w}\n" for w in words)
        if b == len(text) and not text.endswith("\n"):
            lines = "\n" + lines.rstrip("\n")
        return _Splice(b, b, lines)
    if cmd.kind == "compose-flow":
        sep = ", "
        if len(cmd.tokens) >= 2:
            sep = text[cmd.tokens[-2].end : last.start] or ", "
        return _Splice(last.end, last.end, "".join(sep + w for w in words))
    # shell / systemd / compose-string: keep the file's style of one argument per line
    region = text[cmd.tokens[0].start : last.end]
    if cmd.kind in ("shell", "systemd") and "\\\n" in region:  # one argument per line: add a line
        ls = text.rfind("\n", 0, last.start) + 1
        m = _BLANKS.match(text, ls)
        indent = m.group(0) if m else ""
        before = region[: region.index("\\\n")]
        cont = before[len(before.rstrip(" \t")) :] or " "
        return _Splice(last.end, last.end, "".join(f"{cont}\\\n{indent}{w}" for w in words))
    return _Splice(last.end, last.end, " " + " ".join(words))


def _set_value(ch: FlagChange) -> str:
    if ch.value is None:  # pragma: no cover - programming error
        raise ValueError(f"{ch.describe()}: a set without a value")
    return ch.value


def edit_flags(data: bytes, cmd: LaunchCommand, changes: list[FlagChange]) -> tuple[bytes, list[str]]:
    """The file with ``changes`` made to ``cmd``'s tokens, and a note per change. Changes already in
    effect are left out (no edit). Raises LaunchParseError where the edit would not be exact."""
    text = data.decode("utf-8")
    splices: list[_Splice] = []
    adds: list[str] = []
    notes: list[str] = []
    for ch in changes:
        if ch.op == "remove":
            occ = occurrences(cmd, ch.flag, ch.takes_value)
            for o in occ:
                last = o.value_index if o.value_index is not None else o.index
                splices.append(_remove_span(text, cmd, o.index, last))
            if occ:
                notes.append(ch.describe() + (f": {ch.why}" if ch.why else ""))
        elif ch.op == "add":
            if not occurrences(cmd, ch.flag, False):
                adds.append(_quote_for(cmd, ch.flag))
                notes.append(ch.describe() + (f": {ch.why}" if ch.why else ""))
        elif ch.op == "set":
            value = _set_value(ch)
            occ = occurrences(cmd, ch.flag, True)
            if len(occ) > 1:
                raise LaunchParseError(f"{ch.flag} is given {len(occ)} times; perfscope will not pick one")
            if occ:
                o = occ[0]
                if o.value == value:
                    continue
                if o.inline or o.value_index is None:
                    t = cmd.tokens[o.index]
                    splices.append(_Splice(t.start, t.end, _quote_for(cmd, f"{ch.flag}={value}")))
                else:
                    t = cmd.tokens[o.value_index]
                    splices.append(_Splice(t.start, t.end, _quote_for(cmd, value)))
            else:
                if cmd.kind == "compose-block":
                    adds.extend([_quote_for(cmd, ch.flag), _quote_for(cmd, value)])
                else:
                    adds.append(
                        _quote_for(cmd, ch.flag)
                        + (", " if cmd.kind == "compose-flow" else " ")
                        + _quote_for(cmd, value)
                    )
            notes.append(ch.describe() + (f" (was {occ[0].value})" if occ else "") + (f": {ch.why}" if ch.why else ""))
        else:  # pragma: no cover - programming error
            raise ValueError(ch.op)
    if adds:
        if cmd.kind == "compose-flow":
            adds = [", ".join(adds)]
        splices.append(_insert_after_last(text, cmd, adds))
    splices.sort(key=lambda s: (s.a, s.b))
    for x, y in zip(splices, splices[1:]):
        if y.a < x.b:
            raise LaunchParseError("two flag edits overlap")
    out = []
    pos = 0
    for s in splices:
        out.append(text[pos : s.a])
        out.append(s.text)
        pos = s.b
    out.append(text[pos:])
    return "".join(out).encode("utf-8"), notes


def expected_argv(cmd: LaunchCommand, changes: list[FlagChange]) -> list[str]:
    """What the command's argv must be after ``changes`` (the post-condition of an edit)."""
    argv = cmd.argv[:]
    head, args = argv[: cmd.args_from], argv[cmd.args_from :]
    for ch in changes:
        if ch.op == "remove":
            out = []
            i = 0
            while i < len(args):
                if args[i] == ch.flag:
                    i += 2 if ch.takes_value else 1
                    continue
                if args[i].startswith(ch.flag + "="):
                    i += 1
                    continue
                out.append(args[i])
                i += 1
            args = out
        elif ch.op == "add":
            if ch.flag not in args:
                args.append(ch.flag)
        elif ch.op == "set":
            value = _set_value(ch)
            for i, a in enumerate(args):
                if a == ch.flag and i + 1 < len(args):
                    args[i + 1] = value
                    break
                if a.startswith(ch.flag + "="):
                    args[i] = f"{ch.flag}={value}"
                    break
            else:
                args += [ch.flag, value]
    return head + args
