"""Where the target file lives: this machine, or an SSH host (through perfscope.capture.ssh).

Both give the engine the same small surface: read bytes, write atomically (temp file in the same
folder + rename, mode kept), hash, make a folder, run an argv (every argument shell-quoted by the
SSH transport), and the server-environment probes of :mod:`perfscope.capture.hostio`.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Optional, Sequence

from perfscope.capture.hostio import HostIO, LocalHost, SSHHost
from perfscope.errors import InputError, RemoteError
from perfscope.util.files import atomic_write_bytes, sha256_bytes


class FixHost:
    label = "local"
    remote = False

    def __init__(self, io: HostIO):
        self.io = io

    # files
    def read_bytes(self, path: str) -> bytes:
        raise NotImplementedError

    def write_bytes_atomic(self, path: str, data: bytes, mode: Optional[int] = None) -> None:
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def makedirs(self, path: str) -> None:
        raise NotImplementedError

    def home(self) -> str:
        raise NotImplementedError

    def sha256(self, path: str) -> str:
        return sha256_bytes(self.read_bytes(path))

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

    def read_bytes(self, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except OSError as e:
            raise InputError(f"{path}: cannot read ({e.strerror})") from None

    def write_bytes_atomic(self, path: str, data: bytes, mode: Optional[int] = None) -> None:
        try:
            atomic_write_bytes(path, data, mode=mode)
        except PermissionError:
            raise InputError(f"{path}: permission denied (run as the user that owns the server's python)") from None

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def home(self) -> str:
        return str(Path.home())


class SSHFixHost(FixHost):
    remote = True

    def __init__(self, session):
        super().__init__(SSHHost(session))
        self.s = session
        self.label = session.target.label

    def read_bytes(self, path: str) -> bytes:
        try:
            return self.s.read_bytes(path)
        except RemoteError:
            raise
        except (IOError, OSError) as e:
            raise RemoteError(f"{self.label}:{path}: cannot read ({e})") from None

    def write_bytes_atomic(self, path: str, data: bytes, mode: Optional[int] = None) -> None:
        self.s.write_bytes_atomic(path, data, mode=mode)

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
        return self.s.sha256(path)


def join(host: FixHost, *parts: str) -> str:
    return posixpath.join(*parts) if host.remote else os.path.join(*parts)
