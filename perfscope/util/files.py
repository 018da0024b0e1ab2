"""Write files atomically and hash them: nothing a user had is lost or half-written."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    Readers see the old content or the new one, never a mix. The file's permission bits are kept
    when it existed (or set to ``mode``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None and path.exists():
        mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


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
