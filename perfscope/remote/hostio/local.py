"""The server's host is this machine (:class:`LocalHost`, for ``--url``): commands in their own process
group (:func:`kill_group`), the trace files read in place."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess

from perfscope.errors import InputError
from perfscope.remote.hostio.base import HostIO
from perfscope.remote.hostio.traces import RemoteFile, is_trace_name, trace_file_complete
from perfscope.remote.ssh import CommandResult, RemoteError, quote_argv
from perfscope.util.files import atomic_writer, copy_hashed, local_write_error, sha256_file


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
            p = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
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
        return CommandResult(
            quote_argv(argv), p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        )

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
