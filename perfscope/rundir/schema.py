"""The run folder's names and its typed view: run.json's schema version, the folder's fixed names, what a
trace file's name says (:func:`parse_trace_name`), a listed trace (:class:`TraceFile`) and a run folder as
read (:class:`RunInfo`); the format itself: :mod:`perfscope.rundir`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from perfscope.errors import InputError
from perfscope.util.files import sha256_file

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
FRONTEND_NOTE = (
    "vLLM's front-end process (API server + AsyncLLM: HTTP, tokenizing, output processing; no model step): not a rank"
)


def parse_trace_name(name: str) -> dict:
    """Rank, stage and parallel coordinates from a trace file name, as SGLang (and vLLM) name
    them. Unknown parts are None: ``{"rank", "stage", "parallel": {"tp", "dp", "pp", "ep"},
    "role"}``; ``role`` is "frontend" for vLLM's front-end process trace (no rank), else None."""
    base = Path(name).name
    stem = re.sub(r"(\.pt)?\.trace\.json(\.gz)?$|\.json(\.gz)?$", "", base)
    if _FRONTEND.search(stem):
        return {
            "rank": None,
            "stage": None,
            "parallel": {"tp": None, "dp": None, "pp": None, "ep": None},
            "role": "frontend",
        }
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


def load_json(run_dir: Path) -> dict:
    path = run_dir / RUN_FILE
    if not run_dir.exists():
        raise InputError(f"run folder {run_dir} does not exist")
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a run folder (expected a folder with {RUN_FILE} and {TRACES_DIR}/)")
    if not path.is_file():
        raise InputError(f"{run_dir} has no {RUN_FILE}: not a perfscope run folder (perfscope trace makes one)")
    from perfscope.util import jsonio

    return jsonio.read(path, "run.json of a run folder; damaged?", expect=dict)
