"""``perfscope diagnose RUN_DIR`` of a run folder analysed on its host(s) (``trace --analyse-on-host``,
:mod:`perfscope.cluster.onhost`): the diagnosis reduced from the results stored in the folder, the one
``diagnose`` makes of the same traces copied into ``RUN_DIR/traces/``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from perfscope.cluster.onhost import RESULTS, WHERE, gunzip_json, is_on_host, read_run_json, run_folders
from perfscope.errors import InputError

# diagnose's options that change a rank's analysis: refused on stored results (they were made without them)
PER_RANK_OPTIONS = ("--config", "--model-config", "--batch", "--context", "--server-log", "--capture-trace", "--ray")


def on_host_folder(paths: list) -> Optional[Path]:
    """The run folder among ``paths`` whose traces stay on its host (None: none is). Such a folder
    goes alone: InputError when other paths come with it."""
    from perfscope.rundir import RUN_FILE

    hit = None
    for p in paths:
        p = Path(p)
        if p.is_dir() and (p / RUN_FILE).is_file():
            try:
                data = read_run_json(p / RUN_FILE)
            except InputError:
                continue
            if is_on_host(data):
                hit = p
    if hit is not None and len(paths) > 1:
        raise InputError(
            f"{hit} was analysed on its host (trace --analyse-on-host): diagnose it alone, or fetch "
            f"its traces first (perfscope trace --fetch {hit})"
        )
    return hit


def refuse_options(run_dir: Path, given: list[str]) -> None:
    if given:
        raise InputError(
            f"{run_dir} was analysed on its host (trace --analyse-on-host) and its traces stay there: "
            f"{', '.join(given)} change{'s' if len(given) == 1 else ''} each rank's analysis, which needs "
            f"the traces; fetch them (perfscope trace --fetch {run_dir}) and diagnose again"
        )


def stored_diagnosis(run_dir: str | Path):
    """The :class:`Diagnosis` of a run folder analysed on its host(s), from its stored results: the one
    ``diagnose`` makes of the same traces in ``traces/`` (files named as there)."""
    from perfscope.analysis.result import RankAnalysis
    from perfscope.analysis.split import reduce
    from perfscope.load.discover import TraceFile, TraceSet
    from perfscope.rundir import read_run

    run_dir = Path(run_dir)
    info = read_run(run_dir)
    data = info.data
    root_entries = []
    workers = 0
    for prefix, folder in run_folders(run_dir, data):
        fd = data if folder == run_dir else read_run_json(folder / "run.json")
        a = fd.get("analysis") or {}
        if a.get("where") != WHERE or a.get("status") != "done" or not (folder / RESULTS).is_file():
            raise InputError(
                f"{folder}: the analysis on its host did not finish (no {RESULTS}): rerun the trace, or "
                f"fetch the traces (perfscope trace --fetch {run_dir}) and diagnose them here"
            )
        workers = max(workers, int(a.get("workers") or 1))
        from perfscope.util import limits
        from perfscope.util.files import read_regular

        cap = limits.max_reply_bytes()
        stored = gunzip_json(
            bytes(read_regular(folder / RESULTS, cap, "PERFSCOPE_MAX_REPLY_MB")), cap, f"{folder / RESULTS}"
        )
        ok_by_path = {x["path"]: x["ok"] for x in stored.get("ranks") or []}
        for e in fd.get("remote_files") or []:
            local = (run_dir / (prefix + e["path"])).resolve()
            root_entries.append((e, local, ok_by_path.get(e["path"])))
    # as read_run, then discover, order and deduplicate the files of a run folder
    root_entries.sort(
        key=lambda t: (
            t[0].get("host") or "",
            t[0]["rank"] if t[0].get("rank") is not None else 1 << 30,
            t[0].get("stage") or "",
            str(t[1]),
        )
    )
    seen: dict = {}
    kept, dups = [], []
    for e, local, res in root_entries:
        key = e.get("sha256") if len(root_entries) > 1 else None
        if key and key in seen:
            dups.append({"path": str(local), "same_as": str(seen[key]), "how": "identical bytes"})
            continue
        if key:
            seen[key] = local
        kept.append((e, local, res))
    frontend = [local for e, local, _ in kept if e.get("role") == "frontend"]
    kept = [t for t in kept if t[0].get("role") != "frontend"]
    kept.sort(
        key=lambda t: (
            t[0].get("host") or "",
            t[0]["rank"] if t[0].get("rank") is not None else -1,
            t[0].get("stage") or "",
            t[1].name,
        )
    )
    ranks = []
    for e, local, res in kept:
        if res is None:
            raise InputError(
                f"{run_dir}: no stored result for {e['path']}: fetch the traces (perfscope trace --fetch "
                f"{run_dir}) and diagnose them here"
            )
        ra = RankAnalysis.from_dict(res)
        ra.file = str(local)
        if "path" in ra.meta:
            ra.meta["path"] = str(local)
        ranks.append(ra)
    tset = TraceSet(
        files=[
            TraceFile(path=local, rank=e.get("rank"), stage=e.get("stage"), host=e.get("host")) for e, local, _ in kept
        ],
        run_dir=run_dir,
        run_info=data,
        duplicates=dups,
        frontend=frontend,
    )
    return reduce(tset, ranks, {"files": len(ranks), "workers": workers, "bound": WHERE})
