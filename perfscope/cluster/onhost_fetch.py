"""``perfscope trace --fetch RUN_DIR``: the raw traces a run folder analysed on its host(s) left there
(:mod:`perfscope.cluster.onhost`), copied into its ``traces/`` folders, each checked against its sha256."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from perfscope.cluster.onhost import read_run_json, run_folders
from perfscope.errors import InputError

if TYPE_CHECKING:
    from perfscope.remote.hostio import HostIO


def fetch(
    run_dir: str | Path,
    connect_host: Callable[[str], AbstractContextManager[HostIO]],
    say: Callable[[str], None] = lambda m: None,
    progress=None,
) -> int:
    """Copy the raw traces a run folder lists on its host(s) into its ``traces/`` folders (each checked
    against its sha256), and list them in run.json as ordinary trace files. ``connect_host(label)``: a
    context manager giving the HostIO of that host. Returns the bytes copied."""
    from perfscope import rundir

    run_dir = Path(run_dir)
    data = read_run_json(run_dir / rundir.RUN_FILE)
    if not data.get("remote_files"):
        raise InputError(f"{run_dir}: run.json lists no trace left on a host (remote_files): nothing to fetch")
    if data.get("files"):
        raise InputError(f"{run_dir}: its traces were fetched already")
    todo = []  # (folder, its run.json data)
    for _, folder in run_folders(run_dir, data):
        fd = data if folder == run_dir else read_run_json(folder / rundir.RUN_FILE)
        todo.append((folder, fd))
        ht = folder / rundir.HOST_TIMING_DIR
        if (ht / rundir.RUN_FILE).is_file():
            hd = read_run_json(ht / rundir.RUN_FILE)
            if hd.get("remote_files") and not hd.get("files"):
                todo.append((ht, hd))
    total = 0
    done: dict[Path, list] = {}
    for folder, fd in todo:
        files = []
        for e in fd.get("remote_files") or []:
            if not e.get("sha256"):
                raise InputError(
                    f"{folder}: run.json has no sha256 for {e['path']} (its analysis did not finish): "
                    f"copy {e.get('host')}:{e['remote_path']} by hand"
                )
        by_host: dict = {}
        for e in fd.get("remote_files") or []:
            by_host.setdefault(e.get("host") or fd.get("host"), []).append(e)
        for host, es in by_host.items():
            with connect_host(host) as io:
                for e in es:
                    local = folder / e["path"]
                    task = (
                        progress.add_task(f"{host} {Path(e['path']).name}", total=e.get("bytes")) if progress else None
                    )
                    cb = (lambda d, t, task=task: progress.update(task, completed=d)) if progress else None
                    io.fetch(e["remote_path"], local, e["sha256"], cb)
                    total += local.stat().st_size
                    files.append({k: v for k, v in e.items() if k != "remote_path"})
        done[folder] = files
        say(f"{len(files)} trace file(s) from {', '.join(by_host)} -> {folder / rundir.TRACES_DIR}")
    for folder, files in done.items():  # run.json last: a fetch cut short leaves the folder as it was
        if folder != run_dir:
            rundir.update_run(folder, files=files)
    if data.get("members"):
        rundir.update_run(
            run_dir, files=[{k: v for k, v in e.items() if k != "remote_path"} for e in data["remote_files"]]
        )
    else:
        rundir.update_run(run_dir, files=done[run_dir])
    return total
