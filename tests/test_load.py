"""Trace loading edge cases on real traces: torch's unescaped names, broken JSON, string metadata."""

from __future__ import annotations

import gzip

import pytest

from clirun import invoke
from paths import H200, TRACELENS, topen
from perfscope.errors import InputError
from perfscope.load.reader import load_trace, parse


def _real_json() -> bytes:
    return topen(H200 / "mla_pool_graph.json.xz").read()


def test_unescaped_quotes_in_a_name_are_repaired():
    """torch's profiler wrote `"name": "torch/profiler/_cupti_monitor.py(0): "finish_reason"",` into
    a trace of the reproduction server (seen here under load); Kineto does not escape names. The
    broken line is made here by editing one python_function name of a real trace."""
    raw = _real_json()
    marker = b'"name": "mla_cast_repro.py('
    i = raw.index(marker)
    j = raw.index(b'",', i)
    broken = raw[:j] + b' "finish_reason"' + raw[j:]
    with pytest.raises(Exception):
        __import__("json").loads(broken)  # really broken JSON
    t = parse(broken, "edited.json")
    assert t.meta.repaired_names == 1
    assert any(f.name.endswith('"finish_reason"') for f in t.frames)
    assert len(t.kernels) == len(parse(raw, "orig.json").kernels)


def test_repaired_trace_is_diagnosed_with_a_note(tmp_path):
    raw = _real_json()
    i = raw.index(b'"name": "mla_cast_repro.py(')
    j = raw.index(b'",', i)
    p = tmp_path / "broken.json.gz"
    p.write_bytes(gzip.compress(raw[:j] + b' "x"' + raw[j:]))
    r = invoke("diagnose", p, "--json")
    assert r.returncode == 0, r.stderr
    d = __import__("json").loads(r.stdout)
    assert any("unescaped quotes" in n for n in d["notes"])
    assert d["findings"][0]["id"] == "fp8-kv-cast"


def test_json_broken_elsewhere_is_still_refused(tmp_path):
    raw = _real_json()
    k = raw.index(b'"ph": "X"')
    p = tmp_path / "bad.json"
    p.write_bytes(raw[:k] + b'"ph" "X"' + raw[k + 9:])
    with pytest.raises(InputError, match="not valid JSON"):
        load_trace(p)


def test_string_metadata_is_read():
    """TraceLens's traces store deviceProperties/distributedInfo as Python reprs (strings)."""
    t = load_trace(TRACELENS / "b200" / "eager_trace.json.xz")
    assert t.meta.device_name == "NVIDIA B200" and t.meta.compute_capability == "10.0"
    assert t.meta.rank == 0 and t.meta.world_size == 8


def test_repair_in_one_field_per_line_layout():
    """torch 2.13 writes one field per line; these lines are copied from the reproduction server's
    broken trace (the rest of that file was ordinary)."""
    text = b"""{"traceEvents": [
  {
    "ph": "X",
    "cat": "python_function",
    "name": "torch/profiler/_cupti_monitor.py(0): "finish_reason"",
    "pid": 14547,
    "tid": 14550,
    "ts": 5089951209973.664,
    "dur": 126.138
    ,
    "args": {
      "Python parent id": 427, "Python id": 428, "Ev Idx": 1499
    }
  },
  {
    "ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 14547, "tid": 14550,
    "ts": 5089951209980.0, "dur": 5.0
  }
]}"""
    t = parse(text, "repro.json")
    assert t.meta.repaired_names == 1
    assert [f.name for f in t.frames] == ['torch/profiler/_cupti_monitor.py(0): "finish_reason"']
    assert [o.name for o in t.cpu_ops] == ["aten::copy_"]


def test_a_folder_with_a_json_array_beside_the_trace_skips_it_with_a_note(tmp_path):
    """TraceLens writes execution_details.json (a JSON array) into the capture folder: diagnose
    FOLDER analyses the trace and says it skipped the array (not "not valid JSON", exit 2); a
    folder with nothing but the array is one line, exit 2, naming the file it skipped."""
    import shutil

    from perfscope.load.discover import discover

    shutil.copy(TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.xz", tmp_path)
    (tmp_path / "execution_details.json").write_text('\n  [{"name": "aten::mm", "count": 3}, [1, 2]]\n')
    ts = discover([tmp_path])
    assert [f.path.name for f in ts.files] == ["sglang_Qwen3-8B_decode.json.xz"]
    assert [s["why"] for s in ts.skipped] == ["not a profiler trace (not a JSON object)"]
    r = invoke("diagnose", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped 1 JSON file that is not a profiler trace: execution_details.json" in r.stdout
    only = tmp_path / "only"
    only.mkdir()
    (only / "execution_details.json").write_text("[]")
    r = invoke("diagnose", only)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no trace files" in r.stderr and "execution_details.json" in r.stderr and "Traceback" not in r.stderr


def test_tracelens_capture_folder_with_its_execution_details_is_read_as_shipped(tmp_path, chromium):
    """TraceLens' vLLM profile folder as it ships it (tests/traces/corpus: the trace, and in its
    capture_traces/ the graph-capture trace beside the execution_details.json TraceLens writes, a
    JSON array of {file, batch_size, mode}). `diagnose FOLDER` stopped, exit 2: "execution_details.json:
    not a Kineto trace (Expected `object`, got `array`)", as the capture map read every JSON file of
    capture_traces/. Now: analysed, the capture trace attributes the replay, the array is skipped with
    a note, at 80 and 200 columns, piped; `--capture-trace` on the capture folder alone likewise."""
    import json
    import os

    folder = TRACELENS / "inference" / "vllm_decode_full"
    details = folder / "capture_traces" / "execution_details.json"
    rows = json.loads(details.read_text())
    assert isinstance(rows, list) and rows[0]["mode"] == "FULL"
    assert (folder / "capture_traces" / rows[0]["file"].replace(".json.gz", ".json.xz")).is_file()
    note = "note: skipped 1 JSON file that is not a profiler trace: execution_details.json"
    for cols in (80, 200):
        r = invoke("diagnose", folder, env={**os.environ, "COLUMNS": str(cols)})
        assert r.returncode == 0, r.stderr
        assert note in r.stdout.splitlines(), r.stdout
        assert "capture_32_FULL" in r.stdout and r.stderr == ""
    r = invoke("diagnose", folder / "graph_execution.json.xz", "--capture-trace", folder / "capture_traces", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert any("421 of 421 kernels" in n and "capture_32_FULL" in n for n in d["notes"]), d["notes"]
    # the Markdown summary and the HTML page (drawn in Chromium) carry the same note
    from browser import load_page

    r = invoke("diagnose", folder, "--markdown", tmp_path / "s.md", "--html", tmp_path / "d.html")
    assert r.returncode == 0, r.stderr
    said = "kipped 1 JSON file that is not a profiler trace: execution_details.json"
    assert said in (tmp_path / "s.md").read_text().replace("\\", "")
    res = load_page(chromium, tmp_path / "d.html", select=("#notes",))
    assert res.console_errors == [] and said in (res.texts["#notes"] or ""), res.texts
