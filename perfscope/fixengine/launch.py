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
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
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
        return self.tokens[self.args_from:]

    @property
    def argv(self) -> list[str]:
        return [t.value for t in self.tokens]

    def text(self) -> str:
        return " ".join(shlex.quote(v) for v in self.argv)


# ------------------------------------------------------------------------------- tokenizer

_OPS = set(";&|<>()")
_SH_SPECIAL_IN_WORD = ("$(", "`", "<(", ">(")
_EXPANSION = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*|\{[^}]*\}|[@*#?$!0-9-])")


def _tokenize_shell(text: str, a: int, b: int, *, systemd: bool = False) -> tuple[list[Token], Optional[int]]:
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
        if c in _OPS and not systemd:
            return toks, i
        start = i
        val = []
        expands = ""
        while i < b:
            c = text[i]
            if c in " \t\n":
                break
            if c in _OPS and not systemd:
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
                val.append(text[i + 1:j])
                i = j + 1
                continue
            if c == '"':
                j = i + 1
                while j < b and text[j] != '"':
                    if text[j] == "\\" and j + 1 < b:
                        if text[j + 1] == "\n":
                            raise LaunchParseError("a line continuation inside a quoted word")
                        val.append(text[j + 1] if text[j + 1] in '$`"\\' else text[j:j + 2])
                        j += 2
                        continue
                    if text[j] == "`" or text.startswith("$(", j):
                        raise LaunchParseError("command substitution in the launch command")
                    if text.startswith(("$@", "${@"), j):
                        expands = expands or text[j:j + 2]  # "$@" is one word per argument
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


def _check_shlex(text: str, toks: list[Token]) -> None:
    """The tokens must be what shlex reads from the same text (continuations as blanks)."""
    if not toks:
        return
    region = text[toks[0].start:toks[-1].end].replace("\\\n", "  ")
    try:
        ref = shlex.split(region, comments=False, posix=True)
    except ValueError as e:
        raise LaunchParseError(f"shlex cannot split the launch command ({e})") from None
    if ref != [t.value for t in toks]:
        raise LaunchParseError("the launch command does not split into the same words with shlex "
                               "(quoting perfscope does not read exactly)")


# ------------------------------------------------------------------------------ the engine

_WRAPPERS_SIMPLE = {"exec", "nohup", "setsid", "time", "stdbuf", "nice", "ionice", "chrt", "taskset", "numactl",
                    "env", "sudo", "uv", "run", "poetry", "conda", "pixi", "-u"}
_PY = re.compile(r"(^|/)python(\d+(\.\d+)?)?$")


def find_engine(argv: list[str]) -> Optional[tuple[str, int]]:
    """(engine, index of the first server argument) for a launch argv, or None."""
    for i, w in enumerate(argv):
        base = os.path.basename(w)
        if w == "-m" and i + 1 < len(argv):
            mod = argv[i + 1]
            if mod in ("sglang.launch_server", "sglang.srt.server"):
                return "sglang", i + 2
            if mod in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
                return "vllm", i + 2
            if mod in ("examples.repro_server", "repro_server"):
                return "repro", i + 2
        if base == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "sglang", i + 2
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "vllm", i + 2
        if base in ("launch_server.py",) and "sglang" in w:
            return "sglang", i + 1
    return None


# --------------------------------------------------------------------------- the file kinds


def kind_of(path: str, text: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith((".service", ".conf")) or re.search(r"^\s*ExecStart\s*=", text, re.M) and "[Service]" in text:
        return "systemd"
    if name.endswith((".yml", ".yaml")) or re.search(r"^\s*(services|version)\s*:", text, re.M):
        return "compose"
    return "shell"


def _line_of(text: str, off: int) -> int:
    return text.count("\n", 0, off) + 1


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
        toks, stop = _tokenize_shell(text, i, b)
        if toks:
            eng = find_engine([t.value for t in toks])
            if eng:
                _check_shlex(text, toks)
                out.append(LaunchCommand("shell", eng[0], toks, eng[1], _line_of(text, toks[0].start)))
        if stop is None:
            break
        if text[stop] == "#" or text[stop] == "\n":
            break
        # skip the operator(s) and the words of redirections (`> log`, `2>&1`)
        j = stop
        while j < b and text[j] in _OPS:
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
            raise LaunchParseError(f"a here-document at line {_line_of(text, a)}")
        cmds.extend(_shell_commands(text, a, b, _line_of(text, a)))
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
        toks, stop = _tokenize_shell(text, i, b, systemd=True)
        if stop is not None and text[stop] != "\n":
            raise LaunchParseError(f"ExecStart= at line {_line_of(text, a)}: text perfscope does not read")
        eng = find_engine([t.value for t in toks])
        if not eng:
            continue
        _check_shlex(text, toks)
        cmds.append(LaunchCommand("systemd", eng[0], toks, eng[1], _line_of(text, a)))
    return cmds


_YAML_PLAIN_BAD = re.compile(r"(^[\[\]{}!&*%@`|>'\"])|(: )|( #)")


def _yaml_item(text: str, a: int, b: int) -> Token:
    """One YAML scalar in [a, b) (surrounding blanks stripped): plain, '...' or "..." without escapes."""
    while a < b and text[a] in " \t":
        a += 1
    while b > a and text[b - 1] in " \t":
        b -= 1
    s = text[a:b]
    if not s:
        raise LaunchParseError(f"an empty item at line {_line_of(text, a)}")
    if s[0] == "'":
        if len(s) < 2 or s[-1] != "'" or "'" in s[1:-1]:
            raise LaunchParseError(f"a single-quoted YAML item perfscope does not read at line {_line_of(text, a)}")
        return Token(s[1:-1], a, b, "'")
    if s[0] == '"':
        if len(s) < 2 or s[-1] != '"' or '"' in s[1:-1] or "\\" in s:
            raise LaunchParseError(f"a double-quoted YAML item with escapes at line {_line_of(text, a)}")
        return Token(s[1:-1], a, b, '"')
    if _YAML_PLAIN_BAD.search(s) or s.endswith(":"):
        raise LaunchParseError(f"a YAML item perfscope does not read exactly at line {_line_of(text, a)}: {s[:40]}")
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
            raise LaunchParseError(f"command: at line {li + 1} is a YAML block scalar; perfscope reads a one-line "
                                   "string or a list")
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
                cmt = re.search(r"[ \t]#", lj[im.end():]) if not lj[im.end():].startswith(("'", '"')) else None
                if cmt:
                    ib = offs[j] + im.end() + cmt.start()
                toks.append(_yaml_item(text, offs[j] + im.end(), ib))
                j += 1
            if j < len(lines) and re.match(r"^[ \t]*-", lines[j]) and lines[j].strip():
                raise LaunchParseError(f"command: list at line {li + 1}: an item perfscope does not read at line {j + 1}")
            eng = find_engine([t.value for t in toks])
            if eng:
                cmds.append(LaunchCommand("compose-block", eng[0], toks, eng[1], li + 1, block_indent=indent or ""))
            continue
        if rest.startswith("["):
            close = rest.rfind("]")
            if close < 0 or rest[close + 1:].strip() not in ("",) and not rest[close + 1:].lstrip().startswith("#"):
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
                raise LaunchParseError(f"command: at line {li + 1}: a quoted YAML string perfscope does not read "
                                       "exactly (escapes or quotes inside)")
            a, b = a + 1, b - 1
        elif _YAML_PLAIN_BAD.search(s):
            raise LaunchParseError(f"command: at line {li + 1}: a YAML string perfscope does not read exactly")
        toks, stop = _tokenize_shell(text, a, b, systemd=True)
        eng = find_engine([t.value for t in toks])
        if eng:
            _check_shlex(text, toks)
            cmds.append(LaunchCommand("compose-string", eng[0], toks, eng[1], li + 1, container_quote=quote))
    return cmds


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
        raise LaunchParseError(f"{path} ({kind}): {len(cmds)} launch commands (lines {where}); perfscope edits a "
                               "file with exactly one")
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
        if re.match(r"--[A-Za-z0-9][A-Za-z0-9_-]*=[^$]*\$", text[t.start:t.end]) and not t.expands.startswith("$@"):
            continue  # --model-path=$MODEL: a flag's value
        if t.expands.startswith(("$@", "${@")) or not (prev.startswith("-") and "=" not in prev
                                                         and not t.value.startswith("-")):
            raise LaunchParseError(f"{text[t.start:t.end]} (line {_line_of(text, t.start)}): the shell expands it into "
                                   "words perfscope cannot see (flags, maybe); write the server's flags out in the file")


# ---------------------------------------------------------------------------------- flags


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
            out.append(Occurrence(i, v[len(flag) + 1:], None, True))
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
            r"[-+]?[0-9.]+|true|false|null|yes|no|on|off|~", value, re.I)
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
            sep = text[cmd.tokens[-2].end:last.start] or ", "
        return _Splice(last.end, last.end, "".join(sep + w for w in words))
    # shell / systemd / compose-string: keep the file's style of one argument per line
    region = text[cmd.tokens[0].start:last.end]
    if cmd.kind in ("shell", "systemd") and "\\\n" in region:  # one argument per line: add a line
        ls = text.rfind("\n", 0, last.start) + 1
        indent = re.match(r"[ \t]*", text[ls:]).group(0)
        before = region[: region.index("\\\n")]
        cont = before[len(before.rstrip(" \t")):] or " "
        return _Splice(last.end, last.end, "".join(f"{cont}\\\n{indent}{w}" for w in words))
    return _Splice(last.end, last.end, " " + " ".join(words))


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
            occ = occurrences(cmd, ch.flag, True)
            if len(occ) > 1:
                raise LaunchParseError(f"{ch.flag} is given {len(occ)} times; perfscope will not pick one")
            if occ:
                o = occ[0]
                if o.value == ch.value:
                    continue
                if o.inline:
                    t = cmd.tokens[o.index]
                    splices.append(_Splice(t.start, t.end, _quote_for(cmd, f"{ch.flag}={ch.value}")))
                else:
                    t = cmd.tokens[o.value_index]
                    splices.append(_Splice(t.start, t.end, _quote_for(cmd, ch.value)))
            else:
                if cmd.kind == "compose-block":
                    adds.extend([_quote_for(cmd, ch.flag), _quote_for(cmd, ch.value)])
                else:
                    adds.append(_quote_for(cmd, ch.flag) + (", " if cmd.kind == "compose-flow" else " ")
                                + _quote_for(cmd, ch.value))
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
        out.append(text[pos:s.a])
        out.append(s.text)
        pos = s.b
    out.append(text[pos:])
    return "".join(out).encode("utf-8"), notes


def expected_argv(cmd: LaunchCommand, changes: list[FlagChange]) -> list[str]:
    """What the command's argv must be after ``changes`` (the post-condition of an edit)."""
    argv = cmd.argv[:]
    head, args = argv[:cmd.args_from], argv[cmd.args_from:]
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
            for i, a in enumerate(args):
                if a == ch.flag and i + 1 < len(args):
                    args[i + 1] = ch.value
                    break
                if a.startswith(ch.flag + "="):
                    args[i] = f"{ch.flag}={ch.value}"
                    break
            else:
                args += [ch.flag, ch.value]
    return head + args


@dataclass
class ServerCommandLine:
    """The command line of the process serving a port, as /proc shows it."""

    pid: Optional[int] = None
    argv: list = field(default_factory=list)

    def text(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


def server_command_line(host, port: int) -> ServerCommandLine:
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
