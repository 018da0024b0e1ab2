"""What one analysis builds once and shares (perfscope.analysis.kernel_table, step_overrides per step, the
step model's indexes and replays): the same answers as computing them afresh, and gone with the analysis."""

from __future__ import annotations

import gc
import weakref

import pytest
from paths import H200, KERNEL_MIX, TRACES

from perfscope.analysis.analyze import analyze_trace
from perfscope.analysis.buckets import classify
from perfscope.analysis.kernel_table import TORCH_SORT, kernel_table, launches_by_corr
from perfscope.analysis.sampling_path import _step_overrides, step_overrides
from perfscope.analysis.steps import find_steps
from perfscope.load import load_trace

MOE_B300 = TRACES / "public/TraceLens/evals/unit_tests_nv/moe/nv_moe_01_many_experts_few_tokens.json.xz"


@pytest.mark.parametrize("path", [MOE_B300, KERNEL_MIX / "sample_topp.json.gz", H200 / "mla_pool_graph.json.xz"],
                         ids=lambda p: p.name)
def test_tables_answer_as_the_regexes_do(path):
    trace = load_trace(path)
    t = kernel_table(trace)
    assert kernel_table(trace) is t  # built once
    for i, k in enumerate(trace.kernels):
        assert t.pair[i] == classify(k.name, k.kind) and t.bucket[i] == t.pair[i][0]
        assert t.gemm[i] == (k.kind == "kernel" and t.pair[i][0] == "gemm")
        assert t.torch_sort[i] == bool(TORCH_SORT.search(k.name))
    assert launches_by_corr(trace) == {l.corr: l for l in trace.launches if l.corr is not None}
    steps = find_steps(trace).steps
    seen = 0
    for s in steps:
        for serving in (True, False):
            once = step_overrides(trace, s, serving)
            assert step_overrides(trace, s, serving) is once and once == _step_overrides(trace, s, serving)
            seen += len(once)
    if path == MOE_B300:
        assert seen  # the MoE trace's mid-step top-k kernels are overridden


def test_an_analysis_leaves_nothing_holding_its_trace():
    """The step model's replays refer back to the trace: kept in its memo after the analysis, they would keep
    the whole trace alive until a garbage collection (a worker's next rank file parsed on top of it)."""
    trace = load_trace(H200 / "mla_pool_eager.json.xz")
    ra = analyze_trace(trace)
    assert "CPU launch timeline replay" in str(ra.findings)  # the step model replayed its steps
    assert trace.memo == {}
    gc.disable()
    try:
        ref = weakref.ref(trace)
        del trace
        assert ref() is None  # freed by its reference count alone
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "path", [H200 / "mla_pool_graph.json.xz", MOE_B300, KERNEL_MIX / "sample_topp.json.gz"], ids=lambda p: p.name
)
def test_nothing_holds_the_events_after_the_analysis(path):
    """Nothing but the trace holds its events once its analysis returns (a module-level cache of the MoE
    ranges kept a worker's last trace's kernels alive, to be freed only when the process exited)."""
    t = load_trace(path)
    ra = analyze_trace(t, {})
    assert ra.ops  # a real analysis ran
    for name in ("kernels", "annotations", "launches"):
        holders = [r for r in gc.get_referrers(getattr(t, name)) if r is not t and r is not vars(t)]
        assert holders == [], (name, [type(r).__name__ for r in holders])
