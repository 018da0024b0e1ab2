"""Real traces read and diagnosed once per test session (tests/ is on sys.path).

``real_trace(name)`` is the :class:`perfscope.load.model.Trace` of one trace file, read by
perfscope's reader; ``real_analysis(name, config=None)`` its ``analyze_trace`` (one rank's
:class:`perfscope.analysis.result.RankAnalysis`: steps, buckets, findings);
``real_diagnosis(*names, config=None)`` the ``diagnose`` of one or more inputs (files, folders, run
folders) with that config, analysed in this process (``workers=1``: its ``parallel`` says so, and its
ops keep their ``sample``, as a single file's do). A name is a path, or a path relative to the corpus
(``tests/traces/corpus``, e.g. ``"h200-mla-fp8-kv/mla_pool_graph.json.xz"``).

Each is computed the first time a test asks and then shared by every test of the session: read
them, never change them (derive a changed copy with ``dataclasses.replace`` or ``copy.deepcopy``).
A test that is about reading or diagnosing itself (its errors, its notes, its memory) calls the
reader or ``diagnose`` directly.

``shared_reads()`` (a context manager) makes the analysis read a committed real trace (under
tests/traces or examples/gpu_loop/results, files no test writes) through ``real_trace`` too while
it is on: ``real_diagnosis`` and the tests of a module marked ``pytest.mark.shared_reads``
(tests/conftest.py turns it on for the whole module) share one read of a file instead of inflating
and parsing it again for every configuration and output they check (the fast tests read one file up
to 29 times). Only the analysis' reads (``perfscope.analysis.split.load_trace``) go through it, and
only reads without a progress callback; a module whose tests are about reading (its bounds, errors,
memory) is not marked and reads afresh. While it is on, ``diagnose`` plans its workers as on a box
of one CPU (several files are analysed one after the other in this process, where the reads are
shared, not in a pool whose workers would read them again); a call that names its workers gets
them, and the pool is tested where it is the subject (tests/test_parallel.py, test_result_types.py).
An analysis never changes its trace (``analyze_trace`` clears ``trace.memo`` before and after), so
a shared trace gives the result of a fresh read:
tests/test_golden.py, which reads every file afresh, compares every real trace's JSON. The store
keeps at most SHARED_JSON_BYTES of traces' JSON, the oldest read dropped first.
"""

from __future__ import annotations

import contextlib
import gc
import json
from pathlib import Path
from typing import Any, Optional

from paths import GPU_LOOP, REPO, TRACES
from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.diagnose import diagnose
from perfscope.load.reader import load_trace

_TRACES: dict[Path, Any] = {}
_ANALYSES: dict[tuple, Any] = {}
_DIAGNOSES: dict[tuple, Any] = {}


SHARED_JSON_BYTES = 3_000_000_000
_COMMITTED = (REPO / "tests" / "traces", GPU_LOOP)


def path_of(name) -> Path:
    p = Path(name)
    return p if p.is_absolute() else TRACES / p


def real_trace(name):
    """The trace file ``name`` as perfscope reads it (read once per session)."""
    p = path_of(name)
    if p not in _TRACES:
        _TRACES[p] = load_trace(p)
        _bound_store(keep=p)
        gc.freeze()  # kept for the session: out of the cyclic collector's passes (tests/conftest.py)
    return _TRACES[p]


def _bound_store(keep: Path) -> None:
    held = sum(t.meta.json_bytes for t in _TRACES.values())
    for old in list(_TRACES):
        if held <= SHARED_JSON_BYTES:
            break
        if old != keep:
            held -= _TRACES.pop(old).meta.json_bytes


def _shared_load_trace(path, progress=None):
    p = Path(path).resolve()
    if progress is None and any(p.is_relative_to(d) for d in _COMMITTED):
        return real_trace(p)
    return load_trace(path, progress=progress)


@contextlib.contextmanager
def shared_reads():
    """The analysis reads committed real traces through ``real_trace`` while this is on (the module's doc)."""
    import perfscope.analysis.diagnose as diagnosis
    import perfscope.analysis.split as split

    plan = diagnosis.plan_workers
    before, split.load_trace = split.load_trace, _shared_load_trace
    diagnosis.plan_workers = lambda sizes, cpus, available: plan(sizes, 1, available)
    try:
        yield
    finally:
        split.load_trace, diagnosis.plan_workers = before, plan


def real_analysis(name, config: Optional[dict] = None):
    """``analyze_trace(real_trace(name), config or {})`` (computed once per session for the same trace and config)."""
    key = (path_of(name), json.dumps(config or {}, sort_keys=True, default=str))
    if key not in _ANALYSES:
        _ANALYSES[key] = analyze_trace(real_trace(name), config or {})
    return _ANALYSES[key]


def real_diagnosis(*names, config: Optional[dict] = None):
    """``diagnose([names...], config)`` (computed once per session for the same inputs and config)."""
    paths = tuple(path_of(n) for n in names)
    key = (paths, json.dumps(config, sort_keys=True, default=str) if config is not None else None)
    if key not in _DIAGNOSES:
        # in this process, file by file: the process pool is tested where it is the subject
        # (tests/test_parallel.py, test_result_types.py, the CLI's); its workers' start and results'
        # round trip cost more than they save on a loaded box of two cores
        with shared_reads():
            _DIAGNOSES[key] = diagnose(list(paths), config, workers=1)
    return _DIAGNOSES[key]
