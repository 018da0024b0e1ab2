"""The step model's quick paths give what its plain paths give, on real traces: new durations prepared
from the slots a fix changes (StepReplay.prepare with ``changed``), a step's slots grouped by stream, a
CUDA-graph launch replayed as a chain."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from paths import H200, KERNEL_MIX, TRACELENS
from perfscope.analysis.steps import find_steps
from perfscope.analysis.stepmodel import StepReplay
from perfscope.analysis.stepmodel import chain as stepmodel_chain
from perfscope.analysis.stepmodel import predict as stepmodel_predict
from realtraces import real_trace

DSK_TRAIN = Path(__file__).parent / "traces/deepseek-profile-data/train.json.gz"  # H800, DeepEP + NCCL streams
TRACES = [
    H200 / "mla_pool_eager.json.xz",
    H200 / "mla_pool_graph.json.xz",
    KERNEL_MIX / "sample_topp.json.gz",
    TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz",
    DSK_TRAIN,
]


def _steps(path, n=6):
    t = real_trace(path)
    return t, [s for s in find_steps(t).steps if s.kernels][:n]


def _fix(kern, step, rng):
    """A fix's new durations for a real step: some kernels removed, some slower, the rest unchanged."""
    out = {}
    for i in step.kernels:
        x = rng.random()
        if x < 0.1:
            out[i] = 0.0
        elif x < 0.2:
            out[i] = kern[i].dur * 1.5
    return out


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_prepare_from_the_changed_slots_is_the_full_prepare(path):
    t, steps = _steps(path)
    kern = t.kernels
    rng = random.Random(3)
    for s in steps:
        r = StepReplay(t, s)
        durs = r._plan()[4]
        new = _fix(kern, s, rng)
        nd = [new.get(i, d) for i, d in zip(s.kernels, durs)]
        changed = [p for p, i in enumerate(s.kernels) if i in new]
        assert changed, "the fix changes some kernels of the step"
        assert r.prepare(nd, changed) == r.prepare(nd)
        assert r.prepare(list(durs), []) == r.prepare(list(durs))
        for timeline in ("recorded", "launch-api"):
            assert r.run_slots(nd, timeline, prepared=r.prepare(nd, changed)) == r.run_slots(nd, timeline)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_streams_group_each_slot_once_in_order(path):
    t, steps = _steps(path)
    kern = t.kernels
    for s in steps:
        per: dict = {}
        for p, i in enumerate(s.kernels):
            per.setdefault(kern[i].stream, []).append(p)
        assert stepmodel_predict._streams(StepReplay(t, s)) == list(per.values())


GRAPH_TRACES = [H200 / "mla_pool_graph.json.xz", H200 / "mla_fp8_graph.json.xz", H200 / "mla_pool_eager.json.xz"]


def _runs(t, s, fixes):
    r = StepReplay(t, s)
    durs = r._plan()[4]
    out = []
    for fix in fixes:
        nd = [fix(p, d) for p, d in enumerate(durs)]
        out += [r.run_slots(nd, timeline) for timeline in ("recorded", "launch-api")]
    return r, out


@pytest.mark.parametrize("path", GRAPH_TRACES, ids=lambda p: p.name)
def test_a_graph_launch_replayed_as_a_chain_is_replayed_as_kernel_by_kernel(path, monkeypatch):
    t, steps = _steps(path)
    fixes = [
        lambda p, d: d,  # as recorded
        lambda p, d: 0.0 if p % 7 == 3 else d,  # some removed
        lambda p, d: 0.0 if p == 0 or p > len(steps[0].kernels) - 4 else d,  # the first and the last removed
        lambda p, d: 0.0,  # all removed: the launches alone
        lambda p, d: d * (0.5 + (p * 7919 % 100) / 100),  # each shorter or longer
        lambda p, d: d + 50.0 if p % 11 == 0 else d,
    ]
    chained = 0
    for s in steps:
        r, fast = _runs(t, s, fixes)
        chained += sum(e[11] is not None for e in r._plan()[0])
        with monkeypatch.context() as m:
            m.setattr(stepmodel_chain, "CHAIN_FROM", 10**9)  # every kernel planned and replayed one by one
            r_plain, plain = _runs(t, s, fixes)
            assert all(e[11] is None for e in r_plain._plan()[0])
        assert fast == plain
        assert r._plan()[3] == r_plain._plan()[3]
    # the CUDA-graph steps replay their launch as a chain; the eager trace has none to replay so
    assert (chained > 0) == ("graph" in path.name)
