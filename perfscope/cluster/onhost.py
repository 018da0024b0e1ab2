"""``perfscope trace --analyse-on-host``: each rank's analysis run by the host's own Python, where the
traces are; only the results come back, the raw traces stay on the host.

For SSH-only deployments (no Ray cluster, a slow link, traces of GBs): the host needs Python 3.10+
with msgspec (:data:`perfscope.cluster.onhost_task.DEPENDENCIES`), not perfscope:

1. :func:`pick_python`: before anything is profiled, the first trusted interpreter (``--python``, else
   the server's own when it runs as the SSH user and this user or root owns it, else ``python3``)
   that has the dependencies; none: one line naming what each lacks.
2. :func:`analyse_run` (after the profile, with the run folder's run.json written listing the traces
   on the host under ``remote_files``): a zip of perfscope's Python files (:func:`package_zip`) and
   the job go by SFTP into a fresh folder on the host; the interpreter runs
   :mod:`perfscope.cluster.onhost_task` from the zip (the host's config built as ``diagnose`` builds
   it, :func:`perfscope.analysis.split.rank_task` on each rank file); its gzipped results (bounded
   read) are the only thing copied back, stored as ``RUN_DIR/ranks.json.gz`` with each raw trace's
   sha256 and size in run.json. The folder on the host is removed; the traces stay.
3. :func:`~perfscope.cluster.onhost_stored.stored_diagnosis`: ``perfscope diagnose RUN_DIR`` reduces the
   stored results (:func:`perfscope.analysis.split.reduce`): the diagnosis ``diagnose`` makes of the same
   traces copied into ``RUN_DIR/traces/`` (each rank's file named as there).
4. :func:`~perfscope.cluster.onhost_fetch.fetch`: ``trace --fetch RUN_DIR`` copies the raw traces
   (sha256-checked) into ``traces/``.

A failure (a dependency missing, a rank file gone, the analysis killed or past its timeout, the connection
lost) is one line; the run folder is then marked incomplete, never left with half the results."""

from __future__ import annotations

import functools
import gzip
import io as _io
import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from perfscope import __version__
from perfscope.errors import InputError, RemoteError

RESULTS = "ranks.json.gz"
WHERE = "host"
MAX_ZIP_BYTES = 16 << 20
JOB_PREFIX = "perfscope-analysis."
ANALYSIS_TIMEOUT_S = 3600.0

# run with each candidate interpreter: its version and which dependencies it cannot import
_PREFLIGHT_PY = r"""
import json, sys, importlib.util
miss = []
for m in sys.argv[1:]:
    try:
        if importlib.util.find_spec(m) is None:
            miss.append(m)
    except Exception:
        miss.append(m)
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "ok": sys.version_info >= (3, 10), "missing": miss}))
"""

# run from the zip: perfscope's own modules come first on the path, whatever the host has installed
_BOOT_PY = (
    "import sys; sys.path.insert(0, sys.argv[1]); from perfscope.cluster.onhost_task import main; "
    "sys.exit(main(sys.argv[2]))"
)


@functools.lru_cache(maxsize=1)
def package_zip() -> bytes:
    """perfscope's Python files (the installed package's, ``*.py`` only: no fixes, reports or example
    server) as a deterministic zip, at most MAX_ZIP_BYTES."""
    import zipfile

    import perfscope

    root = Path(perfscope.__file__).resolve().parent
    buf = _io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        dirs: set = set()
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root)
            if "__pycache__" in rel.parts or rel.parts[0].startswith("_") and len(rel.parts) > 1:
                continue
            for k in range(len(rel.parts)):  # folder entries: zipimport finds namespace packages by them
                d = "/".join(("perfscope",) + rel.parts[:k]) + "/"
                if d not in dirs:
                    dirs.add(d)
                    z.writestr(zipfile.ZipInfo(d, date_time=(1980, 1, 1, 0, 0, 0)), b"")
            info = zipfile.ZipInfo(f"perfscope/{rel.as_posix()}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, p.read_bytes())
    data = buf.getvalue()
    if len(data) > MAX_ZIP_BYTES:
        raise InputError(f"perfscope's package zip is {len(data)} bytes, over {MAX_ZIP_BYTES}: not shipped")
    return data


def pick_python(io, candidates: list[str], label: str) -> str:
    """The first of ``candidates`` that runs Python 3.10+ with the analysis' dependencies, or
    RemoteError (exit 3) naming what each lacks."""
    from perfscope.cluster.onhost_task import DEPENDENCIES

    why = []
    for py in dict.fromkeys(candidates):
        r = io.run([py, "-E", "-c", _PREFLIGHT_PY, *DEPENDENCIES], timeout=60)
        try:
            v = json.loads(r.stdout.strip().splitlines()[-1]) if r.ok else None
        except (ValueError, IndexError):
            v = None
        if not isinstance(v, dict):
            why.append(f"{py}: " + ("not found" if r.rc in (126, 127) else f"does not run (exit {r.rc})"))
        elif not v.get("ok"):
            why.append(f"{py}: Python {v.get('python')}, perfscope needs 3.10+")
        elif v.get("missing"):
            why.append(f"{py} (Python {v.get('python')}) lacks {', '.join(map(str, v['missing']))}")
        else:
            return py
    raise RemoteError(
        f"--analyse-on-host: no Python on {label} can run perfscope's analysis ({'; '.join(why)}): "
        f"install {' '.join(DEPENDENCIES)} there ({candidates[-1]} -m pip install "
        f"{' '.join(DEPENDENCIES)}), or name an interpreter that has it with --python"
    )


@dataclass
class HostAnalysis:
    interpreter: str
    results_bytes: int  # what came back (the gzipped results)
    sent_bytes: int  # what went to the host (the zip and the job)
    trace_bytes: int  # the raw traces left on the host
    workers: int
    seconds: float


def is_on_host(data: dict) -> bool:
    """A run.json whose traces stay on the host (analysed there) and are not fetched."""
    return (data.get("analysis") or {}).get("where") == WHERE and not data.get("files")


def run_folders(run_dir: Path, data: dict) -> list[tuple[str, Path]]:
    """(prefix of its files' paths in RUN_DIR's run.json, folder) of each folder with its own results."""
    if data.get("members"):
        return [(f"{m['dir']}/", run_dir / m["dir"]) for m in data["members"]]
    return [("", run_dir)]


def read_run_json(path: Path) -> dict:
    from perfscope.util import jsonio

    return jsonio.read(path, "run.json of a run folder; damaged?", expect=dict)


def analyse_run(
    io,
    run_dir: str | Path,
    *,
    python: str,
    label: str,
    config: Optional[dict] = None,
    timeout: float = ANALYSIS_TIMEOUT_S,
    say: Callable[[str], None] = lambda m: None,
) -> HostAnalysis:
    """Analyse, on the host ``io`` reaches, the traces run_dir's run.json lists under ``remote_files``
    (and its host-timing profile's, for the host's time per step), store the results in the run folder
    and complete its run.json. Raises RemoteError / InputError with one line; nothing is stored then."""
    from perfscope import rundir
    from perfscope.util import limits
    from perfscope.util.files import atomic_write_bytes

    run_dir = Path(run_dir)
    data = read_run_json(run_dir / rundir.RUN_FILE)
    entries = list(data.get("remote_files") or [])
    if not entries:
        raise InputError(f"{run_dir}: run.json lists no trace on the host (remote_files) to analyse there")
    ht_dir = run_dir / rundir.HOST_TIMING_DIR
    ht_data = read_run_json(ht_dir / rundir.RUN_FILE) if (ht_dir / rundir.RUN_FILE).is_file() else {}
    ht_entries = [e for e in ht_data.get("remote_files") or [] if e.get("role") != "frontend"]

    def spec(e: dict) -> dict:
        return {
            "path": e["remote_path"],
            "rank": e.get("rank"),
            "stage": e.get("stage"),
            "host": e.get("host"),
            "role": e.get("role"),
            "analyse": e.get("role") != "frontend",
        }

    t0 = time.perf_counter()
    job_dir = io.mkdtemp("/tmp", JOB_PREFIX)
    try:
        out = f"{job_dir}/{RESULTS}"
        job = {
            "host": label,
            "run_info": data,
            "config": config or {},
            "files": [spec(e) for e in entries],
            "host_timing": [spec(e) for e in ht_entries],
            "out": out,
            "perfscope": __version__,
        }
        zdata = package_zip()
        jdata = json.dumps(job).encode()
        io.put(f"{job_dir}/perfscope.zip", zdata)
        io.put(f"{job_dir}/job.json", jdata)
        say(
            f"analysing {sum(1 for e in entries if e.get('role') != 'frontend')} trace file(s) on the host with {python}"
        )
        r = io.run([python, "-E", "-c", _BOOT_PY, f"{job_dir}/perfscope.zip", f"{job_dir}/job.json"], timeout=timeout)
        if not r.ok:
            raise _failure(r, label)
        cap = limits.max_reply_bytes()
        raw = io.get(out, cap)
        res = gunzip_json(raw, cap, f"the analysis results from {label}")
    finally:
        io.discard_dir(job_dir, prefix=JOB_PREFIX)
    hashes = {h["path"]: h for h in res.get("files") or []}
    for e in entries + ht_entries:
        h = hashes.get(e["remote_path"])
        if h is None:
            raise RemoteError(f"the analysis on {label} did not hash {e['remote_path']}")
        e["sha256"], e["bytes"] = h["sha256"], h["bytes"]
    by_remote = {e["remote_path"]: e["path"] for e in entries}
    stored = {
        "perfscope": __version__,
        "config": config or {},
        "ranks": [{"path": by_remote[x["path"]], "ok": x["ok"]} for x in res.get("ranks") or []],
    }
    atomic_write_bytes(
        run_dir / RESULTS, gzip.compress(json.dumps(stored, separators=(",", ":")).encode(), mtime=0), shared=True
    )
    if ht_entries:
        rundir.update_run(ht_dir, remote_files=ht_entries)
    ha = HostAnalysis(
        interpreter=python,
        results_bytes=len(raw),
        sent_bytes=len(zdata) + len(jdata),
        trace_bytes=sum(e["bytes"] for e in entries + ht_entries),
        workers=int(res.get("workers") or 1),
        seconds=round(time.perf_counter() - t0, 3),
    )
    rundir.update_run(
        run_dir,
        remote_files=entries,
        analysis={
            "where": WHERE,
            "status": "done",
            "results": RESULTS,
            "interpreter": python,
            "perfscope": __version__,
            "workers": ha.workers,
            "results_bytes": ha.results_bytes,
            "sent_bytes": ha.sent_bytes,
            "trace_bytes": ha.trace_bytes,
            "seconds": ha.seconds,
        },
    )
    return ha


def _failure(r, label: str) -> Exception:
    """The one line for a failed run of the host's analysis."""
    try:
        got = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        got = None
    if isinstance(got, dict) and got.get("error"):
        cls = InputError if got.get("exit_code") == 2 else RemoteError
        return cls(f"the analysis on {label} failed: {' '.join(str(got['error']).split())[:600]}")
    # sshd reports a command killed by a signal with no exit status (paramiko: -1); a shell says 128 + N
    how = "killed by a signal" if r.rc == -1 else f"killed by signal {r.rc - 128}" if r.rc > 128 else f"exit {r.rc}"
    last = (r.stderr.strip().splitlines() or [""])[-1][:200]
    return RemoteError(
        f"the analysis on {label} stopped ({how}){': ' + last if last else ''}; "
        "the traces stay on the host (perfscope trace --fetch copies them)"
    )


def gunzip_json(raw: bytes, cap: int, what: str):
    """The JSON object gzipped in ``raw`` (at most ``cap`` bytes once unzipped); RemoteError naming ``what``
    when it is not one."""
    from perfscope.util.limits import too_big

    d = zlib.decompressobj(31)
    try:
        text = d.decompress(raw, cap + 1)
    except zlib.error:
        raise RemoteError(f"{what} are not gzip: damaged") from None
    if len(text) > cap or d.unconsumed_tail:
        raise RemoteError(f"{what}: " + too_big("the results", cap, "PERFSCOPE_MAX_REPLY_MB", "MB"))
    try:
        out = json.loads(text)
    except ValueError:
        raise RemoteError(f"{what} are not JSON: damaged") from None
    if not isinstance(out, dict):
        raise RemoteError(f"{what} are not a JSON object: damaged")
    return out
