"""The reader decodes a trace's events a piece at a time (perfscope.load.reader._stream): the inflated
JSON is never whole in memory, and the result is the whole-buffer read's (reader.parse) for every
layout, the odd ones read whole. Built from the real H200 traces in tests/traces."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import msgspec
import orjson
import pytest

from paths import H200, json_of

from perfscope.errors import InputError
from perfscope.load import inflate, reader


def _norm(t):
    raw = lambda x: bytes(x) if isinstance(x, msgspec.Raw) else x  # noqa: E731
    return (t.meta.to_dict(), *[[tuple(raw(v) for v in e) for e in getattr(t, k)]
                                for k in ("kernels", "launches", "cpu_ops", "frames", "annotations")])


@pytest.fixture
def streamed(monkeypatch):
    """Small pieces (many per file); records whether each load was read in pieces (True) or whole."""
    monkeypatch.setattr(reader, "_PIECE", 3000)
    monkeypatch.setattr(inflate, "_CHUNK", 1000)
    seen = []
    real = reader._stream

    def spy(chunks, path):
        t = real(chunks, path)
        seen.append(t is not None)
        return t

    monkeypatch.setattr(reader, "_stream", spy)
    return seen


def _layouts() -> dict[str, tuple[bytes, bool]]:
    """name -> (JSON text, read in pieces?)"""
    text = json_of(H200 / "mla_pool_graph.json.xz")
    top = orjson.loads(text)
    ev = top["traceEvents"]
    after = {k: v for k, v in top.items() if k != "traceEvents"}
    odd = [dict(e) for e in ev]
    odd[100] = {**odd[100], "name": 'x},{"ph": "X", "traceEvents": [ \\"}, {'}  # boundaries in a name
    odd[200] = {**odd[200], "args": {**(odd[200].get("args") or {}), "nested": {"a": {"b": 1}}, "z": [{}, {}]}}
    odd[300] = {**odd[300], "dur": "12.5"}  # breaks the schema: the lax decoder
    odd[400] = {**odd[400], "dur": -3.0}  # negative duration
    return {
        "kineto": (text, True),
        "minified": (orjson.dumps(top), True),
        "indented": (json.dumps(top, indent=1).encode(), True),
        "events first, keys after": (orjson.dumps({"traceEvents": ev, **after}), True),
        "odd events": (orjson.dumps({**after, "traceEvents": odd}), True),
        "no '},' between events": (b'{"traceEvents": [' + b"}\n,".join(orjson.dumps(e)[:-1] for e in ev) + b"}\n]}",
                                   True),
        "keys split around the events": (orjson.dumps({"schemaVersion": 1, "traceEvents": ev, **after})[:-1] + b', "deviceProperties": [{"name": "later"}]}', True),
        "traceEvents twice": (orjson.dumps({"traceEvents": ev[:10], **after})[:-1] + b', "traceEvents": '
                              + orjson.dumps(ev) + b"}", False),
        "array format": (orjson.dumps(ev), False),
        "utf-8 BOM": (b"\xef\xbb\xbf" + text, False),
        "empty events": (b'{"traceEvents": [], "traceName": "x"}', True),
    }


@pytest.mark.parametrize("name", list(_layouts()))
def test_streamed_read_is_the_whole_read(name, streamed, tmp_path):
    text, in_pieces = _layouts()[name]
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(text, 1))
    whole = reader.parse(bytearray(text), str(p))
    got = reader.load_trace(p)
    assert _norm(got) == _norm(whole)
    assert streamed == [in_pieces]
    if name == "odd events":
        assert got.meta.lax_events == 2 and got.meta.negative_durations == 1


@pytest.mark.parametrize("damage", ["broken late", "bare quote late", "truncated JSON", "junk after", "too many"])
def test_a_file_broken_after_pieces_were_read_says_what_the_whole_read_says(damage, streamed, tmp_path, monkeypatch):
    text = json_of(H200 / "mla_pool_graph.json.xz")
    at = text.rindex(b'"name": "', 0, len(text) * 9 // 10) + len(b'"name": "')
    if damage == "broken late":
        text = text[:at] + b'\x01"' + text[at:]
    elif damage == "bare quote late":  # the torch profiler's unescaped quote: repaired, and counted
        text = text[:at] + b'say "hi" ' + text[at:]
    elif damage == "truncated JSON":
        text = text[:len(text) * 9 // 10]
    elif damage == "junk after":
        text = text + b"}"
    else:
        monkeypatch.setenv("PERFSCOPE_MAX_EVENTS", "4000")
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(text, 1))
    try:
        want = _norm(reader.parse(bytearray(text), str(p)))
    except InputError as e:
        want = str(e)
    try:
        got = _norm(reader.load_trace(p))
    except InputError as e:
        got = str(e)
    assert got == want and streamed == [False]
    if damage == "bare quote late":
        assert want[0]["repaired_names"] == 1


def test_truncated_gzip_after_pieces_were_read_is_the_same_error(streamed, tmp_path):
    comp = gzip.compress(json_of(H200 / "mla_pool_graph.json.xz"), 1)
    p = tmp_path / "t.json.gz"
    p.write_bytes(comp[:len(comp) * 3 // 4])
    with pytest.raises(InputError) as whole:
        reader.read_bytes(p)
    with pytest.raises(InputError) as got:
        reader.load_trace(p)
    assert str(got.value) == str(whole.value) and "truncated gzip file" in str(got.value)


def test_reading_a_real_trace_peaks_below_1_5x_its_json(tmp_path):
    """tracemalloc's peak while the real 5-step H200 eager trace (8.7 MB of JSON, gzipped as the
    profiler writes it) is read, over its JSON size. The whole-buffer reader held the inflated JSON,
    its raw event slices and the events: 2.56x (the shapes, views of the buffer, kept it alive after);
    read in pieces it is the events plus a piece: 1.14x."""
    text = json_of(H200 / "mla_pool_eager.json.xz")
    p = tmp_path / "eager.json.gz"
    p.write_bytes(gzip.compress(text, 6))
    del text
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        t = reader.load_trace(p)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    ratio = peak / t.meta.json_bytes
    assert t.meta.json_bytes > 8e6 and len(t.cpu_ops) > 1000
    assert ratio <= 1.5, f"reading peaked at {ratio:.2f}x the JSON size"


@pytest.mark.parametrize("suffix", [".json", ".json.xz", ".json.gz (two members)"])
def test_every_compression_is_read_in_pieces(suffix, streamed, tmp_path):
    import lzma

    text = json_of(H200 / "mla_pool_graph.json.xz")
    p = tmp_path / ("t" + suffix.split()[0])
    half = len(text) // 2
    p.write_bytes(text if suffix == ".json" else lzma.compress(text) if suffix == ".json.xz"
                  else gzip.compress(text[:half], 1) + gzip.compress(text[half:], 1))
    assert _norm(reader.load_trace(p)) == _norm(reader.parse(bytearray(text), str(p)))
    assert streamed == [True]
