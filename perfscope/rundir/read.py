"""Reading a run folder (:mod:`perfscope.rundir` describes it): run.json validated into a
:class:`~perfscope.rundir.schema.RunInfo` (:func:`read_run`), and the trace files of a folder with or
without run.json (:func:`trace_files`). Bad input: InputError with one line."""

from __future__ import annotations

from pathlib import Path

from perfscope.errors import InputError
from perfscope.rundir.schema import (
    RUN_FILE,
    SCHEMA_VERSION,
    TRACE_GLOBS,
    TRACES_DIR,
    RunInfo,
    TraceFile,
    load_json,
    parse_trace_name,
)


def _check(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise InputError(f"{path}: {what}")


_FILE_FIELDS = {"sha256": str, "bytes": int, "rank": int, "stage": str, "host": str, "parallel": dict}


def read_run(path: str | Path, *, verify: bool = False, _depth: int = 0) -> RunInfo:
    """Read and validate a run folder (or its run.json). Every listed trace must exist with its
    recorded size; ``verify=True`` also checks sha256. Raises InputError with one line."""
    path = Path(path)
    run_dir = path.parent if path.name == RUN_FILE and path.is_file() else path
    data = load_json(run_dir)
    rj = run_dir / RUN_FILE
    sv = data.get("schema_version")
    if not isinstance(sv, int) or isinstance(sv, bool):
        raise InputError(f"{rj}: no schema_version: not a perfscope run.json")
    if data.get("status") == "incomplete":
        raise InputError(
            f"{run_dir} is an incomplete run folder ({data.get('incomplete_reason') or 'the trace did not finish'}): "
            "trace again"
        )
    if sv > SCHEMA_VERSION:
        raise InputError(
            f"{rj} has schema_version {sv}, this perfscope reads up to {SCHEMA_VERSION}: upgrade perfscope"
        )
    for key, typ in (
        ("server_info", dict),
        ("versions", dict),
        ("gpu", list),
        ("workload", dict),
        ("timings", dict),
        ("files", list),
        ("command", list),
    ):
        if data.get(key) is not None:
            _check(isinstance(data[key], typ), rj, f"'{key}' should be a {typ.__name__}")
    files: list[TraceFile] = []
    root = run_dir.resolve()
    for key in ("tpot_ms", "ttft_ms"):
        v = (data.get("timings") or {}).get(key)
        _check(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
            rj,
            f"timings.{key} should be a number, not {type(v).__name__}",
        )
    for i, f in enumerate(data.get("files") or []):
        _check(isinstance(f, dict) and isinstance(f.get("path"), str) and f["path"], rj, f"files[{i}] has no path")
        for key, want in _FILE_FIELDS.items():
            v = f.get(key)
            _check(
                v is None or (isinstance(v, want) and not isinstance(v, bool)),
                rj,
                f"files[{i}].{key} should be {'an' if want is int else 'a'} {want.__name__}, not {type(v).__name__}",
            )
        full = (run_dir / f["path"]).resolve()
        _check(full == root or root in full.parents, rj, f"files[{i}] path {f['path']!r} leaves the run folder")
        tf = TraceFile(
            path=full,
            rel=f["path"],
            sha256=f.get("sha256"),
            bytes=f.get("bytes"),
            rank=f.get("rank"),
            stage=f.get("stage"),
            host=f.get("host"),
            parallel=f.get("parallel") or {},
            role=f.get("role") or parse_trace_name(f["path"])["role"],
        )
        if not full.is_file():
            raise InputError(f"trace {f['path']} listed in {rj} is missing")
        if tf.bytes is not None and full.stat().st_size != tf.bytes:
            raise InputError(
                f"trace {f['path']} is {full.stat().st_size} bytes, run.json says {tf.bytes}: truncated or replaced"
            )
        if verify:
            tf.verify()
        files.append(tf)
    members: list[RunInfo] = []
    _check(data.get("members") is None or isinstance(data["members"], list), rj, "'members' should be a list")
    for i, m in enumerate(data.get("members") or []):
        _check(isinstance(m, dict) and isinstance(m.get("dir"), str) and m["dir"], rj, f"members[{i}] has no dir")
        sub = (run_dir / m["dir"]).resolve()
        _check(root in sub.parents, rj, f"members[{i}] dir {m['dir']!r} is not a sub-folder of the run folder")
        _check(_depth == 0, rj, "a member run folder has members of its own")
        members.append(read_run(sub, verify=False, _depth=_depth + 1))
    if members and not files:
        files = [f for m in members for f in m.files]
    if members:
        first = members[0].data
        for k in ("server_info", "versions", "gpu", "timings", "workload", "engine", "profile"):
            if not data.get(k) and first.get(k):
                data[k] = first[k]
    files.sort(key=lambda f: (f.host or "", f.rank if f.rank is not None else 1 << 30, f.stage or "", f.rel))
    return RunInfo(dir=run_dir, data=data, files=files, members=members)


def trace_files(run_dir: str | Path) -> list[Path]:
    """The trace files of a run folder: those run.json lists, or, in a folder without run.json,
    ``traces/*.trace.json[.gz]`` (else the same in the folder itself). InputError if none."""
    run_dir = Path(run_dir)
    if (run_dir / RUN_FILE).is_file():
        files = read_run(run_dir).traces()
        if not files:
            raise InputError(f"{run_dir / RUN_FILE} lists no trace files")
        return files
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a folder")
    for d in (run_dir / TRACES_DIR, run_dir):
        found = sorted({p for g in TRACE_GLOBS for p in d.glob(g) if p.is_file()})
        if found:
            return found
    raise InputError(f"no trace files (*.trace.json, *.trace.json.gz) in {run_dir} or {run_dir / TRACES_DIR}")
