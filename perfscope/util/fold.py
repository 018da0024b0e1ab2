"""Float sums in C that add exactly as a Python loop does.

``total = start; for v in values: total += v`` adds one float after another, left to right; the builtin
``sum`` does too on some Pythons but compensates its rounding on others (3.12 and later), and a loop
pays the interpreter per value. :func:`added` is that loop's result on every Python, the additions
made by ``itertools.accumulate`` (its own ``a + b``, in C)."""

from __future__ import annotations

from collections import deque
from itertools import accumulate
from typing import Iterable


def added(values: Iterable[float], start: float = 0.0) -> float:
    """``start + v0 + v1 + ...``, left to right: what ``total = start; for v in values: total += v`` gives."""
    return deque(accumulate(values, initial=start), maxlen=1)[0]
