"""Client-side serving benchmark: TTFT, TPOT, ITL from streamed /generate timestamps.

``measure(client, ...) -> BenchResult`` is the one measurement that ``perfscope bench``, the fix
verification (``perfscope fix --restart-cmd``) and ``perfscope demo`` use."""

from perfscope.bench.core import BenchResult, measure, percentile, summarize

__all__ = ["BenchResult", "measure", "percentile", "summarize"]
