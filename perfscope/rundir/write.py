"""Writing a run folder's run.json (:mod:`perfscope.rundir` describes it): a new one (:func:`write_run`),
fields merged into one (:func:`update_run`), a ``files`` entry (:func:`file_entry`), and the mark of a
trace that did not finish (:func:`mark_incomplete`); every write atomic."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from perfscope import __version__
from perfscope.rundir.schema import RUN_FILE, SCHEMA_VERSION, load_json, parse_trace_name
from perfscope.util.files import atomic_write_text, sha256_file


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def file_entry(run_dir: str | Path, path: str | Path, *, host: str | None = None, sha256: str | None = None) -> dict:
    """A ``files`` entry for a file inside ``run_dir`` (sha256 computed unless given)."""
    run_dir = Path(run_dir)
    p = Path(path)
    if not p.is_absolute():
        p = run_dir / p
    rel = p.relative_to(run_dir).as_posix()
    meta = parse_trace_name(p.name)
    return {
        "path": rel,
        "sha256": sha256 or sha256_file(p),
        "bytes": p.stat().st_size,
        "rank": meta["rank"],
        "stage": meta["stage"],
        "host": host,
        "parallel": meta["parallel"],
        **({"role": meta["role"]} if meta["role"] else {}),
    }


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def write_run(
    run_dir: str | Path,
    *,
    command: Iterable[str] = (),
    kind: str = "trace",
    engine: str = "sglang",
    host: str | None = None,
    hosts: Iterable[str] | None = None,
    url: str | None = None,
    versions: Mapping | None = None,
    server_info: Mapping | None = None,
    gpu: Iterable[Mapping] | None = None,
    workload: Mapping | None = None,
    timings: Mapping | None = None,
    profile: Mapping | None = None,
    files: Iterable[Mapping] = (),
    members: Iterable[Mapping] | None = None,
    extra: Mapping | None = None,
) -> Path:
    """Write ``RUN_DIR/run.json`` atomically; returns its path. ``files`` entries need at least
    ``path`` (relative to RUN_DIR); missing sha256/bytes/rank/stage are filled in from the file."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for f in files:
        f = dict(f)
        if not f.get("path"):
            raise ValueError("a files entry needs a path")
        full = run_dir / f["path"]
        if f.get("sha256") is None or f.get("bytes") is None or "rank" not in f:
            base = file_entry(run_dir, full, host=f.get("host") or host, sha256=f.get("sha256"))
            base.update({k: v for k, v in f.items() if v is not None})
            f = base
        entries.append(f)
    hosts = list(hosts) if hosts is not None else ([host] if host else [])
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "perfscope", "version": __version__},
        "created": _now(),
        "kind": kind,
        "command": list(command),
        "host": host,
        "hosts": hosts,
        "url": url,
        "engine": engine,
        "versions": dict(versions or {}),
        "server_info": dict(server_info or {}),
        "gpu": [dict(g) for g in (gpu or [])],
        "workload": dict(workload or {}),
        "timings": dict(timings or {}),
        "profile": dict(profile or {}),
        "files": entries,
    }
    if members is not None:
        data["members"] = [dict(m) for m in members]
    if extra:
        for k, v in extra.items():
            data.setdefault(k, v)
    path = run_dir / RUN_FILE
    atomic_write_text(path, json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n", shared=True)
    return path


def update_run(run_dir: str | Path, **fields: Any) -> Path:
    """Merge top-level fields into an existing run.json (dicts are merged one level deep, e.g.
    ``update_run(d, timings={"bench": {...}})``), written atomically."""
    run_dir = Path(run_dir)
    data = load_json(run_dir)
    for k, v in fields.items():
        if isinstance(v, Mapping) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    path = run_dir / RUN_FILE
    atomic_write_text(path, json.dumps(_jsonable(data), indent=2) + "\n", shared=True)
    return path


def mark_incomplete(
    run_dir: str | Path,
    *,
    reason: str,
    command: Iterable[str] = (),
    engine: str = "sglang",
    host: str | None = None,
    remote_files: list | None = None,
) -> Path | None:
    """After a failed or interrupted trace: a run.json with ``"status": "incomplete"`` (which
    :func:`read_run` refuses in one line); the folder is made if need be. Traces already copied stay;
    ``remote_files`` (``trace --analyse-on-host``: the traces left on the host, with their paths and
    sha256) stay listed."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "perfscope", "version": __version__},
        "created": _now(),
        "kind": "trace",
        "status": "incomplete",
        "incomplete_reason": reason[:500],
        "command": list(command),
        "host": host,
        "engine": engine,
        "files": [],
    }
    if remote_files:
        data["remote_files"] = remote_files
    path = run_dir / RUN_FILE
    atomic_write_text(path, json.dumps(_jsonable(data), indent=2) + "\n", shared=True)
    return path
