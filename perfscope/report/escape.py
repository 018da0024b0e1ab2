"""Strings from a trace or a server, made safe for the medium they are shown in: one helper per
medium, used by every renderer.

A kernel, op or device name, a trace's file name, a Python function or a server's error body is
data, never instructions: it must not move the cursor, set a window title or draw a link in a
terminal (:func:`term`, :func:`markup`, :class:`Console`), start a heading or split a table cell
in Markdown (:func:`md_text`, :func:`md_code`), or become a formula in a
spreadsheet (:func:`csv_cell`). Plotly's labels and hover text are built in the page's script,
which has its own one helper (``plotlyText`` in ``reports/assets/report.js``); the rest of the
HTML report is Jinja with autoescape.

Control characters are shown, not dropped, as Python writes them in a string literal (``\\x1b``,
``\\n``, ``\\u202e``): what the trace holds stays visible."""

from __future__ import annotations

import re
from typing import Any, Iterable

from rich.console import Console as _RichConsole
from rich.markup import escape as _markup_escape

# C0 controls, DEL, C1 controls (0x9b is CSI on 8-bit terminals), the line and paragraph separators,
# and the bidirectional overrides and isolates that reorder what is shown ("Trojan source")
_CONTROL_RX = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def term(x: Any, keep: str = "") -> str:
    """``x`` as text for a terminal: every control character (and bidi override) written out as
    its escape; ``keep``: the ones left as they are (``"\\n"`` for perfscope's own several-line
    texts, ``"\\n\\t"`` for a file's diff)."""
    return _CONTROL_RX.sub(lambda m: m.group(0) if m.group(0) in keep else _shown(m.group(0)), str(x))


def markup(x: Any) -> str:
    """``x`` for a rich markup string: control characters escaped (:func:`term`), then ``[``."""
    return _markup_escape(term(x))


class Console(_RichConsole):
    """rich's Console whose output never carries a control character it did not make itself: the
    text of every segment (not its styles, not rich's own control segments) passes :func:`term`,
    newlines and tabs kept; a printed string passes it before rich makes a ``Text`` of it (which
    would drop some controls unseen). The net under every renderer, for a string that reached a
    ``Text`` or a ``markup=False`` print without :func:`term`."""

    def render_str(self, text: str, **kwargs):  # a printed str, before rich drops BEL, BS, CR...
        return super().render_str(term(text, keep="\n\t"), **kwargs)

    def _render_buffer(self, buffer):  # rich's one place where segments become the written text
        return super()._render_buffer(
            type(seg)(term(seg.text, keep="\n\t"), seg.style, seg.control) if not seg.control else seg for seg in buffer
        )


# --------------------------------------------------------------------------------------- Markdown

# the ASCII punctuation that can start or end structure in CommonMark / GFM: emphasis, links and
# images, raw HTML and entities, code spans, headings and issue references, tables, strikethrough;
# ``_`` only where it can be emphasis (not inside a word); a URL's ``://`` and ``www.`` (autolinks)
_MD_ACTIVE = re.compile(
    r"[\\`*\[\]<>&|#~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])"
    r"|(?<=[A-Za-z0-9]):(?=//)|(?<=www)\."
)
_MD_LINE_START = re.compile(r"^(?:[-+=>]|\d+[.)])")  # a list item, a setext underline, a quote


def md_text(x: Any) -> str:
    """``x`` as plain text inside a Markdown line: control characters and newlines escaped (a
    newline could start a heading or a list), Markdown and HTML punctuation backslash-escaped."""
    s = _MD_ACTIVE.sub(lambda m: "\\" + m.group(0), term(x))
    return _MD_LINE_START.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], s)


def md_code(x: Any, in_table: bool = False) -> str:
    """``x`` as an inline code span (nothing inside is Markdown or HTML): a fence longer than any
    run of backticks in it; ``in_table``: ``|`` escaped, which GFM splits cells on even in code."""
    s = term(x)
    if in_table:
        s = s.replace("|", "\\|")
    longest = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ") and s.strip()) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


# -------------------------------------------------------------------------------------------- CSV

_FORMULA_START = ("=", "+", "-", "@")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def csv_cell(x: Any) -> Any:
    """A CSV cell that a spreadsheet shows as the text it is: numbers stay numbers; a string
    starting with ``= + - @`` (a formula to Excel, LibreOffice, Google Sheets) gets a leading ``'``;
    control characters are escaped (:func:`term`), so none can start one either."""
    if x is None or isinstance(x, (bool, int, float)):
        return x
    s = term(x)
    if s.startswith(_FORMULA_START) and not _NUMBER.fullmatch(s):
        return "'" + s
    return s


def csv_row(cells: Iterable[Any]) -> list:
    return [csv_cell(c) for c in cells]
