"""Python's cyclic garbage collector held off while a trace is read and analysed.

A loaded trace is millions of small tuples that live until the analysis ends, and reading and
analysing it allocates millions more: every few thousand allocations the collector runs, and each
of its full passes walks every object alive (30% of a 171 MB eager trace's diagnose went there, 8
full passes of ~0.15 s). Nothing the reader or the passes build needs the collector: their objects
go when their last reference does, and the one cycle (the step model's replays in ``trace.memo``)
is broken by ``analyze_trace`` clearing the memo. The collector is back on when the block ends.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block (nested blocks keep it off until the outermost ends)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
