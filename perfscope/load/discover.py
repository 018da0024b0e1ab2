"""Turn the user's PATH arguments into trace files: files, SGLang profile folders, run folders.

A run folder (made by ``perfscope trace``) holds ``run.json`` and ``traces/``; its server config
comes along. SGLang names one file per rank:
``[prefix-]{time}-TP-{r}[-DP-{d}][-PP-{p}][-EP-{e}][-EXTEND|-DECODE].trace.json.gz``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from perfscope.errors import InputError

_TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_RE = re.compile(r"-TP-(\d+)(?:-DP-(\d+))?(?:-PP-(\d+))?(?:-EP-(\d+))?")
_STAGE_RE = re.compile(r"-(EXTEND|DECODE)(?=\.|-|$)")
_GENERIC_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.I)


@dataclass
class TraceFile:
    path: Path
    rank: Optional[int] = None  # from the name; the trace's distributedInfo may refine it
    stage: Optional[str] = None  # "EXTEND" | "DECODE" when SGLang split the profile by stage


@dataclass
class TraceSet:
    files: list[TraceFile]
    run_dir: Optional[Path] = None
    run_info: dict = field(default_factory=dict)  # run.json as written by `perfscope trace`

    @property
    def server_info(self) -> dict:
        return self.run_info.get("server_info") or {}


def _is_trace(p: Path) -> bool:
    n = p.name
    return n.endswith(_TRACE_SUFFIXES) and not n.endswith(("run.json", "bench.json"))


def _describe(p: Path) -> TraceFile:
    m = _RANK_RE.search(p.name)
    rank = int(m.group(1)) if m else None
    if rank is None:
        g = _GENERIC_RANK_RE.search(p.name)
        rank = int(g.group(1)) if g else None
    s = _STAGE_RE.search(p.name)
    return TraceFile(path=p, rank=rank, stage=s.group(1) if s else None)


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
        if p.is_dir():
            if (p / "run.json").is_file():
                run_dir = p
                run_info = _read_run_json(p / "run.json")
                base = p / "traces" if (p / "traces").is_dir() else p
            else:
                base = p
            found = sorted(q for q in base.rglob("*") if q.is_file() and _is_trace(q))
            if not found:
                raise InputError(f"{p}: no trace files (*.json, *.json.gz) in this folder")
            files.extend(_describe(q) for q in found)
        else:
            files.append(_describe(p))
    files.sort(key=lambda f: (f.rank if f.rank is not None else -1, f.stage or "", f.path.name))
    return TraceSet(files=files, run_dir=run_dir, run_info=run_info)


def _read_run_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: unreadable run file ({e})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a perfscope run file")
    return data
