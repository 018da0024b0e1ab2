"""The real-trace corpus in tests/traces/corpus: its README's table is the truth about the files
(every file listed with its origin and licence, both sha256s right), no secret is left in a trace's
metadata, and perfscope reads each xz file as it reads the same JSON gzipped."""

from __future__ import annotations

import functools
import gzip
import hashlib
import lzma
import re

from clirun import invoke
from paths import TRACES
from perfscope.analysis.parallel import json_bytes
from perfscope.load import load_trace

ROW = re.compile(r"^\| `([^`]+)` \| (.+?) \| (.+?) \| `([0-9a-f]{64})` \| `([0-9a-f]{64})` \|$")
TOKEN = re.compile(rb"hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16}")
# each alternative alone: a pattern with a literal start is searched for fast; TOKEN runs only where one is found
TOKEN_PARTS = [re.compile(p) for p in TOKEN.pattern.split(b"|")]


@functools.lru_cache(maxsize=None)
def _json_facts(rel: str) -> tuple[str, tuple[bytes, ...]]:
    """A corpus file's JSON (decompressed once for both tests): its sha256 and every TOKEN match in it."""
    data = (TRACES / rel).read_bytes()
    raw = lzma.decompress(data) if rel.endswith(".xz") else data
    tokens = TOKEN.findall(raw) if any(p.search(raw) for p in TOKEN_PARTS) else []
    return hashlib.sha256(raw).hexdigest(), tuple(tokens)


def _table() -> dict[str, tuple[str, str, str, str]]:
    rows = {}
    for ln in (TRACES / "README.md").read_text().splitlines():
        m = ROW.match(ln)
        if m:
            rows[m.group(1)] = m.groups()[1:]
    return rows


def test_every_corpus_file_is_in_the_table_with_its_sha256_and_licence():
    rows = _table()
    files = sorted(str(p.relative_to(TRACES)) for p in TRACES.rglob("*") if p.is_file() and p.name != "README.md")
    assert len(files) >= 30 and sorted(rows) == files
    for rel, (origin, licence, json_sha, file_sha) in rows.items():
        assert hashlib.sha256((TRACES / rel).read_bytes()).hexdigest() == file_sha, rel
        assert _json_facts(rel)[0] == json_sha, rel
        assert ("MIT" in licence) == rel.startswith("public/") and origin.strip(), rel


def test_no_token_is_left_in_a_corpus_trace():
    for p in sorted(TRACES.rglob("*.json.xz")):
        hits = [h for h in _json_facts(str(p.relative_to(TRACES)))[1] if h.strip(b"X")[3:]]  # X's: redacted
        assert not hits, (p.name, hits[:2])


def test_an_xz_trace_reads_as_the_same_json_gzipped(tmp_path):
    src = TRACES / "h200-mla-fp8-kv" / "mla_pool_graph.json.xz"
    raw = lzma.decompress(src.read_bytes())
    gz = tmp_path / "same.json.gz"
    gz.write_bytes(gzip.compress(raw))
    a, b = load_trace(src), load_trace(gz)
    assert len(a.kernels) == len(b.kernels) > 100 and a.kernels == b.kernels and a.launches == b.launches
    assert json_bytes(src) == json_bytes(gz) == len(raw)  # the xz index gives the JSON size exactly


def test_a_damaged_xz_trace_gets_one_line_and_exit_2(tmp_path):
    """Truncated (copied while written), corrupt, junk after the stream, or past the size bound:
    one line naming the file and what is wrong, exit 2; stream padding and several streams read."""
    import os

    data = (TRACES / "h200-mla-fp8-kv" / "mla_pool_graph.json.xz").read_bytes()
    cases = {"truncated.json.xz": (data[: len(data) // 2], {}, "truncated xz file"),
             "corrupt.json.xz": (data[:100] + bytes(100) + data[200:], {}, "corrupt xz data"),
             "junk.json.xz": (data + b"junk\n", {}, "bytes of junk after the xz stream"),
             "big.json.xz": (data, {"PERFSCOPE_MAX_TRACE_GB": "0.001"}, "PERFSCOPE_MAX_TRACE_GB")}
    for name, (body, env, want) in cases.items():
        (tmp_path / name).write_bytes(body)
        r = invoke("diagnose", tmp_path / name, env={**os.environ, **env})
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and want in lines[0] and name in lines[0], (name, r.stderr)
    padded = tmp_path / "padded.json.xz"  # stream padding (4 zero bytes) after the stream: valid xz
    padded.write_bytes(data + bytes(4))
    assert load_trace(padded).kernels == load_trace(TRACES / "h200-mla-fp8-kv" / "mla_pool_graph.json.xz").kernels
    assert json_bytes(padded) == len(lzma.decompress(data))
