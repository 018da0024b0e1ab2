"""Exact, structure-anchored source edits.

A fix finds the statements it changes with :mod:`ast` and describes each change as an
:class:`Edit` over the *original bytes* (line/column positions as ``ast`` reports them: lines from 1,
columns in UTF-8 bytes). :func:`apply_edits` splices them in; every byte outside the edited spans
is kept, so the diff shows exactly the anchored statements and nothing else.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Edit:
    """Replace [start, end) with ``text``. Positions are (line, byte column), lines from 1.
    ``start == end`` inserts."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str
    why: str = ""


class SourceIndex:
    """Byte offsets of a file's lines, for turning ast positions into offsets."""

    def __init__(self, data: bytes):
        self.data = data
        self.line_starts = [0]
        for i, b in enumerate(data):
            if b == 0x0A:
                self.line_starts.append(i + 1)

    def offset(self, pos: tuple[int, int]) -> int:
        line, col = pos
        if line - 1 >= len(self.line_starts):
            return len(self.data)
        return self.line_starts[line - 1] + col

    def line(self, lineno: int) -> bytes:
        a = self.line_starts[lineno - 1]
        b = self.line_starts[lineno] if lineno < len(self.line_starts) else len(self.data)
        return self.data[a:b]

    def indent_of(self, lineno: int) -> str:
        raw = self.line(lineno).decode("utf-8", "replace")
        return raw[: len(raw) - len(raw.lstrip(" \t"))]

    def segment(self, node: ast.expr | ast.stmt) -> str:
        a = self.offset((node.lineno, node.col_offset))
        b = self.offset((end_lineno(node), node.end_col_offset or 0))
        return self.data[a:b].decode("utf-8")


def end_lineno(node: ast.expr | ast.stmt) -> int:
    """The node's last line (``ast.parse`` sets it on every node it makes)."""
    if node.end_lineno is None:
        raise ValueError(f"{type(node).__name__} at line {node.lineno} has no end position")
    return node.end_lineno


def apply_edits(data: bytes, edits: Sequence[Edit]) -> bytes:
    """Splice ``edits`` into ``data``. Edits must not overlap."""
    idx = SourceIndex(data)
    spans = sorted(((idx.offset(e.start), idx.offset(e.end), e) for e in edits), key=lambda t: (t[0], t[1]))
    for (_a0, a1, ea), (b0, _b1, eb) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError(f"overlapping edits: {ea.why!r} and {eb.why!r}")
    out = bytearray()
    pos = 0
    for a, b, e in spans:
        out += data[pos:a]
        out += e.text.encode("utf-8")
        pos = b
    out += data[pos:]
    return bytes(out)


def statement_edit(idx: SourceIndex, stmt: ast.stmt, new_lines: Iterable[str], why: str) -> Edit:
    """Replace whole lines ``stmt.lineno .. stmt.end_lineno`` with ``new_lines`` (each indented like
    the statement). The statement must own its lines (nothing else on them)."""
    indent = idx.indent_of(stmt.lineno)
    end = end_lineno(stmt)
    end_line = idx.line(end)
    nl = "\r\n" if end_line.endswith(b"\r\n") else "\n"
    text = "".join(f"{indent}{ln}{nl}" if ln else nl for ln in new_lines)
    return Edit((stmt.lineno, 0), (end + 1, 0), text, why)


def insert_lines_after(idx: SourceIndex, lineno: int, lines: Iterable[str], why: str) -> Edit:
    text = "".join(lines)
    return Edit((lineno + 1, 0), (lineno + 1, 0), text, why)


def unified_diff(before: bytes, after: bytes, path: str, context: int = 3) -> str:
    a = before.decode("utf-8", "replace").splitlines(keepends=True)
    b = after.decode("utf-8", "replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, fromfile=f"a/{path}", tofile=f"b/{path}", n=context))


def changed_lines(before: bytes, after: bytes) -> tuple[list[int], list[int]]:
    """(line numbers removed from ``before``, line numbers added in ``after``), both from 1."""
    a = before.decode("utf-8", "replace").splitlines()
    b = after.decode("utf-8", "replace").splitlines()
    removed: list[int] = []
    added: list[int] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            removed.extend(range(i1 + 1, i2 + 1))
        if tag in ("replace", "insert"):
            added.extend(range(j1 + 1, j2 + 1))
    return removed, added


def compiles(data: bytes, filename: str = "<patched>") -> str | None:
    """None if ``data`` compiles as Python, else the error in one line."""
    try:
        compile(data, filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"{e.msg} at line {e.lineno}"
    return None
