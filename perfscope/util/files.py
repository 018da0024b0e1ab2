"""Write files atomically and hash them: nothing a user had is lost or half-written.

One writer for every file perfscope writes on this machine (:func:`atomic_writer`, and
:func:`atomic_write_bytes` / :func:`atomic_write_text` over it), with these rules:

* a new path or an existing *regular* file: a temporary file in the same folder, fsync, then
  ``os.replace`` -- readers see the old content or the new one, never a mix; the permission bits
  of the file it replaces are kept;
* a symlink: the file it points to is written (by the rules above), so the link stays a link;
* a character device or a FIFO (``-o /dev/null``, ``/dev/stdout``, a named pipe): written in
  place, never replaced -- a rename over ``/dev/null`` would break the machine;
* anything else that is not a regular file (a folder, a block device, a socket): refused with
  :class:`~perfscope.errors.InputError`.

The SSH session's remote writer (:meth:`perfscope.remote.ssh.session.SSHSession.write_bytes_atomic`)
applies the same rules through SFTP, using :func:`plan_write` for the decision.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod
from pathlib import Path
from typing import IO, Iterator, Optional

from perfscope.errors import InputError


def _sha256():  # hashlib (OpenSSL) and tempfile load when a file is hashed or written, not with the CLI
    import hashlib

    return hashlib.sha256()


def sha256_bytes(data: bytes) -> str:
    h = _sha256()
    h.update(data)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike | IO[bytes], chunk: int = 1 << 20) -> str:
    """The sha256 of a file, named by its path or given open (read from where it is to its end)."""
    if not isinstance(path, (str, os.PathLike)):
        return _sha256_stream(path, chunk)
    with open(path, "rb") as f:
        return _sha256_stream(f, chunk)


def _sha256_stream(f: IO[bytes], chunk: int) -> str:
    h = _sha256()
    while block := f.read(chunk):
        h.update(block)
    return h.hexdigest()


def copy_hashed(src: IO[bytes], dst: IO[bytes], total: int = 0, progress=None, chunk: int = 1 << 20) -> str:
    """Copy ``src`` to ``dst`` in blocks, hashing as it goes (the copy is not read a second time);
    ``progress(done_bytes, total)`` after each block. Returns the sha256 of what was copied."""
    h = _sha256()
    done = 0
    while b := src.read(chunk):
        dst.write(b)
        h.update(b)
        done += len(b)
        if progress:
            progress(done, total)
    return h.hexdigest()


def read_regular(
    path: str | os.PathLike,
    cap: int,
    bound_var: str,
    unit: str = "MB",
    what: str = "the file",
    hint: str = "save it to a file and pass its path",
) -> bytearray:
    """The bytes of a *regular* file of at most ``cap`` bytes, read once through one descriptor:
    a FIFO, a device or a socket is refused without blocking (opened non-blocking, checked with
    fstat), a folder is refused, and a file larger than ``cap`` (or growing past it while read)
    is refused naming the bound and ``bound_var``, the variable that raises it. Every failure is
    one :class:`~perfscope.errors.InputError` line."""
    from perfscope.util.limits import too_big

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat_mod.S_ISDIR(st.st_mode):
            raise InputError(f"{path}: is a folder, not a file")
        if not stat_mod.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file (a pipe or device): {hint}")
        if st.st_size > cap:
            raise InputError(f"{path}: " + too_big(what, cap, bound_var, unit))
        os.set_blocking(fd, True)
        # one buffer of the file's size (a caller may repair it in place); a file that grew since
        # the fstat is read on, up to the bound
        data = bytearray(st.st_size)
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
            got = 0
            with memoryview(data) as v:
                while got < len(data):
                    n = f.readinto(v[got:])
                    if not n:
                        break
                    got += n
            del data[got:]
            while len(data) <= cap:
                more = f.read(min(1 << 22, cap + 1 - len(data)))
                if not more:
                    break
                data += more
    except MemoryError:
        raise InputError(f"{path}: not enough memory to read {what} ({st.st_size:,} bytes)") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise InputError(f"{path}: " + too_big(what, cap, bound_var, unit))
    return data


_LOCAL_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def local_write_error(e: OSError, path: str | os.PathLike) -> Optional[InputError]:
    """For an OSError from writing ``path`` here (a full disk, a quota, a read-only file system),
    the one-line error that names the path; None for other errors (a network read, say)."""
    if e.errno in _LOCAL_WRITE_ERRNOS:
        return InputError(f"{path}: cannot write ({e.strerror}); free space there or choose another --out")
    return None


def plan_write(st_mode: Optional[int], where: str) -> str:
    """How to write a path whose (symlink-resolved) ``st_mode`` is given (None: it does not exist):
    ``"replace"`` (temp file + rename) or ``"in_place"``; anything else raises InputError."""
    if st_mode is None or stat_mod.S_ISREG(st_mode):
        return "replace"
    if stat_mod.S_ISCHR(st_mode) or stat_mod.S_ISFIFO(st_mode):
        return "in_place"
    if stat_mod.S_ISDIR(st_mode):
        raise InputError(f"{where}: is a folder, not a file")
    kind = "block device" if stat_mod.S_ISBLK(st_mode) else "socket" if stat_mod.S_ISSOCK(st_mode) else "special file"
    raise InputError(f"{where}: is a {kind}; perfscope writes only regular files, character devices and FIFOs")


def _resolve(path: Path) -> Path:
    """The file a symlink (chain) points to; the path itself otherwise."""
    if path.is_symlink():
        return Path(os.path.realpath(path))
    return path


def umask_mode() -> int:
    """0666 less the process umask: the mode ``open()`` gives a new file (mkstemp gives 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike, mode: int | None = None, tmp_dir: str | os.PathLike | None = None, shared: bool = False
) -> Iterator[IO[bytes]]:
    """A binary file object for ``path`` written by the rules in the module docstring; the new
    content replaces the old only when the ``with`` block ends without an exception.

    ``tmp_dir``: where the temporary file lives, when it is on the target's file system (else the
    target's folder): the fix engine keeps it in its state folder, so that a kill at any moment
    leaves no stray file in a package folder.

    ``shared``: a file for the user (a report, a run folder's files, a trace): a new one gets the
    mode the umask gives (:func:`umask_mode`), as any file the user's tools write, not mkstemp's
    0600; an existing one keeps its mode either way."""
    target = _resolve(Path(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    how = plan_write(st.st_mode if st else None, str(path))
    if how == "in_place":
        with open(target, "wb") as f:
            yield f
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if mode is None and st is not None:
        mode = st.st_mode & 0o7777
    elif mode is None and shared:
        mode = umask_mode()
    where = target.parent
    if tmp_dir is not None:
        with contextlib.suppress(OSError):
            if os.stat(tmp_dir).st_dev == os.stat(target.parent).st_dev:
                where = Path(tmp_dir)
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=where)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(
    path: str | os.PathLike,
    data: bytes,
    mode: int | None = None,
    tmp_dir: str | os.PathLike | None = None,
    shared: bool = False,
) -> Path:
    """Write ``data`` to ``path`` with :func:`atomic_writer`; returns ``path``."""
    with atomic_writer(path, mode=mode, tmp_dir=tmp_dir, shared=shared) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None, shared: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode, shared=shared)


def resource_dir(name: str) -> Path:
    """Top-level project folders shipped with the package (``fixes``, ``reports``).

    In a source checkout (or an editable install) they sit beside the package; in a wheel they are
    installed inside it as ``perfscope/_<name>``.
    """
    pkg = Path(__file__).resolve().parent.parent
    for candidate in (pkg.parent / name, pkg / f"_{name}"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"perfscope resource folder {name!r} not found beside {pkg}")


def user_path(path: str | os.PathLike) -> Path:
    """A path the user typed, made absolute once: ``~`` expanded, relative to the working directory.

    Every command that writes (``--out``, ``--html``, ``-o``, ``--markdown``, ``--csv``) resolves its
    path here before anything joins onto it, so ``--out run1`` and ``--out ~/runs/r1`` mean what
    they mean in a shell. Symlinks are kept (``absolute``, not ``resolve``)."""
    return Path(os.path.expanduser(os.fspath(path))).absolute()
