"""benchmarks/diagnose_speed.py: the README's speed lines are its output, and the traces it builds are real work.

No timing is asserted here (the benchmark prints ratios; CI's speed gate in .ci/run checks them): these
tests hold the README block to the benchmark's own line formats, and check the CUDA-graph trace and
the rank files it makes from the real H200 traces."""

from __future__ import annotations

import importlib.util
import math

import orjson

from paths import H200, REPO, gz_bytes, topen

from perfscope.analysis.diagnose import diagnose
from perfscope.load import discover, load_trace
from perfscope.load.reader import read_bytes

_spec = importlib.util.spec_from_file_location("diagnose_speed", REPO / "benchmarks" / "diagnose_speed.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _block(text: str) -> list[str]:
    assert text.count(bench.BEGIN) == 1 and text.count(bench.END) == 1
    return text[text.index(bench.BEGIN) + len(bench.BEGIN):text.index(bench.END)].strip("\n").splitlines()


def test_readme_speed_lines_are_the_benchmarks_output_format():
    lines = _block((REPO / "README.md").read_text())
    assert lines[0].startswith("Speed (CPU time, `python benchmarks/diagnose_speed.py --readme` printed")
    kinds = []
    for ln in lines[1:]:
        hit = [(k, m) for k in bench.LINE_FORMATS if (m := bench.line_regex(k).match(ln))]
        assert len(hit) == 1, f"README speed line not in the benchmark's format: {ln!r}"
        kind, m = hit[0]
        kinds.append(kind)
        v = {k: (float(x) if k not in ("name", "peer", "kind") else x) for k, x in m.groupdict().items()}
        if kind in ("eager", "graph"):
            # the ratio is the two printed times' (each rounded to 0.01)
            assert math.isclose(v["ratio"], v["cpu"] / v["floor"], abs_tol=0.01 + 0.006 * v["ratio"] / v["floor"])
        if kind == "eager":
            assert v["name"] == "mla_pool_eager_x120steps.json.gz" and 160 <= v["mb"] <= 220
            assert v["ratio"] <= bench.GATE  # what CI's gate allows
        if kind == "ranks":
            ideal = math.ceil(v["n"] / v["cores"]) * v["one"]
            assert math.isclose(v["ratio"], v["wall"] / ideal, abs_tol=0.02)
    assert kinds[0] == "eager" and "graph" in kinds and "ranks" in kinds


def test_line_formats_read_back_what_they_print(tmp_path):
    vals = {"name": "x.json.gz", "mb": 210.4, "cpu": 3.214, "floor": 3.5, "ratio": 0.918, "reader": 0.7,
            "rss": 1.234, "peer": "HTA", "kind": "eager", "n": 8, "cores": 2, "wall": 20.0, "one": 5.0,
            "events": 145913, "us": 1.25}
    for kind, fmt in bench.LINE_FORMATS.items():
        line = fmt.format(**vals)
        m = bench.line_regex(kind).match(line)
        assert m, (kind, line)
        parsed = {k: (x if k in ("name", "peer", "kind") else int(x) if x.isdigit() else float(x))
                  for k, x in m.groupdict().items()}
        assert fmt.format(**parsed) == line
        assert all(math.isclose(parsed[k], vals[k], abs_tol=0.5) for k in parsed if not isinstance(parsed[k], str))
        assert all(bench.line_regex(o).match(line) is None for o in bench.LINE_FORMATS if o != kind)
    # --readme rewrites the block and nothing else
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{bench.BEGIN}\nold\n{bench.END}\nb\n")
    bench.rewrite_readme(bench.readme_text(["- new line"]), readme)
    text = readme.read_text()
    assert text.startswith(f"a\n{bench.BEGIN}\nSpeed (") and text.endswith(f"- new line\n{bench.END}\nb\n")


def test_graph_trace_repeats_real_graph_steps_as_events_of_their_own(tmp_path):
    src = H200 / "mla_pool_graph.json.xz"
    out = tmp_path / "graph.json.gz"
    one_mb = len(orjson.dumps(orjson.loads(read_bytes(src)))) / 1e6  # one copy, as the benchmark writes it
    bench.build_repeated_trace(src, 2.5 * one_mb, out)
    a, b = load_trace(src), load_trace(out)
    assert len(b.kernels) == 3 * len(a.kernels) and len(b.launches) == 3 * len(a.launches)
    # each copy's launches pair with its own kernels (correlation ids offset, not reused)
    assert len({k.corr for k in b.kernels}) == 3 * len({k.corr for k in a.kernels})
    ra, rb = diagnose([str(src)]), diagnose([str(out)])
    sa, sb = ra.to_dict()["steps"], rb.to_dict()["steps"]
    assert sb["count"] == 3 * sa["count"] and sb["graph_launches_per_step"] == sa["graph_launches_per_step"] >= 1
    assert math.isclose(sb["median_ms"], sa["median_ms"], rel_tol=1e-6)
    assert orjson.loads(topen(out).read())["deviceProperties"][0]["name"] == "NVIDIA H200"


def test_rank_files_are_distinct_ranks_of_the_same_events(tmp_path):
    src = tmp_path / "mla_pool_graph.json.gz"  # gzipped, as the benchmark's traces are
    src.write_bytes(gz_bytes(H200 / "mla_pool_graph.json.xz"))
    tmp_path = tmp_path / "ranks"
    tmp_path.mkdir()
    files = bench.rank_files(src, 3, tmp_path)
    ts = discover([str(tmp_path)])
    assert [f.rank for f in ts.files] == [0, 1, 2] and not ts.duplicates
    one = load_trace(src)
    for r, f in enumerate(files):
        t = load_trace(f)
        # its own rank, GPU and host process; the same events (times, names, correlation) otherwise
        assert t.meta.rank == r and t.meta.world_size == 3
        assert {k.device for k in t.kernels} == {r} and {l.pid for l in t.launches} == {p + r for p in {l.pid for l in one.launches}}
        assert [(k.name, k.ts, k.dur, k.corr) for k in t.kernels] == [(k.name, k.ts, k.dur, k.corr) for k in one.kernels]
        assert [(l.name, l.ts, l.corr) for l in t.launches] == [(l.name, l.ts, l.corr) for l in one.launches]
