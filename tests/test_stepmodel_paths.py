"""The step model's quick paths give what its plain paths give, on real traces: steps taken in start
order without a sort when they come so (steps.by_start), new durations prepared from the slots a fix
changes (StepReplay.prepare with ``changed``), a step's slots grouped by stream."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from paths import H200, KERNEL_MIX, TRACELENS
from perfscope.analysis.steps import by_start, find_steps
from perfscope.analysis.stepmodel import StepReplay
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


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_by_start_is_the_sort_by_start(path):
    t, steps = _steps(path)
    kern = t.kernels
    rng = random.Random(7)
    for s in steps:
        shuffled = list(s.kernels)
        rng.shuffle(shuffled)
        for idx in (s.kernels, shuffled, s.kernels[::-1]):
            assert by_start(kern, idx) == sorted(idx, key=lambda j: kern[j].ts)
            assert by_start(kern, idx, then_index=True) == sorted(idx, key=lambda j: (kern[j].ts, j))
    # a step's kernels are in start order as found: the quick path is the one taken
    assert all(by_start(kern, s.kernels) == s.kernels for s in steps)


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
