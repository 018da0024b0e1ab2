"""Turn the user's PATH arguments into trace files: files, SGLang profile folders, run folders.

A run folder (made by ``perfscope trace``) holds ``run.json`` and ``traces/``; its server config
comes along. SGLang names one file per rank:
``[prefix-]{time}-TP-{r}[-DP-{d}][-PP-{p}][-EP-{e}][-EXTEND|-DECODE].trace.json.gz``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from perfscope.capture.rundir import FRONTEND_NOTE, RUN_FILE, parse_trace_name, read_run
from perfscope.errors import InputError

_TRACE_SUFFIXES = (".json", ".json.gz")


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
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (file, why it is not analysed)

    @property
    def server_info(self) -> dict:
        return self.run_info.get("server_info") or {}


def _is_trace(p: Path) -> bool:
    n = p.name
    return n.endswith(_TRACE_SUFFIXES) and not n.endswith(("run.json", "bench.json", "demo.json"))


def _describe(p: Path) -> TraceFile:
    info = parse_trace_name(p.name)
    return TraceFile(path=p, rank=info["rank"], stage=info["stage"], role=info["role"])


def discover(paths: list[str | Path]) -> TraceSet:
    """Expand paths into trace files (sorted by rank, then name). Nothing usable -> InputError."""
    files: list[TraceFile] = []
    run_dir: Optional[Path] = None
    run_info: dict = {}
    if not paths:
        raise InputError("no trace given: pass a trace file (.json/.json.gz), a profile folder or a run folder")
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(f"{p}: no such file or folder")
        if p.is_dir() and (p / RUN_FILE).is_file():
            run = read_run(p)  # the run folder's own reader: validated, sizes checked
            run_dir, run_info = p, run.data
            if not run.files:
                raise InputError(f"{p}: run folder lists no trace files")
            files.extend(TraceFile(path=f.path, rank=f.rank, stage=f.stage, host=f.host, role=f.role)
                         for f in run.files)
        elif p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and _is_trace(q))
            if not found:
                raise InputError(f"{p}: no trace files (*.json, *.json.gz) in this folder")
            files.extend(_describe(q) for q in found)
        else:
            files.append(_describe(p))
    skipped = [(f.path, FRONTEND_NOTE) for f in files if f.role == "frontend"]
    files = [f for f in files if f.role != "frontend"]
    if not files:
        raise InputError(f"{skipped[0][0].name}: {FRONTEND_NOTE}; pass the workers' rank<N>.*.pt.trace.json.gz")
    files.sort(key=lambda f: (f.host or "", f.rank if f.rank is not None else -1, f.stage or "", f.path.name))
    return TraceSet(files=files, run_dir=run_dir, run_info=run_info, skipped=skipped)
