"""The real-trace corpus in tests/traces/corpus: its README's table is the truth about the files
(every file listed with its origin and licence, both sha256s right), no secret is left in a trace's
metadata, and perfscope reads each xz file as it reads the same JSON gzipped."""

from __future__ import annotations

import gzip
import hashlib
import lzma
import re

from paths import TRACES
from perfscope.analysis.parallel import json_bytes
from perfscope.load import load_trace

ROW = re.compile(r"^\| `([^`]+)` \| (.+?) \| (.+?) \| `([0-9a-f]{64})` \| `([0-9a-f]{64})` \|$")
TOKEN = re.compile(rb"hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16}")


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
        data = (TRACES / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == file_sha, rel
        raw = lzma.decompress(data) if rel.endswith(".xz") else data
        assert hashlib.sha256(raw).hexdigest() == json_sha, rel
        assert ("MIT" in licence) == rel.startswith("public/") and origin.strip(), rel


def test_no_token_is_left_in_a_corpus_trace():
    for p in sorted(TRACES.rglob("*.json.xz")):
        hits = [h for h in TOKEN.findall(lzma.decompress(p.read_bytes())) if h.strip(b"X")[3:]]  # X's: redacted
        assert not hits, (p.name, hits[:2])


def test_an_xz_trace_reads_as_the_same_json_gzipped(tmp_path):
    src = TRACES / "h200-mla-fp8-kv" / "mla_pool_graph.json.xz"
    raw = lzma.decompress(src.read_bytes())
    gz = tmp_path / "same.json.gz"
    gz.write_bytes(gzip.compress(raw))
    a, b = load_trace(src), load_trace(gz)
    assert len(a.kernels) == len(b.kernels) > 100 and a.kernels == b.kernels and a.launches == b.launches
    assert json_bytes(src) == json_bytes(gz) == len(raw)  # the xz index gives the JSON size exactly
