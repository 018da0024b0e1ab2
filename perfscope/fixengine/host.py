"""Where the target file lives: this machine, or an SSH host (through perfscope.remote.ssh).

Both give the engine the same small surface: read bytes, write atomically (temp file in the same
folder + rename, mode kept), hash, make a folder, run an argv (every argument shell-quoted by the
SSH transport), and the server-environment probes of :mod:`perfscope.remote.hostio`.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat as stat_mod
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

from perfscope.errors import FixRefused, InputError, RemoteError
from perfscope.fixengine.pinned import PinnedFile
from perfscope.remote.hostio import HostIO, LocalHost, SSHHost
from perfscope.util.files import atomic_write_bytes, read_regular, sha256_bytes
from perfscope.util.limits import max_fix_file_bytes


class FixHost:
    """Files and commands on the target's host. :meth:`pin` holds a fix's target from its check on:
    :meth:`read_bytes`, :meth:`sha256` and :meth:`write_bytes_atomic` on a pinned path act on the
    file resolved at the check, and refuse (:class:`FixRefused`) once anything else is there."""

    label = "local"
    remote = False

    def __init__(self, io: HostIO):
        self.io = io

    # files
    def pin(self, path: str) -> bytes:
        """Resolve ``path`` once (its symlinks followed at the first call, never again), hold the
        file, return its bytes (refused if the entry is no longer the held file)."""
        raise NotImplementedError

    def read_bytes(self, path: str) -> bytes:
        raise NotImplementedError

    def write_bytes_atomic(
        self, path: str, data: bytes, mode: Optional[int] = None, tmp_dir: Optional[str] = None
    ) -> None:
        """Temp file + rename (symlinks kept, special files refused); ``tmp_dir`` holds the temp
        file when it is on the same file system (the engine's state folder)."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def makedirs(self, path: str) -> None:
        raise NotImplementedError

    def home(self) -> str:
        raise NotImplementedError

    def sha256(self, path: str) -> str:
        return sha256_bytes(self.read_bytes(path))

    def mode(self, path: str) -> Optional[int]:
        """The permission bits of ``path`` (symlinks followed), None if it cannot be stat'ed."""
        raise NotImplementedError

    def lock(self, path: str, timeout: float = 120.0):
        """A context manager holding an exclusive lock on ``path`` on the host: two applies or
        reverts at once are serialised. Released when the process or the SSH connection dies."""
        raise NotImplementedError

    # commands
    def run(self, argv: Sequence[str], timeout: float = 60.0):
        return self.io.run(list(argv), timeout=timeout)

    def run_shell(self, command: str, timeout: float = 600.0):
        """A user-given shell command line (``--restart-cmd``), run by ``sh -c`` on the host."""
        return self.io.run(["sh", "-c", command], timeout=timeout)

    def close(self) -> None:
        self.io.close()


class LocalFixHost(FixHost):
    label = "local"

    def __init__(self):
        super().__init__(LocalHost())
        self._pins: dict[str, PinnedFile] = {}

    def pin(self, path: str) -> bytes:
        if path not in self._pins:
            self._pins[path] = PinnedFile(path)
        return self._pins[path].read()

    def read_bytes(self, path: str) -> bytes:
        """A regular file of at most PERFSCOPE_MAX_FIX_FILE_MB (a FIFO, a device, a folder refused);
        a pinned one read through its held descriptor."""
        if path in self._pins:
            return self._pins[path].read()
        return bytes(
            read_regular(
                path, max_fix_file_bytes(), "PERFSCOPE_MAX_FIX_FILE_MB", hint="fix reads and patches regular files only"
            )
        )

    def write_bytes_atomic(
        self, path: str, data: bytes, mode: Optional[int] = None, tmp_dir: Optional[str] = None
    ) -> None:
        if path in self._pins:
            return self._pins[path].replace(data, tmp_dir=tmp_dir)
        try:
            atomic_write_bytes(path, data, mode=mode, tmp_dir=tmp_dir)
        except PermissionError:
            raise InputError(f"{path}: permission denied (run as the user that owns the server's python)") from None
        except OSError as e:  # read-only file system, disk full, ...: nothing was replaced
            raise InputError(f"{path}: cannot write ({e.strerror or e}); the file is unchanged") from None

    def mode(self, path: str) -> Optional[int]:
        try:
            return stat_mod.S_IMODE(os.stat(path).st_mode)
        except OSError:
            return None

    @contextlib.contextmanager
    def lock(self, path: str, timeout: float = 120.0) -> Iterator[None]:
        import fcntl

        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise FixRefused(
                            f"another perfscope fix holds {path} for more than {timeout:g}s; try again when it ends"
                        ) from None
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)  # releases the lock

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def home(self) -> str:
        return str(Path.home())

    def close(self) -> None:
        for p in self._pins.values():
            p.close()
        self._pins.clear()
        super().close()


class SSHFixHost(FixHost):
    remote = True

    def __init__(self, session):
        super().__init__(SSHHost(session))
        self.s = session
        self.label = session.target.label
        self._pins: dict[str, tuple[str, str]] = {}  # path -> (resolved path, its _ident)

    def _ident(self, real: str) -> tuple[str, str]:
        """("st_dev:st_ino:type:ctime", type) of ``real`` itself (a link not followed); ("", "") if
        gone. Nothing holds the file open over SSH, so a new file may get the old inode number: its
        type and change time tell it apart."""
        r = self.run(["stat", "-c", "%d:%i:%Z:%F", "--", real])
        parts = r.stdout.strip().split(":", 3)
        if r.rc != 0 or len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
            return "", ""
        return r.stdout.strip(), parts[3]

    def pin(self, path: str) -> bytes:
        if path in self._pins:
            return self.read_bytes(path)
        r = self.run(["realpath", "-e", "--", path])
        real = r.stdout.strip()
        if r.rc != 0 or not real.startswith("/"):
            raise InputError(f"{self.label}:{path}: no such file")
        ident, kind = self._ident(real)
        if not kind.startswith("regular"):
            raise InputError(f"{self.label}:{path}: not a regular file")
        self._pins[path] = (real, ident)
        return self.read_bytes(path)

    def _check(self, path: str) -> str:
        real, ident = self._pins[path]
        now, kind = self._ident(real)
        if now != ident:
            what = "removed" if not now else "a symlink now" if kind == "symbolic link" else "another file now"
            raise FixRefused(f"{self.label}:{path} changed since the check ({what}): nothing written; check again")
        return real

    def read_bytes(self, path: str) -> bytes:
        """As :meth:`LocalFixHost.read_bytes`, the file stat'ed over SFTP before it is opened; a pinned
        one checked against the held identity before and after."""
        if path in self._pins:
            real = self._check(path)
            data = self._read(real)
            self._check(path)
            return data
        return self._read(path)

    def _read(self, path: str) -> bytes:
        try:
            return self.s.read_bytes(path, regular_cap=max_fix_file_bytes())
        except RemoteError:
            raise
        except (IOError, OSError) as e:
            raise RemoteError(f"{self.label}:{path}: cannot read ({e})") from None

    def write_bytes_atomic(
        self, path: str, data: bytes, mode: Optional[int] = None, tmp_dir: Optional[str] = None
    ) -> None:
        if path not in self._pins:
            return self.s.write_bytes_atomic(path, data, mode=mode, tmp_dir=tmp_dir)
        real = self._check(path)
        self.s.write_bytes_atomic(real, data, mode=mode, tmp_dir=tmp_dir, follow_symlinks=False)
        self._pins[path] = (real, self._ident(real)[0])

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path]).rc == 0

    def makedirs(self, path: str) -> None:
        r = self.run(["mkdir", "-p", "-m", "700", path])
        if r.rc != 0:
            raise RemoteError(f"{self.label}: cannot create {path}: {r.stderr.strip()}")

    def home(self) -> str:
        r = self.run(["sh", "-c", 'printf %s "$HOME"'])
        home = r.stdout.strip()
        if r.rc != 0 or not home.startswith("/"):
            raise RemoteError(f"{self.label}: cannot find the home folder")
        return home

    def sha256(self, path: str) -> str:
        if path in self._pins:
            real = self._check(path)
            digest = self.s.sha256(real)
            self._check(path)
            return digest
        return self.s.sha256(path)

    def mode(self, path: str) -> Optional[int]:
        try:
            return stat_mod.S_IMODE(self.s.sftp().stat(path).st_mode or 0)
        except Exception:
            return None

    @contextlib.contextmanager
    def lock(self, path: str, timeout: float = 120.0) -> Iterator[None]:
        """``flock`` (else python3's fcntl) on the host, held by a command that lives as long as
        this SSH channel: closing it (or losing the connection) releases the lock."""
        self.makedirs(posixpath.dirname(path))
        script = (
            'if command -v flock >/dev/null 2>&1; then exec flock -w "$2" "$1" sh -c \'echo locked; read x\'; fi; '
            'exec python3 -c "import fcntl,sys,time,os\nf=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT,0o600)\n'
            "d=time.time()+float(sys.argv[2])\nwhile True:\n try: fcntl.flock(f,fcntl.LOCK_EX|fcntl.LOCK_NB); break\n"
            " except BlockingIOError:\n  if time.time()>d: sys.exit(1)\n  time.sleep(0.1)\n"
            'print(\'locked\',flush=True)\nsys.stdin.read()" "$1" "$2"'
        )
        from perfscope.remote.ssh.commands import quote_argv

        chan = self.s.transport.open_session(timeout=self.s.target.timeout)
        try:
            chan.exec_command(quote_argv(["sh", "-c", script, "perfscope-lock", path, f"{timeout:g}"]))
            chan.settimeout(timeout + 10)
            got = b""
            while b"locked" not in got:
                try:
                    chunk = chan.recv(64)
                except Exception:
                    chunk = b""
                if not chunk:
                    raise FixRefused(
                        f"{self.label}: another perfscope fix holds {path} for more than "
                        f"{timeout:g}s (or flock/python3 is missing there); try again when it ends"
                    )
                got += chunk
            yield
        finally:
            with contextlib.suppress(Exception):
                chan.shutdown_write()
                chan.close()


def join(host: FixHost, *parts: str) -> str:
    return posixpath.join(*parts) if host.remote else os.path.join(*parts)
