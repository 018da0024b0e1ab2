"""Diagnose a set of trace files: each rank (file) analysed in its own process, then combined
(the task and the reduce: :mod:`perfscope.analysis.split`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Sequence

from perfscope.analysis.parallel import available_memory, json_bytes, plan_workers
from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.analysis.split import analyze_file, prepare, rank_task, reduce
from perfscope.errors import InputError


def _worker(args: tuple) -> dict:
    return rank_task(*args)


def diagnose(
    paths: Sequence[str | Path],
    config: Optional[dict] = None,
    workers: Optional[int] = None,
    on_done: Optional[Callable[[int, int], None]] = None,
    capture: Optional[Sequence[str | Path]] = None,
    on_read: Optional[Callable[[int, int], None]] = None,
) -> Diagnosis:
    """Analyse every trace under ``paths``; several files are parsed in parallel processes.
    ``on_read(bytes_done, bytes_total)`` follows the reading of a file analysed in this process;
    ``on_done(files_done, files_total)`` the files."""
    plan = prepare(paths, config, capture)
    files, cfg, capture = plan.files, plan.config, plan.capture
    results: list[Optional[RankAnalysis]] = [None] * len(files)
    if workers:
        nproc, bound = workers, "option"
    else:
        nproc, bound = plan_workers([json_bytes(tf.path) for tf in files], os.cpu_count() or 1, available_memory())
    if len(files) == 1 or nproc <= 1:
        for i, tf in enumerate(files):
            results[i] = analyze_file(tf, cfg, capture, on_read)
            if on_done:
                on_done(i + 1, len(files))
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed  # a pool only for several files

        with ProcessPoolExecutor(max_workers=nproc) as pool:
            futs = {pool.submit(_worker, (tf, cfg, capture)): i for i, tf in enumerate(files)}
            done = 0
            for fut in as_completed(futs):
                out = fut.result()
                if "error" in out:
                    for f in futs:
                        f.cancel()
                    raise InputError(out["error"])
                results[futs[fut]] = RankAnalysis.from_dict(out["ok"])
                done += 1
                if on_done:
                    on_done(done, len(files))
    ranks = [r for r in results if r is not None]
    return reduce(plan.tset, ranks, {"files": len(files), "workers": min(nproc, len(files)), "bound": bound})
