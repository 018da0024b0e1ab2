"""The host side of ``trace --analyse-on-host``: what the host's own Python runs, from the zip of
perfscope's package that :mod:`perfscope.cluster.onhost` copies there.

``main(JOB)``: reads the job (a JSON file perfscope wrote beside the zip: the run folder's run.json,
the user's config, the rank files with their rank, stage and host, the host-timing profile's files,
where to write), then

1. checks every listed file is a regular file on this host (all missing ones named in one line);
2. hashes each (sha256, size: what run.json lists, what a later fetch checks);
3. builds the configuration as ``diagnose`` does locally (:func:`perfscope.analysis.split.run_config`:
   the host timing read here), and runs :func:`perfscope.analysis.split.rank_task` on each rank file,
   several in parallel processes as ``diagnose`` does;
4. writes the results, gzipped JSON, atomically (a temporary file renamed), and prints one JSON line.

It writes nothing when a rank fails: it prints ``{"error": line, "exit_code": n}`` and exits 2.
Only the standard library, msgspec and perfscope itself are imported (:data:`DEPENDENCIES`)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
import sys
from pathlib import Path

# the modules beyond the standard library that perfscope's loader and analysis import (checked on the
# host before anything is profiled; tests/test_onhost.py keeps this list equal to what they import)
DEPENDENCIES = ("msgspec",)
MIN_PYTHON = (3, 10)
MAX_JOB_BYTES = 64 << 20


def _hash(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _task(args):
    from perfscope.analysis.split import rank_task

    return rank_task(*args)


def run(job: dict) -> dict:
    """The job's results: ``{"files": [{path, sha256, bytes}], "ranks": [{path, ok}], "workers"}``,
    or ``{"error": line, "exit_code": n}``."""
    from perfscope.analysis.parallel import available_memory, json_bytes, plan_workers
    from perfscope.analysis.split import run_config
    from perfscope.load.discover import TraceFile, TraceSet

    host = job.get("host") or "the host"
    files = job["files"]
    ht = job.get("host_timing") or []
    missing = [f for f in files + ht if not _regular(f["path"])]
    if missing:
        names = ", ".join(f"rank {f.get('rank') if f.get('rank') is not None else '?'} {f['path']}" for f in missing)
        return {
            "error": f"{len(missing)} trace file(s) missing on {host} (moved or removed since the profile?): "
            f"{names[:800]}",
            "exit_code": 2,
        }
    hashed = []
    for f in files + ht:
        digest, size = _hash(f["path"])
        hashed.append({"path": f["path"], "sha256": digest, "bytes": size})

    def tf(f: dict) -> TraceFile:
        return TraceFile(
            path=Path(f["path"]), rank=f.get("rank"), stage=f.get("stage"), host=f.get("host"), role=f.get("role")
        )

    tset = TraceSet(files=[], run_info=job.get("run_info") or {}, host_timing=[tf(f) for f in ht])
    cfg = run_config(tset, job.get("config") or {})
    ranks = [f for f in files if f.get("analyse", True)]
    nproc, _ = plan_workers([json_bytes(f["path"]) for f in ranks] or [0], os.cpu_count() or 1, available_memory())
    args = [(tf(f), cfg, None) for f in ranks]
    if len(args) <= 1 or nproc <= 1:
        outs = [_task(a) for a in args]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=min(nproc, len(args)), mp_context=ctx) as pool:
            outs = list(pool.map(_task, args))
    results = []
    for f, out in zip(ranks, outs):
        if "error" in out:
            return {"error": out["error"], "exit_code": out.get("exit_code", 2)}
        results.append({"path": f["path"], "ok": out["ok"]})
    return {"files": hashed, "ranks": results, "workers": min(nproc, max(1, len(args)))}


def main(job_path: str) -> int:
    try:
        with open(job_path, "rb") as f:
            job = json.loads(f.read(MAX_JOB_BYTES))
        out = run(job)
    except Exception as e:  # one line back to perfscope, never a traceback
        out = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", "exit_code": 3}
    if "error" in out:
        print(json.dumps(out))
        return 2
    data = gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0)
    dest = job["out"]
    tmp = f"{dest}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest)
    print(json.dumps({"ok": True, "bytes": len(data)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
