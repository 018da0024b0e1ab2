"""CPU-only traces are analysed on each op's self (exclusive) time on its own thread (issue 10 item
4, issue 13 item 8), checked on a real trace: tests/fixtures/real-sglang-0.5.23-cpu-TP-0-DECODE.
trace.json.xz is what `perfscope trace` brought back from a real SGLang 0.5.23 server on CPU
(tests/real_engines.py: tiny Qwen2, 2 layers, hidden 128, vocab 4096, torch_native attention;
--steps 4 --concurrency 2: four `step[DECODE bs=2]`), unmodified.

Counting only leaf ops (the old way) booked a GEMM's time on whatever small op it calls last and
listed `aten::empty_strided` first; self time puts it on `aten::mm`/`aten::addmm`. The self time
is checked against an independent computation (an op's duration minus its direct children's, found
by brute force), and per-step op time against the step."""

from __future__ import annotations

from paths import raw_json

from dataclasses import replace
from pathlib import Path

import pytest

from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.cpu_ops import cpu_ops_as_kernels, self_time_pieces
from perfscope.analysis.metrics import step_metrics, union_us
from perfscope.analysis.steps import find_steps
from perfscope.load.reader import load_trace

FIXTURE = Path(__file__).parent / "fixtures" / "real-sglang-0.5.23-cpu-TP-0-DECODE.trace.json.gz"


@pytest.fixture(scope="module")
def trace():
    t = load_trace(FIXTURE)
    assert not t.kernels and len(t.cpu_ops) > 1000
    return t


def _direct_children_us(ops, i) -> float:
    """Brute force: the ops strictly inside op i that no other op inside i contains."""
    o = ops[i]
    inside = [j for j, c in enumerate(ops) if j != i and o.ts <= c.ts and c.ts + c.dur <= o.ts + o.dur
              and (c.ts, -c.dur) > (o.ts, -o.dur)]
    direct = [j for j in inside if not any(k != j and ops[k].ts <= ops[j].ts and
                                           ops[j].ts + ops[j].dur <= ops[k].ts + ops[k].dur and
                                           (ops[j].ts, -ops[j].dur) > (ops[k].ts, -ops[k].dur) for k in inside)]
    return sum(ops[j].dur for j in direct)


def test_self_time_is_duration_minus_direct_children(trace):
    ops = sorted(trace.cpu_ops, key=lambda o: (o.ts, -o.dur))[:400]  # brute force is quadratic
    got: dict[int, float] = {}
    for i, s, e in self_time_pieces(ops):
        got[i] = got.get(i, 0.0) + (e - s)
    linear = 0
    for i, o in enumerate(ops):
        want = o.dur - _direct_children_us(ops, i)
        assert got.get(i, 0.0) == pytest.approx(max(want, 0.0), abs=0.01), o.name
        linear += o.name == "aten::linear"
    assert linear > 0  # the sample holds nested GEMM ops
    # the pieces of one thread never overlap, and cover exactly the union of its op intervals
    pieces = sorted((s, e) for _, s, e in self_time_pieces(ops))
    assert all(a[1] <= b[0] + 1e-6 for a, b in zip(pieces, pieces[1:]))
    assert sum(e - s for s, e in pieces) == pytest.approx(union_us([(o.ts, o.ts + o.dur) for o in ops]), rel=1e-9)


def test_gemm_and_attention_carry_their_time(trace):
    d = analyze_trace(trace).to_dict()
    assert d["steps"]["phase"] == "decode" and d["steps"]["count"] == 4 and d["steps"]["analysed_on"] == "cpu-ops"
    names = [o["name"] for o in d["ops"]]
    assert names[0] != "aten::empty_strided"
    gemm = [o for o in d["ops"] if o["name"] in ("aten::mm", "aten::addmm")]
    assert gemm and sum(o["ms_per_step"] for o in gemm) > 0.5  # ~1.2 ms of the ~4.6 ms of op time
    assert d["buckets"]["gemm"]["ms_per_step"] > d["buckets"]["copy"]["ms_per_step"]
    assert any("attention" in o["name"] for o in d["ops"]) and d["buckets"]["attention"]["ms_per_step"] > 0
    # each op counted once a step however many pieces its self time has: 2 layers x (q, k, v fused) ...
    addmm = [o for o in d["ops"] if o["name"] == "aten::addmm"]
    assert all(float(o["count_per_step"]).is_integer() for o in addmm)


def test_per_step_op_time_never_exceeds_the_step(trace):
    t = replace(trace, kernels=cpu_ops_as_kernels(trace))
    ss = find_steps(t)
    assert len(ss.steps) == 4
    for s in ss.steps:
        m = step_metrics(t, s)
        assert 0 < m.kernel_ms <= m.gpu_ms + 1e-6  # op time <= the span of its ops
        assert m.kernel_ms <= m.cpu_ms + 1e-6  # ... and <= the step annotation
        assert m.busy_ms == pytest.approx(m.kernel_ms, rel=1e-6)  # no two pieces overlap


def test_ops_of_another_thread_are_not_the_steps(trace):
    """The same ops again on a second thread of the process, overlapping the first in time (as a
    busy background thread would): summing threads made op time exceed the step. They are not
    the step's: per-step op time stays as it was."""
    base = analyze_trace(trace).to_dict()
    twin = [o._replace(tid=o.tid + 1 if isinstance(o.tid, int) else f"{o.tid}-twin") for o in trace.cpu_ops]
    doubled = analyze_trace(replace(trace, cpu_ops=trace.cpu_ops + twin)).to_dict()
    assert doubled["kernel_ms_per_step"] == pytest.approx(base["kernel_ms_per_step"], rel=1e-9)
    assert doubled["buckets"] == base["buckets"]


def test_one_collective_on_two_backend_threads_is_waited_for_once():
    """HTA's CPU-only rank (a real gloo job): every `gloo:all_reduce` is recorded on two backend
    threads at once (170-380 ms each, overlapping). Summing both made a step's op time 343.7 ms in a
    178.8 ms step (communication 192% of the step); the rank waits for each collective once."""

    from paths import HTA

    path = next((HTA / "cpu_only").glob("*.json.xz"))
    raw = raw_json(path)["traceEvents"]
    step = next(e for e in raw if e.get("name", "").startswith("ProfilerStep#"))
    s0, s1 = step["ts"], step["ts"] + step["dur"]
    gloo = [(max(e["ts"], s0), min(e["ts"] + e["dur"], s1)) for e in raw
            if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce" and e["ts"] < s1 and e["ts"] + e["dur"] > s0]
    assert len({e["tid"] for e in raw if e.get("name") == "gloo:all_reduce"}) == 2 and len(gloo) == 2
    want_ms = union_us(gloo) / 1e3  # independent: the union of the raw intervals inside the step

    d = analyze_trace(load_trace(path)).to_dict()
    assert d["steps"]["analysed_on"] == "cpu-ops" and d["steps"]["count"] == 1
    comm = d["buckets"]["communication"]["ms_per_step"]
    assert comm == pytest.approx(want_ms, rel=1e-3)
    assert d["kernel_ms_per_step"] <= d["steps"]["median_ms"] + 1e-6
    assert d["kernel_ms_per_step"] <= d["steps"]["cpu_median_ms"] + 1e-6
