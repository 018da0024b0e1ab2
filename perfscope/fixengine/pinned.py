"""A fix's target file on this machine, resolved once and held: what is checked is what is written.

``fix --apply`` reads the target, computes the patch, writes a backup and a manifest, then replaces
the file; ``--revert`` reads, checks the manifest, then restores. Between those steps another
process may swap the file for a symlink (to a file the user running perfscope may write, but the
swapper may not). :class:`PinnedFile` resolves the path's symlinks once, at the check; opens the
file and its folder without following a link (``O_NOFOLLOW``); keeps both descriptors (so that the
inode cannot be reused while perfscope runs); and before every read and write compares the
folder's entry (not followed) with the held file's ``st_dev``/``st_ino``. Anything else there now
is refused with :class:`~perfscope.errors.FixRefused`, nothing written. The new file goes in by
``rename`` on the held folder, which replaces the entry itself and never follows a link."""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
from typing import Optional

from perfscope.errors import FixRefused, InputError


class PinnedFile:
    def __init__(self, path: str):
        self.path = path
        self.real = os.path.realpath(path)
        folder, self.name = os.path.split(self.real)
        self.dir_fd = self.fd = -1
        try:
            self.dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            self.fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.dir_fd)
        except FileNotFoundError:
            self.close()
            raise InputError(f"{path}: no such file") from None
        except OSError as e:
            self.close()
            if os.path.islink(self.real):
                raise FixRefused(f"{path}: became a symlink while it was resolved; check again") from None
            raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
        st = os.fstat(self.fd)
        if not stat_mod.S_ISREG(st.st_mode):
            self.close()
            raise InputError(f"{path}: not a regular file")
        self.ident = (st.st_dev, st.st_ino)
        self.mode = stat_mod.S_IMODE(st.st_mode)

    def check(self) -> None:
        """Refuse unless the folder's entry is still the held file (not followed if a link)."""
        try:
            st = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self.ident:
            what = "removed" if st is None else "a symlink now" if stat_mod.S_ISLNK(st.st_mode) else "another file now"
            raise FixRefused(f"{self.path} changed since the check ({what}): nothing written; check again")

    def read(self) -> bytes:
        """The held file's bytes, at most PERFSCOPE_MAX_FIX_FILE_MB (as an unpinned read)."""
        from perfscope.util.limits import max_fix_file_bytes, too_big

        self.check()
        cap = max_fix_file_bytes()
        parts, off = [], 0
        while chunk := os.pread(self.fd, 1 << 20, off):
            parts.append(chunk)
            off += len(chunk)
            if off > cap:
                raise InputError(f"{self.path}: " + too_big("the file", cap, "PERFSCOPE_MAX_FIX_FILE_MB", "MB"))
        return b"".join(parts)

    def replace(self, data: bytes, tmp_dir: Optional[str] = None) -> None:
        """Write ``data`` to a temporary file (in ``tmp_dir`` when it is on the same file system,
        else beside the file), then rename it over the held entry, if that is still the held file;
        the permission bits are kept. The new file is held from then on."""
        self.check()
        where = self.dir_fd
        tmp_fd_dir = -1
        if tmp_dir is not None:
            with contextlib.suppress(OSError):
                tmp_fd_dir = os.open(tmp_dir, os.O_RDONLY | os.O_DIRECTORY)
                if os.fstat(tmp_fd_dir).st_dev == os.fstat(self.dir_fd).st_dev:
                    where = tmp_fd_dir
        tmp = f".{self.name}.perfscope-{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=where)
            try:
                try:
                    with os.fdopen(fd, "wb", closefd=False) as f:
                        f.write(data)
                        f.flush()
                        os.fsync(fd)
                    os.fchmod(fd, self.mode)
                    new = os.fstat(fd)
                finally:
                    os.close(fd)
                self.check()  # the last look: the entry is still the file the patch was computed from
                os.replace(tmp, self.name, src_dir_fd=where, dst_dir_fd=self.dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=where)
                raise
        except PermissionError:
            raise InputError(
                f"{self.path}: permission denied (run as the user that owns the server's python)"
            ) from None
        except OSError as e:
            raise InputError(f"{self.path}: cannot write ({e.strerror or e}); the file is unchanged") from None
        finally:
            if tmp_fd_dir >= 0:
                os.close(tmp_fd_dir)
        os.close(self.fd)
        try:
            self.fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.dir_fd)
        except OSError:
            self.fd = -1
        self.ident = (new.st_dev, new.st_ino)
        if self.fd < 0 or (os.fstat(self.fd).st_dev, os.fstat(self.fd).st_ino) != self.ident:
            raise FixRefused(f"{self.path} was replaced by another process right after perfscope wrote it")

    def close(self) -> None:
        for fd in (self.fd, self.dir_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.dir_fd = -1
