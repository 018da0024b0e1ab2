"""A profile's traces brought home: each fetched into the run folder's ``traces/`` (sha256-checked,
written atomically, its gzip stream or JSON checked whole), or, analysed on the host, listed where
they stay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfscope import rundir
from perfscope.errors import RemoteError
from perfscope.remote.hostio import HostIO, RemoteFile, trace_file_complete


def copy_back(
    io: HostIO, got: list[RemoteFile], out_dir: Path, label: str, host: str | None, progress: Any, files: list[dict]
) -> None:
    """Fetch each trace into ``out_dir/traces``, appending its run.json entry to ``files`` (``host``:
    the SSH host's label, None for a server on this machine). ``progress``: a rich Progress, or None."""
    for f in got:
        local = out_dir / rundir.TRACES_DIR / f.name
        digest_remote = io.sha256(f.path)
        task = progress.add_task(f"{label} {f.name}", total=f.size) if progress else None
        cb = (lambda done, total, t=task: progress.update(t, completed=done)) if progress else None
        digest = io.fetch(f.path, local, digest_remote, cb)
        if not trace_file_complete(local):
            local.unlink()
            raise RemoteError(
                f"{f.name} from {label} is truncated (its gzip stream or JSON does not end): "
                "the server may have crashed while writing it"
            )
        files.append(rundir.file_entry(out_dir, local, host=host, sha256=digest))


def remote_entry(f: RemoteFile, label: str) -> dict:
    """The run.json entry of a trace left on the host: where ``trace --fetch`` puts it (``path``), where
    it is (``remote_path``), its size; its sha256 comes with the analysis on the host."""
    meta = rundir.parse_trace_name(f.name)
    return {
        "path": f"{rundir.TRACES_DIR}/{f.name}",
        "remote_path": f.path,
        "sha256": None,
        "bytes": f.size,
        "rank": meta["rank"],
        "stage": meta["stage"],
        "host": label,
        "parallel": meta["parallel"],
        **({"role": meta["role"]} if meta["role"] else {}),
    }
