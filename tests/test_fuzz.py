"""Property-based fuzzing (hypothesis) of everything perfscope reads: real small traces from
../shared/traces mutated in structure, types and bytes, run through the loader *and* the analysis
in-process; run.json files; fix manifests. The only exception allowed out is the documented input
error (:class:`perfscope.errors.PerfscopeError`, exit 2/4): anything else is a bug the CLI would
report as exit 70. ``PERFSCOPE_FUZZ_EXAMPLES`` scales the example counts (CI: the defaults, 2,400
in all, about a minute on 2 cores); the seed is fixed so that CI runs are reproducible.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paths import H200, TRACELENS
from perfscope.errors import PerfscopeError

SCALE = float(os.environ.get("PERFSCOPE_FUZZ_EXAMPLES", "1"))
# real traces, small enough that one example (mutate, serialise, parse, analyse) takes milliseconds
SEEDS = [
    TRACELENS / "inference" / "sglang_decode" / "sglang_Qwen3-8B_decode.json.gz",
    H200 / "mla_fp8_graph.json.gz",
    TRACELENS / "inference" / "vllm_decode_full" / "graph_execution.json.gz",
]


def _n(base: int) -> int:
    return max(10, int(base * SCALE))


def _cfg(n):
    return settings(max_examples=_n(n), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def seeds():
    out = []
    for p in SEEDS:
        assert p.is_file(), f"{p} missing: the shared traces are needed (../shared/traces)"
        obj = json.loads(gzip.decompress(p.read_bytes()))
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

    try:
        trace = parse(buf, "<fuzz>")
        ra = analyze_trace(trace, {})
        dumps(ra.to_dict())
    except PerfscopeError:
        pass  # a documented input error: one line, exit 2


@_cfg(1200)
@given(which=st.integers(0, len(SEEDS) - 1), ops=OPS)
def test_fuzz_trace_structure_and_types(seeds, which, ops):
    _load_and_analyse(json.dumps(_mutate(seeds[which], ops)).encode())


@_cfg(500)
@given(which=st.integers(0, len(SEEDS) - 1),
       edits=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["flip", "cut", "insert", "delete"]),
                                st.binary(min_size=1, max_size=4)), min_size=1, max_size=4),
       gz=st.booleans())
def test_fuzz_trace_bytes(seeds, which, edits, gz):
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


@_cfg(400)
@given(edits=st.lists(st.tuples(st.sampled_from(RUN_KEYS), JSON), max_size=5),
       file_edits=st.lists(st.tuples(st.sampled_from(["path", "rank", "host", "stage", "bytes", "sha256", "parallel"]),
                                     JSON), max_size=4),
       deep=st.integers(0, 3))
def test_fuzz_run_json(tmp_path_factory, edits, file_edits, deep):
    from perfscope.capture import rundir
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


@_cfg(300)
@given(edits=st.lists(st.tuples(st.sampled_from(["backup", "sha256_before", "sha256_after", "strategy", "variant",
                                                 "applied_at", "path"]), JSON), max_size=4),
       top=st.one_of(st.none(), JSON))
def test_fuzz_fix_manifest(tmp_path_factory, edits, top):
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
    shared/traces (epoch-microsecond timestamps included) is still read."""
    from paths import TRACES
    from perfscope.load.reader import _GPU_CATS, load_trace

    n = 0
    for p in sorted(TRACES.rglob("*.json.gz")):
        if p.stat().st_size > 1 << 20:
            continue
        try:
            obj = json.loads(gzip.decompress(p.read_bytes()))
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
