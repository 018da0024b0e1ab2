"""What ``perfscope trace`` needs from the machine the inference server runs on, over SSH
(:class:`SSHHost`) or on this machine (:class:`LocalHost`, for ``--url``): run a command, make a
folder, list / check / hash / fetch trace files, find the server's python, read nvidia-smi."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import stat
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from perfscope.errors import InputError
from perfscope.remote.ssh import CommandResult, RemoteError, SSHSession, quote_argv
from perfscope.util.files import atomic_writer, copy_hashed, local_write_error, sha256_file

# gzipped (SGLang, vLLM by default) or plain JSON (vLLM with its profiler's gzip turned off, which
# saves the server tens of seconds per trace)
TRACE_SUFFIXES = (".trace.json.gz", ".trace.json")



# One command's arguments, in bytes: far below OpenSSH's 256 KB packet limit (a longer exec request
# makes sshd drop the connection) and Linux's 128 KB per argument.
ARGV_BATCH_BYTES = 32 * 1024


def argv_batches(paths: list[str], limit: int = ARGV_BATCH_BYTES) -> Iterator[list[str]]:
    """``paths`` in consecutive batches whose quoted length stays under ``limit`` bytes each."""
    batch: list[str] = []
    size = 0
    for p in paths:
        n = len(p.encode("utf-8", "surrogateescape")) + 3
        if batch and size + n > limit:
            yield batch
            batch, size = [], 0
        batch.append(p)
        size += n
    if batch:
        yield batch


def is_trace_name(name: str) -> bool:
    """A trace file's name; hidden names are writers' temporary files (renamed when complete)."""
    return name.endswith(TRACE_SUFFIXES) and not name.startswith(".")


# The python program that reports versions; run with the server's interpreter.
_VERSIONS_PY = r"""
import json, sys, platform
out = {"python": platform.python_version(), "executable": sys.executable}
try:
    from importlib.metadata import version, PackageNotFoundError
except Exception:
    version = None
for key, dists in (("sglang", ["sglang"]), ("vllm", ["vllm"]),
                   ("flashinfer", ["flashinfer-python", "flashinfer"]), ("torch", ["torch"]),
                   ("transformers", ["transformers"]), ("sgl_kernel", ["sgl-kernel"]),
                   ("triton", ["triton", "pytorch-triton"])):
    for d in dists:
        try:
            out[key] = version(d)
            break
        except Exception:
            pass
# torch's CUDA / HIP versions read from its version.py, not by importing torch (an import holds
# hundreds of MB, 0.7 GB with SGLang's torch, for two strings)
try:
    import ast, importlib.util, os, re
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
            text = f.read(1 << 16)
        for key in ("cuda", "hip"):
            m = re.search(r"^" + key + r"\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.M)
            out[key] = ast.literal_eval(m.group(1)) if m else None
except Exception:
    pass
print(json.dumps(out))
"""

# Run on the host with the server's files as arguments; prints the incomplete ones. The same test
# as trace_file_complete() below, in the same bounded steps (a remote python3 need not have perfscope).
_COMPLETE_CHECK_PY = r"""
import re, sys, zlib
bad = []
for p in sys.argv[1:]:
    try:
        with open(p, "rb") as f:
            if not p.endswith(".gz"):
                f.seek(max(0, f.seek(0, 2) - 4096))
                if not re.search(rb'\]\s*,\s*"traceName"\s*:[^\]]*\}\s*$', f.read()):
                    bad.append(p)
                continue
            d = zlib.decompressobj(31)
            while not d.eof:
                b = f.read(1 << 16)
                if not b:
                    break
                d.decompress(b, 1 << 20)
                while d.unconsumed_tail and not d.eof:
                    d.decompress(d.unconsumed_tail, 1 << 20)
            while not d.eof and d.decompress(b"", 1 << 20):
                pass
        if not d.eof:
            bad.append(p)
    except Exception:
        bad.append(p)
print("\n".join(bad))
"""

NVSMI_FIELDS = [
    ("index", "index", int),
    ("name", "name", str),
    ("uuid", "uuid", str),
    ("driver_version", "driver_version", str),
    ("memory.total", "memory_total_mib", float),
    ("clocks.sm", "clocks_sm_mhz", float),
    ("clocks.mem", "clocks_mem_mhz", float),
    ("clocks.max.sm", "clocks_max_sm_mhz", float),
    ("clocks.max.mem", "clocks_max_mem_mhz", float),
    ("power.limit", "power_limit_w", float),
    ("temperature.gpu", "temperature_c", float),
    ("utilization.gpu", "utilization_pct", float),
]


def trace_file_complete(path: str | os.PathLike) -> bool:
    """A ``.gz`` trace: its gzip stream ends (:func:`gzip_intact_local`). A plain JSON trace: it
    ends as Kineto ends every trace, the event list closed, then ``"traceName"`` and the closing
    brace (a writer still going, or one that died, has not written them)."""
    if str(path).endswith(".gz"):
        return gzip_intact_local(path)
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            return _KINETO_END.search(f.read()) is not None
    except OSError:
        return False


_KINETO_END = re.compile(rb'\]\s*,\s*"traceName"\s*:[^\]]*\}\s*$')


# the gzip check reads GZ_READ_BLOCK bytes at a time and inflates at most GZ_OUT_BLOCK bytes per
# step: a trace's JSON compresses 15-45x and a run of identical events up to zlib's 1032x, so a
# block inflated whole would be 15 MB to 1 GB; bounded on both sides, the check holds a few MB
# whatever the file
GZ_READ_BLOCK = 1 << 16
GZ_OUT_BLOCK = 1 << 20


def gzip_intact_local(path: str | os.PathLike) -> bool:
    """True if the whole gzip stream decompresses and ends with its trailer (CRC and size checked
    by zlib). Streams the file (:data:`GZ_READ_BLOCK` bytes read, at most :data:`GZ_OUT_BLOCK`
    inflated per step) and stops at the stream's end (what follows it is not read)."""
    try:
        d = zlib.decompressobj(31)
        with open(path, "rb") as f:
            while not d.eof and (b := f.read(GZ_READ_BLOCK)):
                d.decompress(b, GZ_OUT_BLOCK)
                while d.unconsumed_tail and not d.eof:
                    d.decompress(d.unconsumed_tail, GZ_OUT_BLOCK)
        # output zlib still holds once the input is used up (a step that filled the output exactly)
        while not d.eof and d.decompress(b"", GZ_OUT_BLOCK):
            pass
        return d.eof
    except (zlib.error, OSError, EOFError, gzip.BadGzipFile):
        return False


@dataclass
class RemoteFile:
    name: str
    path: str
    size: int
    mtime: float


def parse_nvidia_smi(text: str) -> list[dict]:
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(NVSMI_FIELDS):
            continue
        g: dict = {}
        for (_, key, typ), val in zip(NVSMI_FIELDS, parts):
            if val in ("", "[N/A]", "N/A", "[Not Supported]"):
                g[key] = None
                continue
            try:
                g[key] = typ(val)
            except ValueError:
                g[key] = val
        gpus.append(g)
    return gpus


def _listen_pid(ss_out: str, port: int) -> int | None:
    """The pid of the process listening on ``port`` from ``ss -ltnpH`` output."""
    for line in ss_out.splitlines():
        cols = line.split()
        if len(cols) < 4 or not re.search(rf"[:\]]{port}$", cols[3]):
            continue
        m = re.search(r"pid=(\d+)", line)
        if m:
            return int(m.group(1))
    return None


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
            raise RemoteError(f"cannot make a folder under {base} on {self.label}: "
                              f"{(r.stderr.strip() or 'mktemp failed').splitlines()[-1][:200]}")
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
            r = self.run(["python3", "-c", _COMPLETE_CHECK_PY, *batch], timeout=300)
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
                ok = r.ok and _KINETO_END.search(r.stdout.encode()) is not None
            if r.rc in (126, 127):
                return None
            if not ok:
                bad.append(p)
        return bad

    def sha256(self, path: str) -> str:
        raise NotImplementedError

    def fetch(self, path: str, local: Path, expected_sha256: str,
              progress: Callable[[int, int], None] | None = None) -> str:
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
        pid = _listen_pid(r.stdout, port) if r.ok else None
        if pid is None:
            # no ss, or no permission to see the owner: look for a launcher naming the port
            r = self.run(["sh", "-c", 'for p in /proc/[0-9]*; do c=$(tr "\\0" " " < "$p/cmdline" 2>/dev/null) || continue; '
                          'case "$c" in *"--port $1"*|*"--port=$1"*) echo "${p#/proc/} $c";; esac; done', "sh", str(port)],
                         timeout=20)
            cands = [ln.split(" ", 1) for ln in r.stdout.splitlines() if ln.strip()]
            cands = [c for c in cands if re.search(r"python|sglang|vllm", c[-1])]
            if cands:
                pid = int(min(cands, key=lambda c: int(c[0]))[0])
        if pid is None:
            return info
        info["pid"] = pid
        r = self.run(["sh", "-c", 'readlink "/proc/$1/exe"; stat -c %u "/proc/$1"; tr "\\0" "\\n" < "/proc/$1/cmdline" | head -n 1; '
                      'tr "\\0" "\\n" < "/proc/$1/environ" 2>/dev/null | grep -E "^(VIRTUAL_ENV|CONDA_PREFIX)=" || true',
                      "sh", str(pid)], timeout=20)
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
                proc["python_note"] = (f"the server (pid {proc.get('pid')}) runs as uid {proc.get('uid', '?')}, not as "
                                       f"this user (uid {me}): its interpreter is not run; pass --python to name it")
                chosen = []
            else:
                mine = [p for p in chosen if owners.get(p) and all(u in (me, 0) for u in owners[p])]
                if len(mine) < len(chosen):
                    proc["python_note"] = ("not run, as another user owns them: " + ", ".join(
                        p for p in chosen if p not in mine) + " (pass --python to name the interpreter)")
                chosen = mine
        return list(dict.fromkeys(chosen + ["python3"]))

    def _owners(self, paths: list[str]) -> tuple[int | None, dict[str, tuple[int, int]]]:
        """(this user's uid, {path: (owner of the path, owner of the file it leads to)}) on the
        host, in one command; a path that cannot be stat'ed is left out."""
        r = self.run(["sh", "-c", 'id -u; for p; do echo "$(stat -c %u -- "$p" 2>/dev/null):'
                      '$(stat -L -c %u -- "$p" 2>/dev/null)"; done', "sh", *paths], timeout=20)
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
            r = self.run([py, "-c", _VERSIONS_PY], timeout=60)
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


class SSHHost(HostIO):
    def __init__(self, session: SSHSession):
        self.s = session
        self.label = session.target.label

    def run(self, argv, timeout=60.0):
        return self.s.run(argv, timeout=timeout)

    def alive(self):
        try:
            self.s.transport  # noqa: B018 (the property raises RemoteError once the session is closed)
        except RemoteError:
            return False
        return True

    def list_traces(self, folder, match=is_trace_name):
        out = []
        for e in self.s.listdir(folder):
            if match(e.filename) and stat.S_ISREG(e.st_mode or 0):
                out.append(RemoteFile(e.filename, f"{folder.rstrip('/')}/{e.filename}", e.st_size or 0, e.st_mtime or 0))
        return sorted(out, key=lambda f: f.name)

    def sha256(self, path):
        return self.s.sha256(path)

    def fetch(self, path, local, expected_sha256, progress=None):
        return self.s.download(path, local, expected_sha256=expected_sha256, progress=progress)

    def remove(self, paths, folder):
        self.s.remove(paths, folder)

    def put(self, path, data):
        self.s.write_bytes_atomic(path, data, mode=0o600)

    def get(self, path, cap):
        try:
            return bytes(self.s.read_bytes(path, regular_cap=cap))
        except InputError as e:  # a pipe, a folder, or past the cap: the host's answer is unusable
            raise RemoteError(str(e).replace("PERFSCOPE_MAX_FIX_FILE_MB", "PERFSCOPE_MAX_REPLY_MB")) from None

    def close(self):
        self.s.close()


def kill_group(p: subprocess.Popen, grace: float = 2.0) -> None:
    """SIGTERM to the process group ``p`` leads, SIGKILL after ``grace`` seconds; reaps ``p``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            p.wait(wait)
            # the leader is gone; others in its group may still run
            os.killpg(p.pid, 0)
        except subprocess.TimeoutExpired:
            continue
        except (ProcessLookupError, PermissionError):
            break
    with contextlib.suppress(Exception):
        p.wait(1)


class LocalHost(HostIO):
    """The server runs on this machine (``--url``): its files are read in place."""

    label = "localhost"

    def run(self, argv, timeout=60.0):
        """Run a command in its own process group: a timeout or an interrupt kills the whole group
        (a hung ``--restart-cmd``'s children too), not only the outer process."""
        try:
            p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        except FileNotFoundError:
            return CommandResult(quote_argv(argv), 127, "", f"{argv[0]}: not found")
        except OSError as e:  # e.g. a PATH entry this user cannot enter
            return CommandResult(quote_argv(argv), 126, "", f"{argv[0]}: {e.strerror or e}")
        try:
            out, err = p.communicate(timeout=timeout)
        except BaseException as e:
            kill_group(p)
            if isinstance(e, subprocess.TimeoutExpired):
                raise RemoteError(f"local command timed out after {timeout:g}s: {quote_argv(argv)[:120]}") from None
            raise
        return CommandResult(quote_argv(argv), p.returncode, out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"))

    def list_traces(self, folder, match=is_trace_name):
        """The regular files in ``folder`` (a symlink there is not the server's trace: it could
        point at any file this user may read, and is skipped, as over SSH)."""
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            raise RemoteError(f"{folder} does not exist") from None
        out = []
        for e in entries:
            if match(e.name):
                try:
                    if not e.is_file(follow_symlinks=False):
                        continue
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:  # renamed or removed since the listing (a writer's temp file)
                    continue
                out.append(RemoteFile(e.name, e.path, st.st_size, st.st_mtime))
        return sorted(out, key=lambda f: f.name)

    def incomplete(self, paths):
        return [p for p in paths if not trace_file_complete(p)]

    @staticmethod
    def _open_trace(path: str) -> tuple[int, int]:
        """(descriptor, size) of ``path``, opened without following a symlink and only if it is a
        regular file: a link planted in the profile folder after the listing is refused."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            why = "is a symlink (not followed)" if os.path.islink(path) else (e.strerror or str(e))
            raise RemoteError(f"{path}: {why}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise RemoteError(f"{path}: not a regular file")
        return fd, st.st_size

    def sha256(self, path):
        fd, _ = self._open_trace(path)
        with os.fdopen(fd, "rb") as f:
            return sha256_file(f)

    def fetch(self, path, local, expected_sha256, progress=None):
        fd, total = self._open_trace(path)
        try:
            with os.fdopen(fd, "rb") as src, atomic_writer(local, shared=True) as dst:
                digest = copy_hashed(src, dst, total, progress)  # as the SFTP download does
                if expected_sha256 and digest != expected_sha256:
                    raise RemoteError(f"{path} changed while it was copied (sha256 mismatch)")
        except OSError as e:
            raise (local_write_error(e, local) or e) from None
        return digest

    def put(self, path, data):
        from perfscope.util.files import atomic_write_bytes

        atomic_write_bytes(path, data, mode=0o600)

    def get(self, path, cap):
        from perfscope.util.files import read_regular

        try:
            return bytes(read_regular(path, cap, "PERFSCOPE_MAX_REPLY_MB"))
        except InputError as e:
            raise RemoteError(str(e)) from None

    def remove(self, paths, folder):
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass
        if folder:
            try:
                os.rmdir(folder)
            except OSError:
                pass
