"""Where a bench result goes: ``bench.json`` in a run folder, its summary in ``run.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from perfscope.capture import rundir
from perfscope.util.files import atomic_write_text

BENCH_FILE = "bench.json"


def run_summary(res) -> dict:
    """What run.json keeps of a bench result (``timings`` or ``timings.bench``)."""
    d = {k: v for k, v in res.to_dict(per_request=False).items() if k not in ("workload", "server", "errors")}
    d["concurrency"] = (res.workload or {}).get("concurrency")  # diagnose uses a bench of the traced concurrency
    return d


def store(out: Path, res, url: str, host: Optional[str], info: dict, argv: list[str]) -> Path:
    """Write ``bench.json`` into ``out``: added to an existing run folder's timings (a trace run),
    or as a run folder of its own (kind ``bench``). Returns the bench file's path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / BENCH_FILE
    atomic_write_text(path, json.dumps(res.to_dict(), indent=2) + "\n")
    summary = run_summary(res)
    if (out / rundir.RUN_FILE).is_file():  # an existing run folder (e.g. a trace): add the bench to it
        rundir.update_run(out, timings={"bench": summary})
    else:
        rundir.write_run(out, command=argv, kind="bench", engine=info.get("engine") or "sglang", host=host, url=url,
                         server_info=info,
                         versions={"server": info.get("version")} if info.get("version") else None,
                         workload=res.workload, timings=summary)
    return path
