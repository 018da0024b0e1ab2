"""How many rank files diagnose parses at once (perfscope/analysis/parallel.py), on the real
traces' sizes: one process per file and CPU, fewer when their parse would not fit in memory."""

from __future__ import annotations

import gzip
import json
import shutil

from paths import H200, gz_bytes
from perfscope.analysis.diagnose import diagnose
from perfscope.analysis.parallel import PEAK_PER_JSON_BYTE, available_memory, json_bytes, plan_workers

def test_json_bytes_is_the_uncompressed_size(big_eager_trace):
    import lzma

    for f in (H200 / "mla_pool_graph.json.xz", big_eager_trace):
        with (lzma.open if f.name.endswith(".xz") else gzip.open)(f, "rb") as g:
            n = 0
            while b := g.read(1 << 24):
                n += len(b)
        assert json_bytes(f) == n, f.name


def test_plan_is_bounded_by_files_cpus_and_memory(big_eager_trace):
    big = json_bytes(big_eager_trace)
    sizes = [big] * 8  # a TP8 profile of 171 MB ranks
    assert plan_workers(sizes, 16, None) == (8, "files")
    assert plan_workers(sizes, 2, 64 << 30) == (2, "cpus")
    assert plan_workers(sizes, 16, 64 << 30) == (8, "files")
    # 1.5 GiB available: 0.8 of it holds two parses of ~550 MB each, not three
    avail = 3 << 29
    assert 2 * big * PEAK_PER_JSON_BYTE <= 0.8 * avail < 3 * big * PEAK_PER_JSON_BYTE
    assert plan_workers(sizes, 16, avail) == (2, "memory")
    # not even one fits: still one at a time (in this process), never zero
    assert plan_workers(sizes, 16, 100 << 20) == (1, "memory")
    assert plan_workers([big], 16, 100 << 20) == (1, "files")
    # mixed sizes: the largest files set the bound, as they may be parsed together
    assert plan_workers([1000, big, 1000, big], 4, avail) == (4, "files")  # two large + two small fit
    assert plan_workers([big, 1000, big, big], 4, avail) == (2, "memory")


def test_diagnose_reports_its_plan(tmp_path):
    prof = tmp_path / "profile"
    prof.mkdir()
    (prof / "1790000000.1-TP-0.trace.json.gz").write_bytes(gz_bytes(H200 / "mla_pool_graph.json.xz"))
    (prof / "1790000000.1-TP-1.trace.json.gz").write_bytes(gz_bytes(H200 / "mla_fp8_graph.json.xz"))
    d = diagnose([prof]).to_dict()
    par = d["parallel"]
    assert par["files"] == 2 and 1 <= par["workers"] <= 2 and par["bound"] in ("files", "cpus", "memory")
    assert available_memory() is None or par["bound"] != "memory"  # two small traces fit anywhere
    assert json.loads(json.dumps(d))["parallel"] == par
    assert diagnose([prof], workers=1).parallel == {"files": 2, "workers": 1, "bound": "option"}
