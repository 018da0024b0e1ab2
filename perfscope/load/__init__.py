"""Trace loading: Kineto chrome-trace files (and folders / run folders of them) -> :class:`Trace`.

Public surface: :func:`load_trace`, :func:`discover`, :class:`Trace` and its event tuples.
"""

from perfscope.load.discover import TraceSet, discover
from perfscope.load.model import Annotation, CpuOp, Kernel, Launch, PyFrame, Trace, TraceMeta
from perfscope.load.reader import load_trace

__all__ = [
    "Annotation",
    "CpuOp",
    "Kernel",
    "Launch",
    "PyFrame",
    "Trace",
    "TraceMeta",
    "TraceSet",
    "discover",
    "load_trace",
]
