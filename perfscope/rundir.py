"""The run folder: what ``perfscope trace`` (and ``bench``) leave behind, and what ``diagnose``,
``report`` and ``compare`` read.

Layout::

    RUN_DIR/run.json                    what was run, where, versions, server config, timings, files
    RUN_DIR/traces/*.trace.json[.gz]    one Kineto chrome trace per rank (per stage), as the server named it

Several hosts (``trace --host a --host b``): every host gets a complete run folder of its own,
``RUN_DIR/<host>/``, and ``RUN_DIR/run.json`` lists them under ``members`` and lists every host's
trace files (paths relative to RUN_DIR). ``read_run(RUN_DIR)`` then returns the first host's
``server_info`` / ``versions`` / ``gpu`` / ``timings`` at the top and all hosts in ``members``.

run.json (schema_version 1)::

    {
      "schema_version": 1,
      "tool": {"name": "perfscope", "version": "0.1.0"},
      "created": "2025-01-01T12:00:00+00:00",   # UTC, ISO 8601
      "kind": "trace" | "bench" | "multi",
      "command": ["perfscope", "trace", ...],   # argv with secrets removed
      "host": "gpu1" | null,                    # label of the host (null: local --url)
      "hosts": ["gpu1", ...],
      "url": "http://...",                      # how the server was reached (forwarded or direct)
      "engine": "sglang" | "vllm",
      "versions": {"sglang": "0.5.5", "flashinfer": "...", "torch": "...", "python": "...", "server": "..."},
      "server_info": {...},                     # the server's /server_info (or /get_server_info) dict
      "gpu": [{"index": 0, "name": "NVIDIA H200", "clocks_sm_mhz": ..., ...}],
      "workload": {"concurrency": 1, "input_len": ..., "output_len": ..., "requests": ..., ...},
      "timings": {"ttft_ms": ..., "tpot_ms": ..., "itl_ms": {"p50": ..., "p90": ..., "p99": ...}, ...},
      "profile": {"output_dir": "/tmp/...", "num_steps": 20, "with_stack": true, ...},
      "files": [{"path": "traces/...trace.json.gz", "sha256": "...", "bytes": 123,
                 "rank": 0, "stage": "DECODE" | "EXTEND" | null, "host": "gpu1",
                 "parallel": {"tp": 0, "dp": null, "pp": null, "ep": null}}],
      "members": [{"host": "gpu1", "dir": "gpu1"}]   # "multi" only
    }

``trace --analyse-on-host`` (:mod:`perfscope.cluster.onhost`): ``files`` is empty (no trace here),
``remote_files`` lists each trace where it stays (the ``files`` fields, plus ``remote_path`` on its
host; ``path`` is where ``trace --fetch`` puts it), ``analysis`` says how it went (``where: "host"``,
``status``, ``results: "ranks.json.gz"``, interpreter, bytes), and ``ranks.json.gz`` holds the results.

Unknown keys are kept (``RunInfo.data``), so later versions may add fields without a bump.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from perfscope import __version__
from perfscope.errors import InputError
from perfscope.util.files import atomic_write_text, sha256_file

__all__ = [
    "SCHEMA_VERSION",
    "RUN_FILE",
    "TRACES_DIR",
    "HOST_TIMING_DIR",
    "TraceFile",
    "RunInfo",
    "write_run",
    "update_run",
    "read_run",
    "trace_files",
    "parse_trace_name",
    "file_entry",
]

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
TRACES_DIR = "traces"
# a run folder of its own inside a trace's: the short GPU-only profile (`trace --gpu-only`) taken with it,
# whose host timeline carries almost none of the CPU profiler's cost (diagnose reads it for host time)
HOST_TIMING_DIR = "host-timing"
TRACE_GLOBS = ("*.trace.json.gz", "*.trace.json", "*.pt.trace.json.gz", "*.json.gz", "*.json.xz")

# SGLang 0.5.x: [prefix-]{time}-TP-{r}[-DP-{d}][-PP-{p}][-EP-{e}][-EXTEND|-DECODE].trace.json.gz
# SGLang 0.4.6: {id}-TP-{r}.trace.json.gz.  vLLM / torch handlers: ...rank{r}... or ...rank-{r}...
_PAR = re.compile(r"(?:^|[-_.])(TP|DP|PP|EP)-(\d+)(?=$|[-_.])")
_STAGE = re.compile(r"-(EXTEND|DECODE)(?=\.|$)")
_RANK = re.compile(r"(?:^|[-_.])rank[-_]?(\d+)(?=$|[-_.])", re.IGNORECASE)
# vLLM (0.11+): besides each worker's rank<N>.<ns>.pt.trace.json.gz, its front-end process (the API
# server and AsyncLLM: HTTP, tokenizing, output processing; Python/CPU only) writes
# <host>_<pid>.async_llm.<ns>.pt.trace.json.gz. Not a rank: it runs no model step.
_FRONTEND = re.compile(r"(?:^|[._-])async_llm(?=$|[._-])")
FRONTEND_NOTE = ("vLLM's front-end process (API server + AsyncLLM: HTTP, tokenizing, output processing; "
                 "no model step): not a rank")


def parse_trace_name(name: str) -> dict:
    """Rank, stage and parallel coordinates from a trace file name, as SGLang (and vLLM) name
    them. Unknown parts are None: ``{"rank", "stage", "parallel": {"tp", "dp", "pp", "ep"},
    "role"}``; ``role`` is "frontend" for vLLM's front-end process trace (no rank), else None."""
    base = Path(name).name
    stem = re.sub(r"(\.pt)?\.trace\.json(\.gz)?$|\.json(\.gz)?$", "", base)
    if _FRONTEND.search(stem):
        return {"rank": None, "stage": None, "parallel": {"tp": None, "dp": None, "pp": None, "ep": None},
                "role": "frontend"}
    par: dict[str, int | None] = {"tp": None, "dp": None, "pp": None, "ep": None}
    for kind, num in _PAR.findall(stem):
        par[kind.lower()] = int(num)
    m = _STAGE.search(stem)
    stage = m.group(1) if m else None
    rank = par["tp"]
    if rank is None:
        m = _RANK.search(stem)
        rank = int(m.group(1)) if m else None
    return {"rank": rank, "stage": stage, "parallel": par, "role": None}


@dataclass
class TraceFile:
    path: Path  # absolute path on this machine
    rel: str  # as written in run.json (relative to the run folder)
    sha256: str | None
    bytes: int | None
    rank: int | None
    stage: str | None
    host: str | None = None
    parallel: dict = field(default_factory=dict)
    role: str | None = None  # "frontend": vLLM's front-end process trace, not a rank

    def verify(self) -> None:
        """Raise InputError if the file is missing, of another size, or of another sha256."""
        if not self.path.is_file():
            raise InputError(f"trace {self.rel} listed in run.json is missing from {self.path.parent}")
        size = self.path.stat().st_size
        if self.bytes is not None and size != self.bytes:
            raise InputError(f"trace {self.rel} is {size} bytes, run.json says {self.bytes}: truncated or replaced")
        if self.sha256 and sha256_file(self.path) != self.sha256:
            raise InputError(f"trace {self.rel} does not match its sha256 in run.json: damaged or replaced")


@dataclass
class RunInfo:
    """A run folder as read by :func:`read_run`. ``data`` is the whole run.json."""

    dir: Path
    data: dict
    files: list[TraceFile]
    members: list["RunInfo"] = field(default_factory=list)

    schema_version = property(lambda self: self.data.get("schema_version"))
    kind = property(lambda self: self.data.get("kind", "trace"))
    created = property(lambda self: self.data.get("created"))
    command = property(lambda self: self.data.get("command") or [])
    host = property(lambda self: self.data.get("host"))
    hosts = property(lambda self: self.data.get("hosts") or ([self.data["host"]] if self.data.get("host") else []))
    engine = property(lambda self: self.data.get("engine", "sglang"))
    url = property(lambda self: self.data.get("url"))
    versions = property(lambda self: self.data.get("versions") or {})
    server_info = property(lambda self: self.data.get("server_info") or {})
    gpu = property(lambda self: self.data.get("gpu") or [])
    workload = property(lambda self: self.data.get("workload") or {})
    timings = property(lambda self: self.data.get("timings") or {})
    profile = property(lambda self: self.data.get("profile") or {})

    @property
    def tool_version(self) -> str | None:
        return (self.data.get("tool") or {}).get("version")

    def traces(self, stage: str | None = None) -> list[Path]:
        """Absolute trace paths, ordered by host then rank; ``stage="DECODE"`` keeps files of that
        stage plus files with no stage in their name."""
        out = [f for f in self.files if stage is None or f.stage in (None, stage)]
        return [f.path for f in out]

    def verify(self) -> None:
        """Check every listed file's size and sha256 (InputError on the first bad one)."""
        for f in self.files:
            f.verify()


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def file_entry(run_dir: str | Path, path: str | Path, *, host: str | None = None,
               sha256: str | None = None) -> dict:
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


def write_run(run_dir: str | Path, *, command: Iterable[str] = (), kind: str = "trace",
              engine: str = "sglang", host: str | None = None, hosts: Iterable[str] | None = None,
              url: str | None = None, versions: Mapping | None = None,
              server_info: Mapping | None = None, gpu: Iterable[Mapping] | None = None,
              workload: Mapping | None = None, timings: Mapping | None = None,
              profile: Mapping | None = None, files: Iterable[Mapping] = (),
              members: Iterable[Mapping] | None = None, extra: Mapping | None = None) -> Path:
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
    data = _load_json(run_dir)
    for k, v in fields.items():
        if isinstance(v, Mapping) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    path = run_dir / RUN_FILE
    atomic_write_text(path, json.dumps(_jsonable(data), indent=2) + "\n", shared=True)
    return path


def _load_json(run_dir: Path) -> dict:
    path = run_dir / RUN_FILE
    if not run_dir.exists():
        raise InputError(f"run folder {run_dir} does not exist")
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a run folder (expected a folder with {RUN_FILE} and {TRACES_DIR}/)")
    if not path.is_file():
        raise InputError(f"{run_dir} has no {RUN_FILE}: not a perfscope run folder (perfscope trace makes one)")
    from perfscope.util import jsonio

    return jsonio.read(path, "run.json of a run folder; damaged?", expect=dict)


def _check(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise InputError(f"{path}: {what}")


def mark_incomplete(run_dir: str | Path, *, reason: str, command: Iterable[str] = (), engine: str = "sglang",
                    host: str | None = None, remote_files: list | None = None) -> Path | None:
    """After a failed or interrupted trace: a run.json with ``"status": "incomplete"`` (which
    :func:`read_run` refuses in one line); the folder is made if need be. Traces already copied stay;
    ``remote_files`` (``trace --analyse-on-host``: the traces left on the host, with their paths and
    sha256) stay listed."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {"schema_version": SCHEMA_VERSION, "tool": {"name": "perfscope", "version": __version__},
            "created": _now(), "kind": "trace", "status": "incomplete", "incomplete_reason": reason[:500],
            "command": list(command), "host": host, "engine": engine, "files": []}
    if remote_files:
        data["remote_files"] = remote_files
    path = run_dir / RUN_FILE
    atomic_write_text(path, json.dumps(_jsonable(data), indent=2) + "\n", shared=True)
    return path


_FILE_FIELDS = {"sha256": str, "bytes": int, "rank": int, "stage": str, "host": str, "parallel": dict}


def read_run(path: str | Path, *, verify: bool = False, _depth: int = 0) -> RunInfo:
    """Read and validate a run folder (or its run.json). Every listed trace must exist with its
    recorded size; ``verify=True`` also checks sha256. Raises InputError with one line."""
    path = Path(path)
    run_dir = path.parent if path.name == RUN_FILE and path.is_file() else path
    data = _load_json(run_dir)
    rj = run_dir / RUN_FILE
    sv = data.get("schema_version")
    if not isinstance(sv, int) or isinstance(sv, bool):
        raise InputError(f"{rj}: no schema_version: not a perfscope run.json")
    if data.get("status") == "incomplete":
        raise InputError(f"{run_dir} is an incomplete run folder ({data.get('incomplete_reason') or 'the trace did not finish'}): "
                         "trace again")
    if sv > SCHEMA_VERSION:
        raise InputError(f"{rj} has schema_version {sv}, this perfscope reads up to {SCHEMA_VERSION}: upgrade perfscope")
    for key, typ in (("server_info", dict), ("versions", dict), ("gpu", list), ("workload", dict),
                     ("timings", dict), ("files", list), ("command", list)):
        if data.get(key) is not None:
            _check(isinstance(data[key], typ), rj, f"'{key}' should be a {typ.__name__}")
    files: list[TraceFile] = []
    root = run_dir.resolve()
    for key in ("tpot_ms", "ttft_ms"):
        v = (data.get("timings") or {}).get(key)
        _check(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)), rj,
               f"timings.{key} should be a number, not {type(v).__name__}")
    for i, f in enumerate(data.get("files") or []):
        _check(isinstance(f, dict) and isinstance(f.get("path"), str) and f["path"], rj, f"files[{i}] has no path")
        for key, want in _FILE_FIELDS.items():
            v = f.get(key)
            _check(v is None or (isinstance(v, want) and not isinstance(v, bool)), rj,
                   f"files[{i}].{key} should be {'an' if want is int else 'a'} {want.__name__}, not {type(v).__name__}")
        full = (run_dir / f["path"]).resolve()
        _check(full == root or root in full.parents, rj, f"files[{i}] path {f['path']!r} leaves the run folder")
        tf = TraceFile(
            path=full, rel=f["path"], sha256=f.get("sha256"), bytes=f.get("bytes"),
            rank=f.get("rank"), stage=f.get("stage"), host=f.get("host"), parallel=f.get("parallel") or {},
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
