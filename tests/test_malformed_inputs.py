"""Malformed inputs, each a real trace or run folder edited in the one way the case is about:
fields of the wrong type, deep nesting, huge numbers, multi-member gzip with junk after it, a FIFO
or ``-`` as the trace, a server's answer nested deep. The result is an analysis or one line and
exit 2, never a traceback. tests/test_hostile_files.py and tests/test_fuzz.py go further.
"""

from __future__ import annotations

import gzip
import json
import os

import pytest
from clirun import invoke, one_line, run
from paths import json_of
from profileserver import SMALL, SMALL_GZ

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


def _trace_obj():
    return json.loads(json_of(SMALL))


def _kernel_index(obj):
    return next(i for i, e in enumerate(obj["traceEvents"]) if e.get("cat") == "kernel")


MUTATIONS = {
    "args-string": lambda o, i: o["traceEvents"][i].__setitem__("args", "x"),
    "pid-list": lambda o, i: o["traceEvents"][i].__setitem__("pid", [1]),
    "tid-list": lambda o, i: o["traceEvents"][i].__setitem__("tid", [1]),
    "grid-nested": lambda o, i: o["traceEvents"][i]["args"].__setitem__("grid", [[1]]),
    "block-nested": lambda o, i: o["traceEvents"][i]["args"].__setitem__("block", [[1]]),
    "devprop-name-int": lambda o, i: o.__setitem__("deviceProperties", [{"name": 5}]),
    "devprop-name-list": lambda o, i: o.__setitem__("deviceProperties", [{"name": [1], "numSms": None}]),
    "devprop-numsms-str": lambda o, i: o.__setitem__("deviceProperties", [{"name": "NVIDIA H200", "numSms": "x", "totalGlobalMem": "lots"}]),
    "deep-nesting": lambda o, i: o["traceEvents"][i]["args"].__setitem__("deep", json.loads("[" * 900 + "]" * 900)),
    "stream-huge": lambda o, i: o["traceEvents"][i]["args"].__setitem__("stream", -1e308),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
@pytest.mark.parametrize("cmd", ["diagnose", "report"])
def test_malformed_traces_are_one_line_or_analysed(name, cmd, tmp_path):
    """Malformed traces crashed diagnose/report/compare (args not an object, pid/tid lists,
    grid/block nested, deviceProperties of the wrong type, 1000-deep nesting, stream -1e308 with
    --json): the reader coerces or drops such fields within int64/finite bounds, and
    RecursionError is an InputError. tests/test_fuzz.py keeps mutating real traces."""
    obj = _trace_obj()
    MUTATIONS[name](obj, _kernel_index(obj))
    p = tmp_path / "t.json"
    text = json.dumps(obj)
    if name == "deep-nesting":
        text = text.replace('"deep": []', '"deep": ' + "[" * 1200 + "]" * 1200)
    p.write_text(text)
    argv = ["diagnose", str(p), "--json"] if cmd == "diagnose" else ["report", str(p), "-o", str(tmp_path / "r.html")]
    rc, out, err = invoke(*argv)
    assert rc in (0, 2), err
    assert "Traceback" not in err and "internal error" not in err
    if rc == 2:
        one_line(err)


def _run_dir(tmp_path, mutate):
    from perfscope import rundir

    d = tmp_path / "run"
    (d / "traces").mkdir(parents=True)
    (d / "traces" / "x-TP-0.trace.json.gz").write_bytes(SMALL_GZ)
    rundir.write_run(d, files=[{"path": "traces/x-TP-0.trace.json.gz"}])
    data = json.loads((d / "run.json").read_text())
    text = mutate(data)
    (d / "run.json").write_text(text if isinstance(text, str) else json.dumps(data))
    return d


RUN_MUTATIONS = {
    "members-self": lambda d: d.__setitem__("members", [{"dir": "."}]),
    "members-int": lambda d: d.__setitem__("members", 5),
    "rank-mixed": lambda d: d["files"].append({**d["files"][0], "rank": "one"}),
    "host-int": lambda d: d["files"][0].__setitem__("host", 7),
    "tpot-text": lambda d: d.__setitem__("timings", {"tpot_ms": "slow"}),
    "deep": lambda d: json.dumps(d)[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}",
    "huge-int": lambda d: json.dumps(d)[:-1] + ', "x": ' + "7" * 5000 + "}",
}


@pytest.mark.parametrize("name", list(RUN_MUTATIONS))
def test_malformed_run_json_is_exit_2_one_line(name, tmp_path):
    """run.json with members/files/ranks/timings of the wrong type, 100000-deep nesting or a
    5000-digit int crashed: util/jsonio bounds depth, 64-bit ints, finiteness and the top type,
    and read_run checks the fields."""
    d = _run_dir(tmp_path, RUN_MUTATIONS[name])
    rc, _, err = invoke("diagnose", str(d))
    assert rc == 2, err
    assert "run.json" in one_line(err)


@pytest.mark.parametrize("text", ["[" * 50000 + "]" * 50000, '{"tp_size": 1e999}', "[1]"])
def test_malformed_config_is_exit_2_one_line(text, tmp_path):
    """--config / --model-config nested deep gave RecursionError: read through util/jsonio, one
    line, exit 2."""
    cfg = tmp_path / "c.json"
    cfg.write_text(text)
    rc, _, err = invoke("diagnose", str(SMALL), "--config", str(cfg))
    assert rc == 2 and str(cfg) in one_line(err)


def test_server_info_nested_deep_or_huge_is_one_line(profile_server, tmp_path):
    """/server_info nested deep (RecursionError) or tp_size 1e999 (OverflowError in
    expected_files): one line, and expected_files takes only sane sizes."""
    from perfscope.errors import RemoteError
    from perfscope.remote.sglang_api import SGLangClient

    H, port = profile_server

    class Deep(H):
        def do_GET(self):
            return self._send(200, b'{"tp_size": ' + b"[" * 100000 + b"]" * 100000 + b"}")
    H.do_GET = Deep.do_GET
    with pytest.raises(RemoteError) as ei:
        SGLangClient(f"http://127.0.0.1:{port}").server_info()
    assert "\n" not in str(ei.value)
    from perfscope.capture.wait import expected_files
    assert expected_files({"tp_size": 1e999}, False) == 1


def test_multi_member_gzip_is_read_whole_and_junk_refused(tmp_path):
    """A multi-member gzip (RFC 1952, zcat reads it) was refused as truncated and junk after the
    first member ignored: members are read whole, non-zero junk after them is exit 2."""
    from perfscope.load.reader import read_bytes

    raw = json_of(SMALL)
    cut = len(raw) // 2
    p = tmp_path / "multi.json.gz"
    p.write_bytes(gzip.compress(raw[:cut]) + gzip.compress(raw[cut:]))
    assert bytes(read_bytes(p)) == raw
    q = tmp_path / "junk.json.gz"
    q.write_bytes(gzip.compress(raw) + b"garbage!")
    rc, _, err = invoke("diagnose", str(q))
    assert rc == 2 and "junk after the gzip stream" in one_line(err)


def test_fifo_and_dash_are_refused_in_one_line(tmp_path):
    """`diagnose fifo.json` blocked for ever: FIFOs and devices are refused in one line (opened
    non-blocking, fstat'ed); `-` is refused, not read as stdin (not promised; /dev/stdin is a
    character device and refused too)."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    r = invoke("diagnose", fifo)
    assert r.returncode == 2 and "not a regular file" in one_line(r.stderr)
    with open(SMALL, "rb") as f:
        r = run("diagnose", "-", "--json", stdin=f, timeout=120)
    assert r.returncode == 2 and "stdin" in one_line(r.stderr)
