"""Turn the user's PATH arguments into trace files: files, SGLang profile folders, run folders.

A run folder (made by ``perfscope trace``) holds ``run.json`` and ``traces/``; its server config
comes along. SGLang names one file per rank:
``[prefix-]{time}-TP-{r}[-DP-{d}][-PP-{p}][-EP-{e}][-EXTEND|-DECODE].trace.json.gz``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from perfscope.errors import InputError
from perfscope.rundir import FRONTEND_NOTE, HOST_TIMING_DIR, RUN_FILE, parse_trace_name, read_run

_TRACE_SUFFIXES = (".json", ".json.gz", ".json.xz")


def trace_stem(name: str) -> str:
    """A trace file's name without its trace suffixes: ``x.pt.trace.json.gz`` -> ``x``."""
    stem = name
    for suffix in (".gz", ".xz", ".json", ".trace", ".pt"):
        stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
    return stem


@dataclass
class TraceFile:
    path: Path
    rank: Optional[int] = None  # from the name; the trace's distributedInfo may refine it
    stage: Optional[str] = None  # "EXTEND" | "DECODE" when SGLang split the profile by stage
    host: Optional[str] = None  # the host it came from (a several-host run folder of `perfscope trace`)
    role: Optional[str] = None  # "frontend": vLLM's front-end process trace (not a rank; not analysed)


@dataclass
class TraceSet:
    files: list[TraceFile]
    run_dir: Optional[Path] = None
    run_info: dict = field(default_factory=dict)  # run.json as written by `perfscope trace`
    # JSON files in a given folder that are not profiler traces (a measured.json beside the
    # traces): [{"path", "why"}], skipped with a note instead of refusing the whole folder
    skipped: list[dict] = field(default_factory=list)
    # graph-capture traces found in a `capture_traces/` subfolder (SGLang --enable-profile-cuda-graph,
    # vLLM's capture dumps): the capture map, as --capture-trace gives it, not more ranks
    capture: list[Path] = field(default_factory=list)
    # files given more than once (the same path, or byte-identical copies): analysed once
    duplicates: list[dict] = field(default_factory=list)
    frontend: list[Path] = field(default_factory=list)  # vLLM front-end traces: not ranks, not analysed
    # the run folder's GPU-only profile (host-timing/): read for the host's time per step, not as ranks
    host_timing: list[TraceFile] = field(default_factory=list)

    @property
    def server_info(self) -> dict:
        return self.run_info.get("server_info") or {}


def _is_trace(p: Path) -> bool:
    n = p.name
    return n.endswith(_TRACE_SUFFIXES) and not n.endswith(("run.json", "bench.json", "demo.json"))


_SNIFF_CHUNK = 1 << 16


def not_a_trace(p: Path) -> Optional[str]:
    """Why a JSON file found in a folder is surely not a Kineto trace (None: it may be one, and the
    reader decides, with its own precise error for a truncated or damaged trace).

    A trace is a JSON object with a ``traceEvents`` key, which torch writes near the start; the
    file is read (inflated) in chunks until the key shows up, so a real trace costs one chunk and
    only small non-trace files are read whole. Unreadable or truncated files are left to the reader."""
    import gzip
    import lzma
    import zlib

    try:
        opener = gzip.open if p.name.endswith(".gz") else lzma.open if p.name.endswith(".xz") else open
        with opener(p, "rb") as f:
            head = b""
            first = None
            while True:
                chunk = f.read(_SNIFF_CHUNK)
                if not chunk:
                    break
                if first is None:
                    stripped = chunk.lstrip()
                    if stripped:
                        first = stripped[:1]
                        if first not in (b"{", b"\xef"):  # a JSON object (or a BOM before it)
                            return "not a JSON object"
                if b'"traceEvents"' in head[-16:] + chunk:
                    return None
                head = chunk
    except (OSError, EOFError, zlib.error, lzma.LZMAError):
        return None
    return "no 'traceEvents'" if first is not None else "empty"


CAPTURE_DIR = "capture_traces"


def _in_capture_dir(q: Path, root: Path) -> bool:
    try:
        parts = q.relative_to(root).parts[:-1]
    except ValueError:
        parts = q.parts[:-1]
    return CAPTURE_DIR in parts


def _fingerprint(p: Path) -> tuple:
    """Size and a hash of the first and last MiB: tells byte-identical copies apart cheaply."""
    import hashlib

    try:
        size = p.stat().st_size
        h = hashlib.sha256()
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(size - (1 << 20))
                h.update(f.read(1 << 20))
        return (size, h.hexdigest())
    except OSError:
        return (str(p),)


def _describe(p: Path) -> TraceFile:
    info = parse_trace_name(p.name)
    return TraceFile(path=p, rank=info["rank"], stage=info["stage"], role=info["role"])


def discover(paths: Sequence[str | Path]) -> TraceSet:
    """Expand paths into trace files (sorted by rank, then name). Nothing usable -> InputError."""
    files: list[TraceFile] = []
    run_dir: Optional[Path] = None
    run_info: dict = {}
    skipped: list[dict] = []
    capture: list[Path] = []
    host_timing: list[TraceFile] = []
    if not paths:
        raise InputError(
            "no trace given: pass a trace file (.json/.json.gz/.json.xz), a profile folder or a run folder"
        )
    for raw in paths:
        p = Path(raw)
        if str(raw) == "-":
            raise InputError(
                "-: perfscope does not read traces from stdin (they are read twice, in parallel): "
                "save the trace to a file and pass its path"
            )
        if not p.exists():
            raise InputError(f"{p}: no such file or folder")
        if p.is_dir() and (p / RUN_FILE).is_file():
            run = read_run(p)  # the run folder's own reader: validated, sizes checked
            run_dir, run_info = p, run.data
            if not run.files and run.data.get("remote_files"):
                hosts = ", ".join(sorted({str(e.get("host")) for e in run.data["remote_files"]}))
                raise InputError(
                    f"{p}: its traces stay on {hosts} (trace --analyse-on-host): perfscope diagnose {p} "
                    f"alone reads its results; perfscope trace --fetch {p} copies the traces here"
                )
            if not run.files:
                raise InputError(f"{p}: run folder lists no trace files")
            files.extend(
                TraceFile(path=f.path, rank=f.rank, stage=f.stage, host=f.host, role=f.role) for f in run.files
            )
            if (p / HOST_TIMING_DIR / RUN_FILE).is_file():
                host_timing = [
                    TraceFile(path=f.path, rank=f.rank, stage=f.stage, host=f.host)
                    for f in read_run(p / HOST_TIMING_DIR).files
                    if f.role != "frontend"
                ]
        elif p.is_dir():
            try:
                found = sorted(q for q in p.rglob("*") if q.is_file() and _is_trace(q))
            except (RecursionError, OSError) as e:
                raise InputError(f"{p}: cannot walk this folder ({type(e).__name__}: too deep or unreadable)") from None
            kept = []
            for q in found:
                why = not_a_trace(q)  # TraceLens writes execution_details.json (an array) into capture_traces/
                if why:
                    skipped.append({"path": str(q), "why": f"not a profiler trace ({why})"})
                elif _in_capture_dir(q, p):
                    capture.append(q)
                else:
                    kept.append(q)
            if not kept:
                extra = f"; skipped {len(found)} other JSON file(s), e.g. {found[0].name}" if found else ""
                raise InputError(f"{p}: no trace files (*.json, *.json.gz, *.json.xz) in this folder{extra}")
            files.extend(_describe(q) for q in kept)
        else:
            files.append(_describe(p))
    # the same file twice (or a byte-identical copy) is one rank, not two
    seen: dict = {}
    unique: list[TraceFile] = []
    duplicates: list[dict] = []
    for f in files:
        keys: list[tuple[str, object]] = [("path", str(f.path.resolve()))]
        if len(files) > 1:
            keys.append(("bytes", _fingerprint(f.path)))
        hit = next((seen[k] for k in keys if k in seen), None)
        if hit is not None:
            duplicates.append(
                {
                    "path": str(f.path),
                    "same_as": str(hit.path),
                    "how": "same path" if keys[0] in seen else "identical bytes",
                }
            )
            continue
        for k in keys:
            seen[k] = f
        unique.append(f)
    files = unique
    frontend = [f.path for f in files if f.role == "frontend"]
    files = [f for f in files if f.role != "frontend"]
    if not files:
        raise InputError(f"{frontend[0].name}: {FRONTEND_NOTE}; pass the workers' rank<N>.*.pt.trace.json.gz")
    files.sort(key=lambda f: (f.host or "", f.rank if f.rank is not None else -1, f.stage or "", f.path.name))
    return TraceSet(
        files=files,
        run_dir=run_dir,
        run_info=run_info,
        skipped=skipped,
        capture=capture,
        duplicates=duplicates,
        frontend=frontend,
        host_timing=host_timing,
    )
