"""The load generator and client-side serving benchmark: TTFT, TPOT, ITL from streamed /generate
timestamps. workload.py streams the requests, vocab.py picks the token ids the served model
accepts, core.py measures and summarises, store.py writes a bench into a run folder.

``measure(client, ...) -> BenchResult`` is the one measurement that ``perfscope bench``, the fix
verification (``perfscope fix --restart-cmd``) and ``perfscope demo`` use; ``perfscope trace`` runs
the same load while the profiler records."""

from perfscope.bench.core import BenchResult, measure, percentile, summarize

__all__ = ["BenchResult", "measure", "percentile", "summarize"]
