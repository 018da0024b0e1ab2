"""How many rank files to parse at once: one process per file and CPU, as many as memory allows.

Diagnosing a Kineto trace peaks at about 1.4x its JSON size in each worker (the reader decodes the JSON
a piece at a time: benchmarks/diagnose_speed.py measures 239 MB for the 171 MB eager trace), and at
about 2.3x for a file the reader reads whole (JSON Array Format, UTF-16, JSON to repair: 385 MB): the
plan budgets for the latter. A TP8 profile of 8 large ranks parsed 8 at a time
can need more memory than the box has (HTA needed 950 GB for 200 GB of traces, its issue #250), so
the plan admits only as many workers as the largest files, parsed together, fit in."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

PEAK_PER_JSON_BYTE = 2.6  # a file read whole: 2.42x measured on the 210 MB trace; a margin on top
MEMORY_FRACTION = 0.8  # of what the OS reports available


def json_bytes(path: str | Path) -> int:
    """The JSON size of a trace file: a ``.gz`` file's ISIZE trailer (the uncompressed size modulo
    4 GiB, raised by 4 GiB steps until it is not smaller than the compressed file), an ``.xz``
    file's index (the uncompressed size of every block, exact), else its size."""
    p = Path(path)
    size = p.stat().st_size
    if p.name.endswith(".xz"):
        return _xz_size(p, size)
    if not p.name.endswith(".gz") or size < 18:
        return size
    with open(p, "rb") as f:
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    while isize < size:
        isize += 1 << 32
    return isize


def _varint(b: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        c = b[i]
        v |= (c & 0x7F) << shift
        i += 1
        if not c & 0x80:
            return v, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _xz_size(p: Path, size: int) -> int:
    """The uncompressed size an xz file's indexes record (streams read from the end, as xz --list
    does); the file's own size when it is no well-formed xz file (the reader then says why)."""
    total = 0
    try:
        with open(p, "rb") as f:
            end = size
            while end > 0:
                f.seek(end - 4)
                if f.read(4) == b"\0\0\0\0":  # stream padding
                    end -= 4
                    continue
                if end < 24:
                    return size
                f.seek(end - 12)
                footer = f.read(12)
                if footer[10:] != b"YZ":
                    return size
                index_size = (int.from_bytes(footer[4:8], "little") + 1) * 4
                if index_size > end - 24 or index_size > 64 << 20:
                    return size
                f.seek(end - 12 - index_size)
                index = f.read(index_size)
                if index[:1] != b"\0":
                    return size
                n, i = _varint(index, 1)
                blocks = 0
                for _ in range(n):
                    unpadded, i = _varint(index, i)
                    out, i = _varint(index, i)
                    total += out
                    blocks += (unpadded + 3) & ~3
                end -= 12 + index_size + blocks + 12
    except (OSError, IndexError, ValueError):
        return size
    return total if end == 0 else size


def available_memory() -> Optional[int]:
    """Bytes the OS can give without swapping (Linux MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def plan_workers(sizes: Sequence[int], cpus: int, available: Optional[int]) -> tuple[int, str]:
    """(workers, what bounds them: "files", "cpus" or "memory") for files of these JSON sizes."""
    n = max(1, min(len(sizes), cpus))
    bound = "files" if len(sizes) <= cpus else "cpus"
    if available is None or n == 1:
        return n, bound
    budget = available * MEMORY_FRACTION
    largest = sorted(sizes, reverse=True)
    fit = 0
    need = 0.0
    for s in largest[:n]:
        need += s * PEAK_PER_JSON_BYTE
        if need > budget:
            break
        fit += 1
    if fit < n:
        return max(fit, 1), "memory"
    return n, bound
