"""Inflate a trace file's bytes (gzip, every member; xz, every stream; or plain JSON), whole or a piece at
a time, within the trace bound (:func:`perfscope.util.limits.max_trace_bytes`): a file truncated, corrupt,
no regular file, empty or past the bound is a one-line InputError."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Callable, Iterator, Optional

from perfscope.errors import InputError
from perfscope.util import limits
from perfscope.util.files import read_regular

_CHUNK = 1 << 19  # JSON bytes inflated per call
_FEED = 1 << 18  # compressed bytes handed to zlib per call


def read_bytes(path: str | os.PathLike, progress: Optional[Callable[[int, int], None]] = None) -> bytes | bytearray:
    """The file's JSON bytes, inflated if gzipped or xz-compressed. Truncated or corrupt, a file that is no
    regular file, or one past the bound (:func:`perfscope.util.limits.max_trace_bytes`) -> InputError."""
    p = Path(path)
    return _inflate(_read_file(p), p, progress)


def _read_file(p: Path) -> bytearray:
    """The file's bytes as stored (compressed or not): no regular file, past the bound or empty -> InputError."""
    comp = read_regular(
        p,
        limits.max_trace_bytes(),
        "PERFSCOPE_MAX_TRACE_GB",
        "GB",
        what="the trace",
        hint="save the trace to a file and pass its path",
    )
    if not comp.strip():
        raise InputError(f"{p}: empty file, not a trace")
    return comp


def _json_chunks(comp: bytes | bytearray, p: Path, progress=None) -> Iterator[bytes | memoryview]:
    """The file's JSON in pieces of at most ``_CHUNK`` bytes, inflated as they are asked for; the same
    errors as :func:`read_bytes`, raised when the piece they are in is reached."""
    if comp[:6] == _XZ_MAGIC:
        return _unxz_chunks(comp, p, progress)
    if comp[:2] != b"\x1f\x8b":
        view = memoryview(comp)
        return (view[i : i + _CHUNK] for i in range(0, len(comp), _CHUNK))
    return _gunzip_chunks(comp, p, progress)


_XZ_MAGIC = b"\xfd7zXZ\x00"


def _unxz(comp: bytes | bytearray, p: Path, progress, cap: Optional[int] = None) -> bytearray:
    """Decompress an xz file (every stream of it) into one buffer of at most ``cap`` bytes (default:
    the trace bound), in chunks: a stream that grows past the bound is refused before it is held."""
    buf = bytearray()
    for out in _unxz_chunks(comp, p, progress, cap):
        buf += out
    return buf


def _unxz_chunks(comp: bytes | bytearray, p: Path, progress, cap: Optional[int] = None) -> Iterator[bytes]:
    """:func:`_unxz`'s chunks, one at a time (at most ``_CHUNK`` bytes each)."""
    import lzma

    cap = limits.max_trace_bytes() if cap is None else cap
    total = 0
    d = lzma.LZMADecompressor(lzma.FORMAT_XZ)
    data = comp
    while True:
        try:
            out = d.decompress(data, _CHUNK)
        except lzma.LZMAError as e:
            raise InputError(f"{p}: corrupt xz data ({e})") from None
        except MemoryError:
            raise InputError(f"{p}: not enough memory to decompress the trace ({total:,} bytes so far)") from None
        data = b""
        if total + len(out) > cap:
            raise InputError(
                f"{p}: "
                + limits.too_big(
                    f"the trace decompressed from its {len(comp):,} xz bytes", cap, "PERFSCOPE_MAX_TRACE_GB", "GB"
                )
            )
        total += len(out)
        if out:
            yield out
        if progress and d.eof:
            progress(len(comp) - len(d.unused_data), len(comp))
        if d.eof:
            rest = d.unused_data.lstrip(b"\0")  # stream padding between (and after) streams
            if not rest:
                break
            if rest[:6] != _XZ_MAGIC:
                raise InputError(f"{p}: {len(rest):,} bytes of junk after the xz stream")
            d = lzma.LZMADecompressor(lzma.FORMAT_XZ)
            data = rest
            continue
        if d.needs_input:
            break
    if not d.eof:
        raise InputError(
            f"{p}: truncated xz file (the stream ends after {total:,} bytes of JSON); "
            "was it copied while still being written?"
        )


def _gunzip(comp: bytes | bytearray, p: Path, progress, cap: Optional[int] = None) -> bytearray:
    """Inflate every gzip member of ``comp`` into one buffer of at most ``cap`` bytes (default: the
    trace bound); a stream that inflates past it is refused before it is held."""
    cap = limits.max_trace_bytes() if cap is None else cap
    hint = int.from_bytes(comp[-4:], "little") if len(comp) >= 18 else 0
    buf = bytearray(hint if 0 < hint < min(64 * len(comp) + (1 << 20), cap + 1) else 0)
    view = memoryview(buf)
    pos = 0
    try:
        for out in _gunzip_chunks(comp, p, progress, cap):
            n = len(out)
            if pos + n <= len(buf):
                view[pos : pos + n] = out
            else:  # the trailer's size was wrong (files over 4 GiB): grow
                view.release()
                buf[pos:] = out
                view = memoryview(buf)
            pos += n
    except MemoryError:
        raise InputError(f"{p}: not enough memory to inflate the trace ({pos:,} bytes so far)") from None
    view.release()
    if pos < len(buf):
        del buf[pos:]
    return buf


def _gunzip_chunks(comp: bytes | bytearray, p: Path, progress, cap: Optional[int] = None) -> Iterator[bytes]:
    """:func:`_gunzip`'s chunks, one at a time (at most ``_CHUNK`` bytes each). The compressed bytes are
    fed ``_FEED`` at a time: zlib copies the input it could not use yet on every call (its
    ``unconsumed_tail``), so feeding all of a large file at once would copy it again per chunk."""
    cap = limits.max_trace_bytes() if cap is None else cap
    view = memoryview(comp)
    size = len(comp)
    fed = total = 0  # compressed bytes handed to zlib, JSON bytes out
    d = zlib.decompressobj(31)
    while True:
        data: bytes | memoryview = view[fed : fed + _FEED]
        fed += len(data)
        while True:
            try:
                # at most _CHUNK bytes out per call: no large temporary beside the buffer
                out = d.decompress(data, _CHUNK)
            except zlib.error as e:
                raise InputError(f"{p}: corrupt gzip data ({e})") from None
            except MemoryError:
                raise InputError(f"{p}: not enough memory to inflate the trace ({total:,} bytes so far)") from None
            n = len(out)
            if total + n > cap:
                raise InputError(
                    f"{p}: "
                    + limits.too_big(
                        f"the trace inflated from its {size:,} gzip bytes", cap, "PERFSCOPE_MAX_TRACE_GB", "GB"
                    )
                )
            total += n
            if n:
                yield out
            data = d.unconsumed_tail
            if d.eof or (not data and not out):
                break
        # at the end of a member, what follows it in the input is its unused_data (zlib may leave it in
        # unconsumed_tail too)
        done = fed - len(d.unused_data if d.eof else data)
        if progress:
            progress(done, size)
        if d.eof:
            rest_at = done
            if rest_at < size:  # RFC 1952: several members are one file, read whole
                rest = view[rest_at:]
                if rest[:2] != b"\x1f\x8b":
                    if bytes(rest).strip(b"\0"):
                        raise InputError(f"{p}: {len(rest):,} bytes of junk after the gzip stream")
                    break
                d = zlib.decompressobj(31)
                fed = rest_at
                continue
            break
        if fed >= size:
            break
    if not d.eof:
        raise InputError(
            f"{p}: truncated gzip file (the stream ends after {total:,} bytes of JSON); "
            "was it copied while still being written?"
        )


def _inflate(comp: bytes | bytearray, p: Path, progress=None) -> bytes | bytearray:
    if comp[:6] == _XZ_MAGIC:
        return _unxz(comp, p, progress)
    if comp[:2] != b"\x1f\x8b":
        return comp
    return _gunzip(comp, p, progress)
