"""Structure-aware fuzzing (hypothesis) of everything perfscope reads: real small traces from
tests/traces/corpus mutated in structure, field types (cpu_op shapes, >64-bit integers, negative
durations), bytes, container format (JSON Array Format) and text encoding (BOM, UTF-16, lone
surrogates), run through the loader *and* the analysis in-process; run.json files; fix manifests.
The only exception allowed out is the documented input error
(:class:`perfscope.errors.PerfscopeError`, exit 2/4): anything else is a bug the CLI would report
as exit 70.

Each property runs twice: with the fixed seed (the same cases every run: a regression stays
caught) and with a rotating seed (the day's number, or ``PERFSCOPE_FUZZ_SEED``; a failure names
it, and setting it replays that run). CI runs 3,300 cases in all, a couple of minutes on 2 cores;
``PERFSCOPE_FUZZ_EXAMPLES`` scales the counts.

Found and fixed by these properties and the red-team rounds (each a test of its own too):
``args`` that is no object, ``pid``/``tid`` lists, ``grid``/``block`` nested, device properties of
the wrong type, 1000-deep nesting, ``stream: -1e308`` in the JSON writer (round 1); ``Input type`` /
``Input Dims`` numbers and >64-bit integers in cpu_op shapes (round 2).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from paths import H200, TRACELENS, json_of
from perfscope.errors import PerfscopeError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # hypothesis over real traces: 5-50 s a test

SCALE = float(os.environ.get("PERFSCOPE_FUZZ_EXAMPLES", "1"))
# real traces, small enough that one example (mutate, serialise, parse, analyse) takes milliseconds
SEEDS = [
    TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.xz",
    H200 / "mla_fp8_graph.json.xz",
    TRACELENS / "inference" / "vllm_decode_full" / "graph_execution.json.xz",
]


ROTATING_SEED = int(os.environ.get("PERFSCOPE_FUZZ_SEED") or int(time.time() // 86400))
MODES = ["fixed", "rotating"]
SHARE = {"fixed": 0.65, "rotating": 0.35}  # of each property's cases


def _n(base: int, mode: str = "fixed") -> int:
    return max(10, int(base * SCALE * SHARE[mode]))


def _cfg(n, mode: str = "fixed"):
    """settings for ``n`` cases in all (split between the two modes) and the mode's seed."""
    s = settings(max_examples=_n(n, mode), deadline=None, derandomize=mode == "fixed", database=None,
                 suppress_health_check=list(HealthCheck))
    if mode == "fixed":
        return s

    def both(f):
        return seed(ROTATING_SEED)(s(f))
    return both


def _run(mode: str, prop, n: int) -> None:
    """Run a property (its cases counted: at least its share of ``n`` must run); a failure under
    the rotating seed names the seed that replays it."""
    calls = [0]
    inner = prop.hypothesis.inner_test

    def counted(*a, **kw):
        calls[0] += 1
        return inner(*a, **kw)
    prop.hypothesis.inner_test = counted
    try:
        prop()
        assert calls[0] >= _n(n, mode), (calls[0], _n(n, mode))
    except Exception as e:
        if mode == "rotating":
            raise AssertionError(f"fuzz failure under the rotating seed: PERFSCOPE_FUZZ_SEED={ROTATING_SEED} "
                                 f"replays it ({type(e).__name__}: {e})") from e
        raise


@pytest.fixture(scope="module")
def seeds():
    out = []
    for p in SEEDS:
        assert p.is_file(), f"{p} missing: the shared traces are needed (tests/traces/corpus)"
        obj = json.loads(json_of(p))
        evs = obj["traceEvents"]
        # keep a few hundred events: the mutations, not the size, are what is tested
        kern = [e for e in evs if e.get("cat") in ("kernel", "cuda_runtime", "cuda_driver", "gpu_user_annotation",
                                                 "user_annotation", "cpu_op", "python_function")]
        obj = {**obj, "traceEvents": kern[:400] + [e for e in evs if e.get("ph") == "M"][:20]}
        out.append(obj)
    return out


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=6,
)
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s"]
ARG_FIELDS = ["correlation", "External id", "stream", "device", "grid", "block", "Python id",
              "Python parent id", "Input Dims", "Input type", "Concrete Inputs"]
TOP_FIELDS = ["deviceProperties", "distributedInfo", "traceEvents", "with_stack", "record_shapes", "traceName"]


def _mutate(obj: dict, ops) -> dict:
    obj = dict(obj)
    evs = list(obj["traceEvents"])
    for kind, i, key, value in ops:
        if kind == "top":
            obj[TOP_FIELDS[key % len(TOP_FIELDS)]] = value
            continue
        if kind == "devprop":
            props = copy.deepcopy(obj.get("deviceProperties")) or [{}]
            if isinstance(props, list) and props and isinstance(props[0], dict):
                props[0][["name", "numSms", "totalGlobalMem", "computeMajor", "computeMinor"][key % 5]] = value
            obj["deviceProperties"] = props
            continue
        if not evs:
            continue
        j = i % len(evs)
        ev = evs[j]
        if kind == "drop":
            del evs[j]
        elif kind == "dup":
            evs.insert(j, ev)
        elif kind == "replace":
            evs[j] = value
        elif isinstance(ev, dict):
            ev = dict(ev)
            if kind == "field":
                ev[FIELDS[key % len(FIELDS)]] = value
            elif kind == "delfield":
                ev.pop(FIELDS[key % len(FIELDS)], None)
            elif kind == "arg":
                a = dict(ev["args"]) if isinstance(ev.get("args"), dict) else {}
                a[ARG_FIELDS[key % len(ARG_FIELDS)]] = value
                ev["args"] = a
            evs[j] = ev
    obj["traceEvents"] = evs
    return obj


OPS = st.lists(st.tuples(st.sampled_from(["field", "field", "arg", "arg", "delfield", "drop", "dup", "replace",
                                          "top", "devprop"]),
                         st.integers(0, 10_000), st.integers(0, 100), JSON), min_size=1, max_size=6)


def _load_and_analyse(buf: bytes) -> None:
    from perfscope.analysis.analyze import analyze_trace
    from perfscope.load.reader import parse
    from perfscope.report.jsonout import dumps

    from perfscope.analysis.roofline import op_work
    from perfscope.load import shapes

    try:
        trace = parse(buf, "<fuzz>")
        for op in trace.cpu_ops[:60]:  # every op's shapes through the typed view, the roofline and the writer
            d = {"op_chain": [op.name], "input_types": shapes.input_types(op.input_type),
                 "input_dims": shapes.input_dims(op.input_dims), "concrete_inputs": shapes.concrete_inputs(op.concrete)}
            dumps([d, op_work(d)])
        ra = analyze_trace(trace, {})
        dumps(ra.to_dict())
    except PerfscopeError:
        pass  # a documented input error: one line, exit 2


@pytest.mark.parametrize("mode", MODES)
def test_fuzz_trace_structure_and_types(seeds, mode):
    @_cfg(1500, mode)
    @given(which=st.integers(0, len(SEEDS) - 1), ops=OPS)
    def prop(which, ops):
        _load_and_analyse(json.dumps(_mutate(seeds[which], ops)).encode())
    _run(mode, prop, 1500)


def _encode(obj: dict, form: str, encoding: str, lone: int) -> bytes:
    """The trace in another container form and text encoding, as other tools write it."""
    if form == "array":
        text = json.dumps(obj["traceEvents"], indent=0)
    elif form == "array-open":  # the JSON Array Format's closing bracket is optional
        text = json.dumps(obj["traceEvents"], indent=0).rstrip().rstrip("]")
    else:
        text = json.dumps(obj)
    if lone:  # lone surrogate escapes in names, somewhere in the file
        k = text.find('"name": "', lone % max(len(text), 1))
        if k >= 0:
            text = text[:k + 9] + "\\ud83d" + text[k + 9:]
    return text.encode(encoding, "surrogatepass")


@pytest.mark.parametrize("mode", MODES)
def test_fuzz_trace_forms_encodings_and_durations(seeds, mode):
    @_cfg(300, mode)
    @given(which=st.integers(0, len(SEEDS) - 1), ops=OPS,
           form=st.sampled_from(["object", "array", "array-open"]),
           encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be"]),
           lone=st.integers(0, 1 << 16), durs=st.lists(st.tuples(st.integers(0, 10_000),
                                                                 st.floats(-1e16, -1e-9)), max_size=3))
    def prop(which, ops, form, encoding, lone, durs):
        obj = _mutate(seeds[which], ops)
        evs = obj["traceEvents"]
        for i, d in durs:
            if evs and isinstance(evs[i % len(evs)], dict):
                evs[i % len(evs)] = {**evs[i % len(evs)], "dur": d}
        _load_and_analyse(_encode(obj, form, encoding, lone))
    _run(mode, prop, 300)


@pytest.mark.parametrize("mode", MODES)
def test_fuzz_trace_bytes(seeds, mode):
    @_cfg(700, mode)
    @given(which=st.integers(0, len(SEEDS) - 1),
           edits=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["flip", "cut", "insert", "delete"]),
                                    st.binary(min_size=1, max_size=4)), min_size=1, max_size=4),
           gz=st.booleans())
    def prop(which, edits, gz):
        _mutate_bytes(seeds, which, edits, gz)
    _run(mode, prop, 700)


def _mutate_bytes(seeds, which, edits, gz):
    buf = bytearray(json.dumps(seeds[which]).encode())
    if gz:
        buf = bytearray(gzip.compress(bytes(buf), compresslevel=1))
    for where, op, data in edits:
        k = int(where * max(len(buf) - 1, 0))
        if op == "flip" and buf:
            buf[k] ^= data[0] or 1
        elif op == "cut":
            del buf[k:]
        elif op == "insert":
            buf[k:k] = data
        elif op == "delete":
            del buf[k:k + len(data)]
    from perfscope.load.reader import _gunzip

    if buf[:2] == b"\x1f\x8b":
        try:
            buf = _gunzip(bytes(buf), Path("<fuzz>"), None)
        except PerfscopeError:
            return
    _load_and_analyse(bytes(buf))


RUN_KEYS = ["schema_version", "files", "members", "timings", "server_info", "versions", "gpu", "workload",
            "command", "status", "kind", "host"]


@pytest.mark.parametrize("mode", MODES)
def test_fuzz_run_json(tmp_path_factory, mode):
    @_cfg(500, mode)
    @given(edits=st.lists(st.tuples(st.sampled_from(RUN_KEYS), JSON), max_size=5),
           file_edits=st.lists(st.tuples(st.sampled_from(["path", "rank", "host", "stage", "bytes", "sha256",
                                                          "parallel"]), JSON), max_size=4),
           deep=st.integers(0, 3))
    def prop(edits, file_edits, deep):
        _run_json_case(tmp_path_factory, edits, file_edits, deep)
    _run(mode, prop, 500)


def _run_json_case(tmp_path_factory, edits, file_edits, deep):
    from perfscope import rundir
    from perfscope.load import discover

    d = tmp_path_factory.mktemp("run")
    (d / "traces").mkdir()
    src = SEEDS[0]
    (d / "traces" / "x-TP-0.trace.json.gz").write_bytes(src.read_bytes())
    rundir.write_run(d, files=[{"path": "traces/x-TP-0.trace.json.gz"}], timings={"tpot_ms": 5.0})
    data = json.loads((d / "run.json").read_text())
    for k, v in edits:
        data[k] = v
    if data.get("files") and isinstance(data["files"], list) and isinstance(data["files"][0], dict):
        for k, v in file_edits:
            data["files"][0][k] = v
    text = json.dumps(data)
    if deep == 1:
        text = text[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    elif deep == 2:
        text = text[:-1] + ', "x": ' + "9" * 5000 + "}"
    (d / "run.json").write_text(text)
    try:
        ts = discover([d])
        from perfscope.report.jsonout import dumps

        dumps(ts.run_info)
        rundir.read_run(d, verify=True)
    except PerfscopeError:
        pass


@pytest.mark.parametrize("mode", MODES)
def test_fuzz_fix_manifest(tmp_path_factory, mode):
    @_cfg(300, mode)
    @given(edits=st.lists(st.tuples(st.sampled_from(["backup", "sha256_before", "sha256_after", "strategy",
                                                     "variant", "applied_at", "path"]), JSON), max_size=4),
           top=st.one_of(st.none(), JSON))
    def prop(edits, top):
        _manifest_case(tmp_path_factory, edits, top)
    _run(mode, prop, 300)


def _manifest_case(tmp_path_factory, edits, top):
    from perfscope.fixengine.engine import load_manifest
    from perfscope.fixengine.host import LocalFixHost

    d = tmp_path_factory.mktemp("man")
    man = {"fix": "x", "backup": "original-abc.py", "sha256_before": "a" * 64, "sha256_after": "b" * 64,
           "strategy": "s", "variant": "v", "applied_at": "t"}
    for k, v in edits:
        man[k] = v
    (d / "manifest.json").write_text(json.dumps(man if top is None else top))
    try:
        m = load_manifest(LocalFixHost(), str(d))
        assert isinstance(m, dict) and isinstance(m["backup"], str) and isinstance(m["sha256_before"], str)
    except PerfscopeError:
        pass


def test_validation_drops_nothing_from_real_traces():
    """The boundary checks must not cost real data: every kernel of every real trace in
    tests/traces/corpus (epoch-microsecond timestamps included) is still read."""
    from paths import TRACES
    from perfscope.load.reader import _GPU_CATS, load_trace

    n = 0
    for p in sorted(TRACES.rglob("*.json.xz")):
        if p.stat().st_size > 1 << 20:
            continue
        try:
            obj = json.loads(json_of(p))
        except (ValueError, OSError):
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
            continue
        want = sum(1 for e in obj["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in _GPU_CATS)
        try:
            got = len(load_trace(p).kernels)
        except PerfscopeError:
            continue
        assert got == want, p
        n += want > 0
    assert n >= 10
