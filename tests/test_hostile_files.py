"""Traces and fix inputs that real tools write, or that a careless or hostile user passes, each run
through the real CLI (in-process or in a subprocess) on a real trace from tests/traces/corpus edited
in the one way the case is about: the result is an analysis (with a note where something was left
out or repaired) or one line with a documented exit code, never exit 70.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import subprocess
import sys

import pytest

from clirun import invoke, one_line
from paths import REPO, TRACELENS, json_of

SMALL = TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.xz"


@pytest.fixture(scope="module")
def trace_obj():
    return json.loads(json_of(SMALL))


def _kernels(obj):
    """The events the reader keeps as GPU work (kernels, copies, sets)."""
    from perfscope.load.reader import _GPU_CATS

    return [e for e in obj["traceEvents"] if e.get("ph") == "X" and e.get("cat") in _GPU_CATS]


def _shaped_ops(obj):
    return [e for e in obj["traceEvents"] if e.get("cat") == "cpu_op" and "Input Dims" in (e.get("args") or {})]


@pytest.mark.parametrize("field,value", [("Input type", 5), ("Input Dims", 7), ("Input Dims", [[1 << 70, 3]]),
                                         ("Concrete Inputs", [1 << 70, {"x": 1}, [1]]), ("Input type", [1, None])])
def test_cpu_op_shapes_of_any_type_are_typed_at_the_reader_in_every_output_mode(trace_obj, tmp_path,
                                                                                  field, value):
    """A number where a list belongs, or an integer over 64 bits, in a cpu_op's shapes gave exit 70
    in the roofline and in the JSON and HTML writers; the reader's typed view (load/shapes.py) makes
    them None, or a big integer its decimal string."""
    obj = copy.deepcopy(trace_obj)
    ops = _shaped_ops(obj)
    assert ops
    for e in ops:
        e["args"][field] = value
    p = tmp_path / "t.json"
    p.write_text(json.dumps(obj))
    for extra in ([], ["--json"], ["--html", tmp_path / "r.html"], ["--markdown", tmp_path / "r.md"]):
        rc, out, err = invoke("diagnose", p, *extra)
        assert rc == 0, err
        if extra == ["--json"]:
            json.loads(out)
    from perfscope.load import shapes
    from perfscope.load.reader import load_trace

    t = load_trace(p)
    op = next(o for o in t.cpu_ops if o.input_dims)
    assert shapes.input_types(op.input_type) is None or all(x is None or isinstance(x, str)
                                                           for x in shapes.input_types(op.input_type))
    dims = shapes.input_dims(op.input_dims)
    assert dims is None or all(d is None or isinstance(d, list) for d in dims)
    if field == "Concrete Inputs":
        assert shapes.concrete_inputs(op.concrete) == [str(1 << 70), None, None]


def test_negative_duration_kernels_are_said_not_silently_dropped(trace_obj, tmp_path):
    obj = copy.deepcopy(trace_obj)
    k = _kernels(obj)
    k[3]["dur"], k[4]["dur"] = -2, -0.5
    p = tmp_path / "neg.json"
    p.write_text(json.dumps(obj))
    from perfscope.load.reader import load_trace

    t = load_trace(p)
    assert (t.meta.negative_durations, t.meta.negative_kernels) == (2, 2)
    assert len(t.kernels) == len(k) - 2
    rc, out, err = invoke("diagnose", p, "--json")
    assert rc == 0
    notes = " ".join(json.dumps(json.loads(out)).split())
    assert "2 event(s) with a negative duration, 2 of them GPU kernels" in notes


@pytest.mark.parametrize("closed", [True, False])
def test_json_array_format_trace_is_read_as_its_object_form(trace_obj, tmp_path, closed):
    """The Trace Event Format's JSON Array Format (a bare list; the closing ] optional), which
    chrome://tracing and Perfetto read, was refused as "not valid JSON"."""
    from perfscope.load.reader import load_trace

    text = json.dumps(trace_obj["traceEvents"], indent=0)
    if not closed:
        text = text.rstrip().rstrip("]").rstrip() + ",\n"
    p = tmp_path / "array.json"
    p.write_text(text)
    (tmp_path / "obj.json").write_text(json.dumps({"traceEvents": trace_obj["traceEvents"]}))
    a, o = load_trace(p), load_trace(tmp_path / "obj.json")
    assert len(a.kernels) == len(o.kernels) > 0 and len(a.cpu_ops) == len(o.cpu_ops)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be"])
def test_bom_and_utf16_traces_are_read(trace_obj, tmp_path, encoding):
    """A BOM or a UTF-16 file gave "invalid character (byte 0)"."""
    from perfscope.load.reader import load_trace

    text = json.dumps(trace_obj)
    p = tmp_path / "enc.json"
    p.write_bytes(text.encode(encoding))
    t = load_trace(p)
    assert len(t.kernels) == len(_kernels(trace_obj)) and t.meta.encoding == encoding


def test_one_lone_surrogate_does_not_reject_the_file(trace_obj, tmp_path):
    obj = copy.deepcopy(trace_obj)
    k = _kernels(obj)
    k[0]["name"] += "\ud800"  # json.dumps writes it as the escape \ud800, alone
    text = json.dumps(obj)
    assert text.count("\\ud800") == 1
    p = tmp_path / "sur.json"
    p.write_text(text)
    from perfscope.load.reader import load_trace

    t = load_trace(p)
    assert len(t.kernels) == len(k) and t.meta.lone_surrogates == 1
    assert any(x.name.endswith("\ufffd") for x in t.kernels)
    rc, out, err = invoke("diagnose", p)
    assert rc == 0 and "surrogate" in out


@pytest.mark.slow  # inflates to the bound (~6 s)
def test_gzip_bomb_is_refused_at_the_inflated_bound(tmp_path):
    """A small gzip that inflates to 5 GB (80 members of 64 MB of zeros, 5 MB on disk) inflated
    without bound (exit 70, MemoryError). Under a 0.5 GB bound it is refused after at most the
    bound, naming it and the variable that raises it; the process is capped at 3 GB of address
    space so that an unbounded reader fails here instead of taking the machine's memory."""
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(member * 80)
    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from perfscope.cli import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", code, "diagnose", str(p)], capture_output=True, text=True, timeout=300,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "PERFSCOPE_MAX_TRACE_GB": "0.5"})
    line = one_line(r.stderr)
    assert r.returncode == 2 and "larger than 512 MB" in line and "PERFSCOPE_MAX_TRACE_GB" in line, r.stderr


def test_real_trace_past_a_lowered_bound_is_refused_and_within_it_read(tmp_path, monkeypatch):
    size = len(json_of(SMALL))
    monkeypatch.setenv("PERFSCOPE_MAX_TRACE_GB", str((size - 1) / (1 << 30)))
    rc, _, err = invoke("diagnose", SMALL)
    assert rc == 2 and "PERFSCOPE_MAX_TRACE_GB" in one_line(err)
    monkeypatch.setenv("PERFSCOPE_MAX_TRACE_GB", str((size + 1) / (1 << 30)))
    rc, _, err = invoke("diagnose", SMALL)
    assert rc == 0, err


def test_events_past_the_event_bound_are_refused(tmp_path, monkeypatch, trace_obj):
    monkeypatch.setenv("PERFSCOPE_MAX_EVENTS", "100")
    rc, _, err = invoke("diagnose", SMALL)
    line = one_line(err)
    assert rc == 2 and f"{len(trace_obj['traceEvents']):,} events" in line and "PERFSCOPE_MAX_EVENTS" in line
    monkeypatch.setenv("PERFSCOPE_MAX_EVENTS", "lots")
    rc, _, err = invoke("diagnose", SMALL)
    assert rc == 2 and "PERFSCOPE_MAX_EVENTS='lots'" in one_line(err)


def test_name_repair_edits_the_buffer_in_place():
    """repair_names copied the whole buffer again (exit 70 from a MemoryError on large traces): a
    bytearray is now repaired in place and returned, the same object."""
    from perfscope.load.reader import parse, repair_names

    raw = json.dumps(json.loads(json_of(SMALL)), indent=1)  # one field a line, as Kineto writes
    i = raw.index('"name": "', raw.index('"traceEvents"')) + len('"name": "')
    bad = bytearray((raw[:i] + 'x.py(1): "quoted"' + raw[i:]).encode())
    out, n = repair_names(bad)
    assert out is bad and n == 1
    t = parse(bytearray((raw[:i] + 'x.py(1): "quoted"' + raw[i:]).encode()), "<t>")
    assert t.meta.repaired_names == 1


def test_splice_moves_large_tails_exactly():
    from perfscope.load import repair

    data = bytes(range(256)) * (1 << 16)  # 16 MB: several move chunks
    buf = bytearray(data)
    edits = [(10, 12, b"abcd"), (5 << 20, 5 << 20, b"XYZ"), (len(data) - 1, len(data), b"--")]
    repair.splice(buf, edits)
    want = data[:10] + b"abcd" + data[12:5 << 20] + b"XYZ" + data[5 << 20:len(data) - 1] + b"--"
    assert bytes(buf) == want


# ------------------------------------------------------------------------------------ fix inputs

@pytest.mark.parametrize("kind", ["fifo", "zero", "big"])
@pytest.mark.parametrize("opt", ["--launch-file", "--target-file"])
def test_fix_files_are_regular_and_bounded(tmp_path, kind, opt):
    """``fix --launch-file`` / ``--target-file`` on a FIFO hung, on /dev/zero read without a bound
    (exit 70): the regular-file rule and a size bound, as diagnose has."""
    if kind == "fifo":
        f = tmp_path / "launch.sh"
        os.mkfifo(f)
    elif kind == "zero":
        f = "/dev/zero"
    else:
        f = tmp_path / "launch.sh"
        f.write_text("#!/bin/sh\nexec python3 -m sglang.launch_server --tp 1\n" + "#" * (2 << 20) + "\n")
    fix = "overlap-off" if opt == "--launch-file" else "fp8-kv-cast"
    r = invoke("fix", fix, opt, f, "--state-dir", tmp_path / "st", "--port", "0", cwd=REPO,
               env={**os.environ, "PERFSCOPE_MAX_FIX_FILE_MB": "1"})
    line = one_line(r.stderr)
    assert r.returncode == 2, r.stderr
    if kind == "big":
        assert "larger than 1 MB" in line and "PERFSCOPE_MAX_FIX_FILE_MB" in line
    else:
        assert "not a regular file" in line


@pytest.mark.parametrize("line,refused", [
    ("A=--disable-overlap-schedule\nexec python3 -m sglang.launch_server --model-path m --tp 1 $A\n", True),
    ("exec python3 -m sglang.launch_server --model-path m ${EXTRA}\n", True),
    ('exec python3 -m sglang.launch_server --model-path m "$@"\n', True),
    ("exec python3 -m sglang.launch_server --model-path $MODEL --tp 1 --disable-overlap-schedule\n", False),
    ("exec python3 -m sglang.launch_server --model-path=$MODEL --disable-overlap-schedule\n", False),
    ('exec python3 -m sglang.launch_server --model-path "$MODEL" --disable-overlap-schedule\n', False),
])
def test_launch_words_the_shell_expands_into_flags_are_refused(tmp_path, line, refused):
    """A flag passed through an unquoted variable was reported "already-applied" (exit 0): perfscope
    cannot see what the shell will expand, so such a word is refused, exit 4, unless it is a flag's value."""
    p = tmp_path / "launch.sh"
    p.write_text("#!/bin/sh\n" + line)
    before = p.read_bytes()
    r = invoke("fix", "overlap-off", "--launch-file", p, "--state-dir", tmp_path / "st", "--port", "0", "--apply")
    if refused:
        assert r.returncode == 4 and "the shell expands it" in one_line(r.stderr), r.stdout + r.stderr
        assert p.read_bytes() == before
    else:
        assert r.returncode == 0 and b"--disable-overlap-schedule" not in p.read_bytes(), r.stdout + r.stderr


def test_revert_under_another_fix_names_that_fix(tmp_path):
    """Two fixes applied to one launch file; reverting the first blamed "sglang reinstalled or
    edited?" although the second fix's manifest, in the same state folder, explains the file: it
    names the fix to revert first (exit 4, nothing written); in that order both revert byte for byte."""
    p = tmp_path / "launch.sh"
    p.write_text("#!/bin/sh\nexec python3 -m sglang.launch_server --model-path m --tp 1 --disable-overlap-schedule "
                 "--disable-cuda-graph\n")
    original = p.read_bytes()
    st = ["--launch-file", p, "--state-dir", tmp_path / "st", "--port", "0"]
    assert invoke("fix", "overlap-off", *st, "--apply").returncode == 0
    assert invoke("fix", "eager-decode", *st, "--apply").returncode == 0
    both = p.read_bytes()
    r = invoke("fix", "overlap-off", *st, "--revert")
    line = one_line(r.stderr)
    assert r.returncode == 4 and "patched again by perfscope fix eager-decode" in line and "reinstalled" not in line
    assert p.read_bytes() == both
    assert invoke("fix", "eager-decode", *st, "--revert").returncode == 0
    assert invoke("fix", "overlap-off", *st, "--revert").returncode == 0
    assert p.read_bytes() == original
