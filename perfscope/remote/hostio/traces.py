"""Trace files on the server's host: which names are traces, a command line's worth of paths at a time,
whether a trace is complete (checked here, and by a program run on the host), a listing's entries."""

from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass
from typing import Iterator

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


# Run on the host with the server's files as arguments; prints the incomplete ones. The same test
# as trace_file_complete() below, in the same bounded steps (a remote python3 need not have perfscope).
COMPLETE_CHECK_PY = r"""
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


def trace_file_complete(path: str | os.PathLike) -> bool:
    """A ``.gz`` trace: its gzip stream ends (:func:`gzip_intact_local`). A plain JSON trace: it
    ends as Kineto ends every trace, the event list closed, then ``"traceName"`` and the closing
    brace (a writer still going, or one that died, has not written them)."""
    if str(path).endswith(".gz"):
        return gzip_intact_local(path)
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            return KINETO_END.search(f.read()) is not None
    except OSError:
        return False


KINETO_END = re.compile(rb'\]\s*,\s*"traceName"\s*:[^\]]*\}\s*$')


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
