"""The step after a fix, replayed on the CPU launch timeline (perfscope.analysis.stepmodel), on real traces.

The H200 pair in ../shared/traces/h200-mla-fp8-kv: the bug (whole-pool cast) and the fix (native
FP8, no cast), both profiled the same way, and measured.json's CUDA-event medians of the same
runs. "Step minus cast time" said 7.02 ms for the eager step; the fix measured 9.84 ms unprofiled
and 29.0 ms per step under the profiler: the casts hid launch gaps that come back.
"""

from __future__ import annotations

import json

import pytest

from paths import H200, KERNEL_MIX, TRACELENS
from perfscope.analysis.diagnose import diagnose
from perfscope.analysis.steps import find_steps
from perfscope.analysis.stepmodel import StepReplay
from perfscope.load.reader import load_trace

MEASURED = json.loads((H200 / "measured.json").read_text())


def cast_finding(name):
    d = diagnose([H200 / name]).to_dict()
    return d, next(f for f in d["findings"] if f["id"] == "fp8-kv-cast")


def test_eager_prediction_is_held_up_by_the_launch_timeline():
    _, f = cast_finding("mla_pool_eager.json.gz")
    p = f["evidence"]["prediction"]
    after_trace = diagnose([H200 / "mla_fp8_eager.json.gz"]).to_dict()["steps"]["median_ms"]
    # the old kernel-only answer (step minus the casts) is far below what the fix measured
    assert p["kernel_only_prediction_ms"] == pytest.approx(7.02, abs=0.05)
    assert p["kernel_only_prediction_ms"] < 0.75 * MEASURED["eager"]["fp8"]["median_ms"]
    # replayed on the same (profiled) launch timeline: within 15% of the fixed run's own trace
    assert f["predicted_step_ms_after_fix"] == pytest.approx(after_trace, rel=0.15)
    assert f["evidence"]["prediction"]["launch_bound_steps"] == "5/5"
    # the unprofiled measurement lies between the lower bound and the profiled-timeline prediction
    assert p["lower_bound_ms"] <= MEASURED["eager"]["fp8"]["median_ms"] <= f["predicted_step_ms_after_fix"]
    assert "~%.1f ms" % f["predicted_step_ms_after_fix"] in f["summary"]


def test_graph_prediction_matches_the_measured_fix():
    _, f = cast_finding("mla_pool_graph.json.gz")
    p = f["evidence"]["prediction"]
    # one graph launch per step: nothing hides a launch, the kernel-only answer stands
    assert p["launch_bound_steps"] == "0/5"
    assert f["predicted_step_ms_after_fix"] == pytest.approx(MEASURED["graph"]["fp8"]["median_ms"], rel=0.1)


@pytest.mark.parametrize("path", [H200 / "mla_pool_eager.json.gz", H200 / "mla_fp8_graph.json.gz",
                                  KERNEL_MIX / "sample_topp.json.gz", KERNEL_MIX / "fi_decode_eager.json.gz",
                                  TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"])
def test_replay_with_recorded_durations_reproduces_the_step(path):
    # one compute stream (+ graph replays); cross-stream event waits are not modelled (a training
    # rank with NCCL on its own streams replays ~37% short), which the prediction's
    # base-minus-after difference absorbs
    t = load_trace(path)
    steps = [s for s in find_steps(t).steps if s.kernels]
    errs = []
    for s in steps[:8]:
        r = StepReplay(t, s)
        span = r.run(lambda i: t.kernels[i].dur)["span_us"]
        errs.append(abs(span - s.gpu_us) / s.gpu_us)
    assert max(errs) < 0.1, errs
