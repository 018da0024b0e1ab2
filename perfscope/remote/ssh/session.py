"""One authenticated SSH connection: commands, port forwards, SFTP reads/writes, hashes, downloads."""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import select
import shlex
import stat as stat_mod
import threading
import time
from typing import Callable, Iterable, Sequence

import paramiko

from perfscope.errors import FixRefused, InputError, RemoteError
from perfscope.remote.ssh.commands import CommandResult, quote_argv
from perfscope.remote.ssh.errors import CommandFailed
from perfscope.remote.ssh.forward import LocalForward
from perfscope.remote.ssh.target import SSHTarget
from perfscope.util.limits import too_big


_PGID_TAG = "perfscope-pgid:"


def _take_pgid(err: bytearray) -> tuple[int | None, bytearray]:
    """The pid line the wrapper wrote first on stderr, and stderr without it."""
    tag = _PGID_TAG.encode()
    if not err.startswith(tag) or b"\n" not in err:
        return None, err
    first, rest = bytes(err).split(b"\n", 1)
    num = first[len(tag) :]
    return (int(num) if num.isdigit() else None), bytearray(rest)


class SSHSession:
    """One authenticated connection (plus its jump hops). Thread-safe for commands and channels;
    SFTP calls are serialised. Close it (or use ``with``)."""

    def __init__(self, target: SSHTarget, client: paramiko.SSHClient, hops: list[paramiko.SSHClient]):
        self.target = target
        self._client = client
        self._hops = hops
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.RLock()
        self._forwards: list[LocalForward] = []

    @property
    def transport(self) -> paramiko.Transport:
        t = self._client.get_transport()
        if t is None or not t.is_active():
            raise RemoteError(f"SSH connection to {self.target.label} is closed")
        return t

    # commands ------------------------------------------------------------------------------
    def run(
        self, argv: Sequence[str] | str, *, timeout: float = 60.0, check: bool = False, input: bytes | None = None
    ) -> CommandResult:
        """Run a command on the host. ``argv`` items are each shlex-quoted (a ``str`` is sent as
        is: only for fixed text). Output is decoded as UTF-8 with replacement."""
        line = quote_argv(argv)
        # sshd makes the command's shell a session (and process-group) leader: it says its pid
        # first, so that a timeout or an interrupt can kill the whole group on the host, not just
        # close the channel and leave a hung `systemctl restart` running.
        wrapped = f"printf '{_PGID_TAG}%s\\n' \"$$\" >&2; exec sh -c {shlex.quote(line)}"
        pgid: int | None = None
        chan = None
        try:
            chan = self.transport.open_session(timeout=self.target.timeout)
            chan.settimeout(timeout)
            chan.exec_command(wrapped)
            if input is not None:
                chan.sendall(input)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:
                if chan.recv_ready():
                    out += chan.recv(65536)
                    continue
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    if pgid is None:
                        pgid, err = _take_pgid(err)
                    continue
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    raise RemoteError(f"command on {self.target.label} timed out after {timeout:g}s: {line[:120]}")
                select.select([chan], [], [], 0.2)
            rc = chan.recv_exit_status()
            chan.close()
            if pgid is None:
                pgid, err = _take_pgid(err)
        except BaseException as e:
            if chan is not None:
                with contextlib.suppress(Exception):
                    chan.close()
            if pgid is not None:
                self._kill_group(pgid)
            if isinstance(e, RemoteError) or not isinstance(e, (paramiko.SSHException, OSError, EOFError)):
                raise
            raise RemoteError(f"SSH command on {self.target.label} failed: {e}") from None
        res = CommandResult(line, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        if check and rc != 0:
            msg = (res.stderr.strip() or res.stdout.strip()).splitlines()
            raise CommandFailed(
                f"on {self.target.label}: `{line[:120]}` exited {rc}" + (f": {msg[-1][:200]}" if msg else "")
            )
        return res

    def _kill_group(self, pgid: int) -> None:
        """SIGTERM, then SIGKILL after 2 s, to a process group on the host (best effort)."""
        script = (
            f"kill -TERM -- -{pgid} 2>/dev/null || exit 0; i=0; while [ $i -lt 20 ]; do "
            f"kill -0 -- -{pgid} 2>/dev/null || exit 0; sleep 0.1; i=$((i+1)); done; kill -KILL -- -{pgid} 2>/dev/null; exit 0"
        )
        with contextlib.suppress(Exception):
            chan = self.transport.open_session(timeout=5)
            chan.settimeout(10)
            chan.exec_command(script)
            chan.recv_exit_status()
            chan.close()

    # port forwarding -----------------------------------------------------------------------
    def forward(self, remote_port: int, remote_host: str = "127.0.0.1", *, check: bool = True) -> LocalForward:
        """Start a local forwarder to ``remote_host:remote_port`` as seen from the host (default
        its loopback). With ``check`` it first proves something listens there (:class:`ServerDown`)."""
        fwd = LocalForward(
            self.transport, remote_port, remote_host, label=self.target.label, timeout=self.target.timeout
        )
        self._forwards.append(fwd)
        if check:
            try:
                fwd.check()
            except BaseException:
                fwd.close()
                raise
        return fwd

    # files ---------------------------------------------------------------------------------
    def sftp(self) -> paramiko.SFTPClient:
        with self._sftp_lock:
            if self._sftp is None:
                try:
                    self._sftp = self._client.open_sftp()
                    ch = self._sftp.get_channel()
                    if ch is not None:
                        ch.settimeout(max(self.target.timeout, 30.0))
                except (paramiko.SSHException, OSError, EOFError) as e:
                    raise RemoteError(f"SFTP is not available on {self.target.label}: {e}") from None
            return self._sftp

    def listdir(self, path: str) -> list[paramiko.SFTPAttributes]:
        """Entries of a remote folder (name, size, mtime, mode)."""
        with self._sftp_lock:
            try:
                return self.sftp().listdir_attr(path)
            except FileNotFoundError:
                raise RemoteError(f"{path} does not exist on {self.target.label}") from None
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"cannot list {path} on {self.target.label}: {e}") from None

    def read_bytes(self, path: str, regular_cap: int | None = None) -> bytes:
        """The remote file's bytes. ``regular_cap``: only a regular file of at most that many bytes
        (stat'ed first: opening a FIFO would block the SFTP server, a device would never end)."""
        with self._sftp_lock:
            try:
                if regular_cap is not None:
                    st = self.sftp().stat(path)
                    where = f"{self.target.label}:{path}"
                    if stat_mod.S_ISDIR(st.st_mode or 0):
                        raise InputError(f"{where}: is a folder, not a file")
                    if not stat_mod.S_ISREG(st.st_mode or 0):
                        raise InputError(
                            f"{where}: not a regular file (a pipe or device): fix reads and patches regular files only"
                        )
                    if (st.st_size or 0) > regular_cap:
                        raise InputError(
                            f"{where}: " + too_big("the file", regular_cap, "PERFSCOPE_MAX_FIX_FILE_MB", "MB")
                        )
                with self.sftp().open(path, "rb") as f:
                    f.prefetch()
                    data = f.read() if regular_cap is None else f.read(regular_cap + 1)
                    if regular_cap is not None and len(data) > regular_cap:
                        raise InputError(
                            f"{self.target.label}:{path}: "
                            + too_big("the file", regular_cap, "PERFSCOPE_MAX_FIX_FILE_MB", "MB")
                        )
                    return data
            except FileNotFoundError:
                raise RemoteError(f"{path} does not exist on {self.target.label}") from None
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"cannot read {path} on {self.target.label}: {e}") from None

    def write_bytes_atomic(
        self, path: str, data: bytes, mode: int | None = None, tmp_dir: str | None = None, follow_symlinks: bool = True
    ) -> None:
        """Write a remote file via a temporary file and an atomic rename; the old file's permission
        bits are kept (or set to ``mode``). The temporary file lives in ``tmp_dir`` when the rename
        from there works (same file system), else in the file's own folder. ``follow_symlinks``
        False: a path that is a symlink is refused (the fix engine resolved it at its check)."""
        from perfscope.util.files import plan_write

        with self._sftp_lock:
            sftp = self.sftp()
            try:  # the rules of perfscope.util.files.atomic_writer, over SFTP
                try:
                    if stat_mod.S_ISLNK(sftp.lstat(path).st_mode or 0):
                        if not follow_symlinks:
                            raise FixRefused(
                                f"{self.target.label}:{path} became a symlink since the check: "
                                "nothing written; check again"
                            )
                        path = sftp.normalize(path)  # write the link's target: the link stays
                    st = sftp.stat(path)
                except FileNotFoundError:
                    st = None
                how = plan_write(st.st_mode if st is not None else None, f"{self.target.label}:{path}")
                if how == "in_place":
                    with sftp.open(path, "wb") as f:
                        f.write(data)
                    return
                if mode is None and st is not None:
                    mode = stat_mod.S_IMODE(st.st_mode or 0) or None
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"cannot write {path} on {self.target.label}: {e}") from None
            d, name = posixpath.split(path)
            tmp_name = f".{name}.perfscope-{os.getpid()}-{threading.get_ident()}.tmp"
            if tmp_dir:
                tmp = posixpath.join(tmp_dir, tmp_name)
                try:
                    self._write_rename(sftp, tmp, path, data, mode)
                    return
                except (OSError, paramiko.SSHException):  # another file system: the file's own folder
                    with contextlib.suppress(Exception):
                        sftp.remove(tmp)
            tmp = posixpath.join(d, tmp_name)
            try:
                self._write_rename(sftp, tmp, path, data, mode, fallback=True)
            except BaseException as e:
                try:
                    sftp.remove(tmp)
                except Exception:
                    pass
                if isinstance(e, (OSError, paramiko.SSHException)):
                    raise RemoteError(f"cannot write {path} on {self.target.label}: {e}") from None
                raise

    @staticmethod
    def _write_rename(sftp, tmp: str, path: str, data: bytes, mode: int | None, fallback: bool = False) -> None:
        try:
            with sftp.open(tmp, "wb") as f:
                f.set_pipelined(True)
                f.write(data)
            if mode is not None:
                sftp.chmod(tmp, mode)
            try:
                sftp.posix_rename(tmp, path)
            except (IOError, paramiko.SSHException):
                if not fallback:
                    raise
                sftp.rename(tmp, path)  # servers without the posix-rename extension
        except BaseException:
            if not fallback:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp)
            raise

    def sha256(self, path: str) -> str:
        """sha256 of a remote file, computed on the host."""
        r = self.run(["sha256sum", "--", path], timeout=600)
        if r.ok and re.match(r"^[0-9a-f]{64}\b", r.stdout):
            return r.stdout[:64]
        script = (
            "import hashlib,sys\nh=hashlib.sha256()\nf=open(sys.argv[1],'rb')\n"
            "for b in iter(lambda: f.read(1<<20), b''): h.update(b)\nprint(h.hexdigest())"
        )
        r2 = self.run(["python3", "-c", script, path], timeout=600)
        if r2.ok and re.match(r"^[0-9a-f]{64}$", r2.stdout.strip()):
            return r2.stdout.strip()
        why = (r.stderr.strip() or r2.stderr.strip() or "no sha256sum or python3").splitlines()[-1]
        raise RemoteError(f"cannot hash {path} on {self.target.label}: {why[:200]}")

    def download(
        self,
        remote: str,
        local: str | os.PathLike,
        *,
        expected_sha256: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> str:
        """Copy a remote file here atomically (temp file + rename) and return its sha256. With
        ``expected_sha256`` a mismatch deletes the copy and raises :class:`RemoteError`.
        ``progress(done_bytes, total_bytes)`` is called as data arrives."""
        from perfscope.util.files import atomic_writer, copy_hashed

        try:
            with self._sftp_lock, atomic_writer(local, shared=True) as dst:
                sftp = self.sftp()
                total = sftp.stat(remote).st_size or 0
                with sftp.open(remote, "rb") as src:
                    src.prefetch(total)
                    digest = copy_hashed(src, dst, total, progress)
                if expected_sha256 and digest != expected_sha256:
                    raise RemoteError(
                        f"{remote} from {self.target.label} arrived damaged: sha256 {digest[:12]}... "
                        f"but the host has {expected_sha256[:12]}..."
                    )
            return digest
        except FileNotFoundError:
            raise RemoteError(f"{remote} does not exist on {self.target.label}") from None
        except (paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"copying {remote} from {self.target.label} failed: {e}") from None
        except OSError as e:
            from perfscope.util.files import local_write_error

            raise (local_write_error(e, local) or e) from None

    def remove(self, paths: Iterable[str], folder: str | None = None) -> None:
        """Delete files (and then the folder, if empty) over SFTP; errors are ignored."""
        with self._sftp_lock:
            sftp = self.sftp()
            for p in paths:
                try:
                    sftp.remove(p)
                except Exception:
                    pass
            if folder:
                try:
                    sftp.rmdir(folder)
                except Exception:
                    pass

    # lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        for f in self._forwards:
            f.close()
        self._forwards.clear()
        with self._sftp_lock:
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except Exception:
                    pass
                self._sftp = None
        for c in [self._client, *reversed(self._hops)]:
            try:
                c.close()
            except Exception:
                pass

    def __enter__(self) -> "SSHSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
