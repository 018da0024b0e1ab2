"""Where a bench result goes: ``bench.json`` in a run folder, its summary in ``run.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from perfscope import rundir
from perfscope.util.files import atomic_write_text

BENCH_FILE = "bench.json"


MAX_BENCH_BYTES = 64 << 20  # a bench.json of 100,000 requests is ~20 MB


def run_summary(res) -> dict:
    """What run.json keeps of a bench result (``timings`` or ``timings.bench``): the summary and
    the per-request TPOTs (``tpot_samples_ms``: what a before/after verdict resamples)."""
    d = {k: v for k, v in res.to_dict(per_request=False).items() if k not in ("workload", "server", "errors")}
    d["tpot_samples_ms"] = [r["tpot_ms"] for r in res.per_request if r.get("ok") and r.get("tpot_ms") is not None]
    d["concurrency"] = (res.workload or {}).get("concurrency")  # diagnose uses a bench of the traced concurrency
    return d


def tpot_samples(folder: Path) -> Optional[list[float]]:
    """The per-request TPOTs of ``folder/bench.json`` (None: no readable bench file there)."""
    from perfscope.errors import InputError
    from perfscope.util import jsonio

    path = Path(folder) / BENCH_FILE
    try:
        if not path.is_file() or path.stat().st_size > MAX_BENCH_BYTES:
            return None
        d = jsonio.read(path, "bench result")
    except (OSError, InputError):
        return None
    rows = d.get("per_request")
    if not isinstance(rows, list):
        return None
    out = [
        r["tpot_ms"]
        for r in rows
        if isinstance(r, dict)
        and r.get("ok")
        and isinstance(r.get("tpot_ms"), (int, float))
        and not isinstance(r.get("tpot_ms"), bool)
    ]
    return out or None


def store(out: Path, res, url: str, host: Optional[str], info: dict, argv: list[str]) -> Path:
    """Write ``bench.json`` into ``out``: added to an existing run folder's timings (a trace run),
    or as a run folder of its own (kind ``bench``). Returns the bench file's path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / BENCH_FILE
    atomic_write_text(path, json.dumps(res.to_dict(), indent=2) + "\n", shared=True)
    summary = run_summary(res)
    if (out / rundir.RUN_FILE).is_file():  # an existing run folder (e.g. a trace): add the bench to it
        rundir.update_run(out, timings={"bench": summary})
    else:
        rundir.write_run(
            out,
            command=argv,
            kind="bench",
            engine=info.get("engine") or "sglang",
            host=host,
            url=url,
            server_info=info,
            versions={"server": info.get("version")} if info.get("version") else None,
            workload=res.workload,
            timings=summary,
        )
    return path
