"""Text that fits a terminal: a panel title kept whole, a kernel name wrapped at its own separators
(never mid-word), a name cut at a word boundary, a line that keeps its indent when it wraps."""

from __future__ import annotations

import re
from typing import Optional

from rich.cells import cell_len
from rich.measure import Measurement
from rich.text import Text

# a panel's title sits between "╭─ " and " ─╮": what is left of the console's width for it
_TITLE_CHROME = 6


def fit_title(parts: list[str], width: Optional[int]) -> tuple[str, str]:
    """The verdict's title, "a · b · c", kept whole: the parts that do not fit in the panel's top
    border (``width``: the console's) come back joined, for the panel's first line, rather than
    cropped mid-word by the border."""
    if not width:
        return " · ".join(parts), ""
    room = width - _TITLE_CHROME
    n = len(parts)
    while n > 1 and len(" · ".join(parts[:n])) > room:
        n -= 1
    return " · ".join(parts[:n]), " · ".join(parts[n:])


# a kernel name's pieces: opening brackets, a word, the separators after it (a line may break
# after a piece: after `_`, a space, `,`, `>`, `:`, `/`, a closing bracket; before an opening one)
_NAME_PIECE = re.compile(r"[\[(<]*[^_\s,<>:/\[\]()]*[_\s,>:/\])]*")


class BoundaryText:
    """A name (a kernel's) that a narrow table cell wraps at its own separators (after ``_``, a
    space, ``,``, ``>``, ``:``, ``/``, a closing bracket; before an opening one), never mid-word: rich folds a word wider than its cell at
    the cell's edge ("nvjet_..._split" / "K_NNT"). Only a piece wider than the cell alone is folded."""

    def __init__(self, text: Text):
        self.text = text

    def _pieces(self) -> list[tuple[int, int]]:
        return [m.span() for m in _NAME_PIECE.finditer(self.text.plain) if m.end() > m.start()]

    def __rich_measure__(self, console, options) -> Measurement:
        plain = self.text.plain
        widest = max((cell_len(plain[a:b].rstrip()) for a, b in self._pieces()), default=1)
        return Measurement(max(1, min(widest, options.max_width)), max(1, cell_len(plain)))

    def __rich_console__(self, console, options):
        width = max(1, options.max_width)
        plain = self.text.plain
        cuts: list[int] = []
        used = 0
        for a, b in self._pieces():
            word = cell_len(plain[a:b].rstrip())
            if used and used + word > width:
                cuts.append(a)
                used = 0
            while word > width:  # one piece wider than the cell: folded, the only cut inside a word
                a += width
                cuts.append(a)
                word -= width
            used += cell_len(plain[a:b])
        lines = self.text.divide(cuts)
        for ln in lines:
            ln.rstrip()
        yield Text("\n").join(lines)


def cut_name(name: str, limit: int = 48) -> str:
    """A kernel name cut at a word boundary (``_``, space, ``<``, ``:``) before ``limit``, with an
    ellipsis; never mid-word."""
    if len(name) <= limit:
        return name
    cut = max(name.rfind(ch, 0, limit) for ch in ("_", " ", "<", ":", ","))
    return (name[:cut] if cut > limit // 2 else name[:limit]) + "…"


_LABEL = re.compile(r"(?:fix|after|remedy): +")


def hanging(markup: str, labels: bool = False):
    """A line whose leading spaces stay the indent of every line it wraps onto (rich folds a long
    line back to column 0); with ``labels``, a line led by ``fix:``, ``after:`` or ``remedy:`` wraps
    under the text after its label."""
    from rich.table import Table as _Grid

    body = markup.lstrip(" ")
    style = ""
    if markup.startswith("[dim]") and markup.endswith("[/]"):  # the style wraps the whole line
        style, body = "dim", markup[len("[dim]") : -len("[/]")]
    m = _LABEL.match(body) if labels else None
    lead = m.group(0) if m else " " * (len(body) - len(body.lstrip(" ")))
    body = body[len(lead) :]
    if not lead:
        return markup
    g = _Grid.grid(padding=0)
    g.add_column(width=len(lead), no_wrap=True, style=style)
    g.add_column(style=style)
    g.add_row(lead.rstrip() or "", body)
    return g
