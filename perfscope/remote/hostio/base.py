"""The base of the host's transports (:class:`HostIO`): everything built on ``run`` plus a few file operations."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Sequence

from perfscope.remote.hostio.probes import NVSMI_FIELDS, VERSIONS_PY, listen_pid, parse_nvidia_smi
from perfscope.remote.hostio.traces import COMPLETE_CHECK_PY, KINETO_END, RemoteFile, argv_batches, is_trace_name
from perfscope.remote.ssh import CommandResult, RemoteError


class HostIO:
    """Base: everything is built on ``run`` plus a few file operations."""

    label: str = "local"

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> CommandResult:
        raise NotImplementedError

    def alive(self) -> bool:
        """Whether the connection to the host still works (always, for this machine)."""
        return True

    # folders and files ------------------------------------------------------------------------
    def mkdtemp(self, base: str, prefix: str = "perfscope-trace.") -> str:
        r = self.run(["mktemp", "-d", "-p", base, prefix + "XXXXXXXX"])
        path = r.stdout.strip()
        if not r.ok or not path.startswith("/"):
            raise RemoteError(
                f"cannot make a folder under {base} on {self.label}: "
                f"{(r.stderr.strip() or 'mktemp failed').splitlines()[-1][:200]}"
            )
        return path

    def discard_dir(self, path: str, prefix: str = "perfscope-trace.") -> None:
        """Remove a folder :meth:`mkdtemp` made, with whatever is in it (only such a folder:
        absolute, named ``prefix*``). Best effort: a failure is ignored."""
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if not path.startswith("/") or not name.startswith(prefix) or ".." in path.split("/"):
            return
        with contextlib.suppress(Exception):
            self.run(["rm", "-rf", "--", path], timeout=60)

    def chmod(self, path: str, mode: int) -> None:
        self.run(["chmod", format(mode, "o"), "--", path])

    def list_traces(self, folder: str, match: Callable[[str], bool] = is_trace_name) -> list[RemoteFile]:
        """The files in ``folder`` whose name ``match`` accepts (default: trace files)."""
        raise NotImplementedError

    def incomplete(self, paths: list[str]) -> list[str] | None:
        """The paths whose trace is not complete yet (:func:`trace_file_complete`), checked on the
        host; None if the host has neither python3 nor gzip/tail (the local check after download
        still runs)."""
        if not paths:
            return []
        out: list[str] = []
        for batch in argv_batches(paths):
            r = self.run(["python3", "-c", COMPLETE_CHECK_PY, *batch], timeout=300)
            if not r.ok:
                break
            out += [p for p in r.stdout.splitlines() if p]
        else:
            return out
        bad = []
        for p in paths:
            if p.endswith(".gz"):
                r = self.run(["gzip", "-t", "--", p], timeout=300)
                ok = r.ok
            else:
                r = self.run(["tail", "-c", "4096", "--", p], timeout=60)
                ok = r.ok and KINETO_END.search(r.stdout.encode()) is not None
            if r.rc in (126, 127):
                return None
            if not ok:
                bad.append(p)
        return bad

    def sha256(self, path: str) -> str:
        raise NotImplementedError

    def fetch(
        self, path: str, local: Path, expected_sha256: str, progress: Callable[[int, int], None] | None = None
    ) -> str:
        raise NotImplementedError

    def remove(self, paths: list[str], folder: str | None) -> None:
        raise NotImplementedError

    def put(self, path: str, data: bytes) -> None:
        """Write a small file on the host (mode 0600), atomically."""
        raise NotImplementedError

    def get(self, path: str, cap: int) -> bytes:
        """A regular file's bytes from the host, at most ``cap`` (RemoteError past it)."""
        raise NotImplementedError

    # the server's environment ---------------------------------------------------------------
    def server_process(self, port: int) -> dict:
        """{pid, uid, argv0, exe, venv} of the process listening on ``port``, as far as visible."""
        info: dict = {}
        r = self.run(["ss", "-ltnpH", f"sport = :{port}"], timeout=20)
        pid = listen_pid(r.stdout, port) if r.ok else None
        if pid is None:
            # no ss, or no permission to see the owner: look for a launcher naming the port
            r = self.run(
                [
                    "sh",
                    "-c",
                    'for p in /proc/[0-9]*; do c=$(tr "\\0" " " < "$p/cmdline" 2>/dev/null) || continue; '
                    'case "$c" in *"--port $1"*|*"--port=$1"*) echo "${p#/proc/} $c";; esac; done',
                    "sh",
                    str(port),
                ],
                timeout=20,
            )
            cands = [ln.split(" ", 1) for ln in r.stdout.splitlines() if ln.strip()]
            cands = [c for c in cands if re.search(r"python|sglang|vllm", c[-1])]
            if cands:
                pid = int(min(cands, key=lambda c: int(c[0]))[0])
        if pid is None:
            return info
        info["pid"] = pid
        r = self.run(
            [
                "sh",
                "-c",
                'readlink "/proc/$1/exe"; stat -c %u "/proc/$1"; tr "\\0" "\\n" < "/proc/$1/cmdline" | head -n 1; '
                'tr "\\0" "\\n" < "/proc/$1/environ" 2>/dev/null | grep -E "^(VIRTUAL_ENV|CONDA_PREFIX)=" || true',
                "sh",
                str(pid),
            ],
            timeout=20,
        )
        lines = r.stdout.splitlines()
        if len(lines) >= 3:
            info["exe"] = lines[0] or None
            info["uid"] = int(lines[1]) if lines[1].isdigit() else None
            info["argv0"] = lines[2] or None
            for ln in lines[3:]:
                k, _, v = ln.partition("=")
                info[k.lower()] = v
        return info

    def python_candidates(self, proc: dict) -> list[str]:
        """Interpreters to ask for versions, best first: the server's own argv[0] (keeps its venv),
        its VIRTUAL_ENV / CONDA_PREFIX, /proc/PID/exe, then python3 (this user's PATH).

        The server's choices are run as this user, so only when another user could not have made
        them: the process runs as this user, and each interpreter (the path and the file it leads
        to) is owned by this user or root. Otherwise they are left out, and ``proc["python_note"]``
        says why and that ``--python`` names the interpreter."""
        out = []
        a0 = proc.get("argv0")
        if a0 and a0.startswith("/") and "python" in os.path.basename(a0):
            out.append(a0)
        for k in ("virtual_env", "conda_prefix"):
            if proc.get(k):
                out.append(proc[k].rstrip("/") + "/bin/python")
        if proc.get("pid"):
            out.append(f"/proc/{proc['pid']}/exe")
        if proc.get("exe"):
            out.append(proc["exe"])
        chosen = list(dict.fromkeys(out))
        if chosen:
            me, owners = self._owners(chosen)
            if proc.get("uid") is None or proc["uid"] != me:
                proc["python_note"] = (
                    f"the server (pid {proc.get('pid')}) runs as uid {proc.get('uid', '?')}, not as "
                    f"this user (uid {me}): its interpreter is not run; pass --python to name it"
                )
                chosen = []
            else:
                mine = [p for p in chosen if owners.get(p) and all(u in (me, 0) for u in owners[p])]
                if len(mine) < len(chosen):
                    proc["python_note"] = (
                        "not run, as another user owns them: "
                        + ", ".join(p for p in chosen if p not in mine)
                        + " (pass --python to name the interpreter)"
                    )
                chosen = mine
        return list(dict.fromkeys(chosen + ["python3"]))

    def _owners(self, paths: list[str]) -> tuple[int | None, dict[str, tuple[int, int]]]:
        """(this user's uid, {path: (owner of the path, owner of the file it leads to)}) on the
        host, in one command; a path that cannot be stat'ed is left out."""
        r = self.run(
            [
                "sh",
                "-c",
                'id -u; for p; do echo "$(stat -c %u -- "$p" 2>/dev/null):$(stat -L -c %u -- "$p" 2>/dev/null)"; done',
                "sh",
                *paths,
            ],
            timeout=20,
        )
        lines = r.stdout.splitlines() if r.ok else []
        me = int(lines[0]) if lines and lines[0].isdigit() else None
        owners = {}
        for p, ln in zip(paths, lines[1:]):
            a, _, b = ln.partition(":")
            if a.isdigit() and b.isdigit():
                owners[p] = (int(a), int(b))
        return me, owners

    def python_versions(self, candidates: list[str], want: str = "sglang") -> dict:
        """Versions from the first interpreter that has ``want`` installed (else the first that runs)."""
        first: dict | None = None
        for py in candidates:
            r = self.run([py, "-c", VERSIONS_PY], timeout=60)
            if not r.ok:
                continue
            try:
                v = json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                continue
            v["interpreter"] = py
            if v.get(want):
                return v
            first = first or v
        return first or {}

    def nvidia_smi(self) -> list[dict]:
        q = ",".join(f for f, _, _ in NVSMI_FIELDS)
        r = self.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"], timeout=30)
        return parse_nvidia_smi(r.stdout) if r.ok else []

    def close(self) -> None:
        pass
