"""The ops and the steps of an analysis reach the renderers typed (:class:`perfscope.analysis.ops.Op`,
:class:`perfscope.analysis.step_summary.StepSummary`) and turn into dicts only at the JSON boundary:
a rank read back from its JSON (what a worker process, a Ray task, a host or a run folder's
ranks.json.gz hands over) writes the same JSON again, on real inputs of each kind."""

from __future__ import annotations

import json

import pytest

from paths import GPU_LOOP, KERNEL_MIX, TRACELENS, VLLM_CPU
from perfscope.analysis.diagnose import diagnose
from perfscope.analysis.ops import Op
from perfscope.analysis.result import RankAnalysis
from perfscope.analysis.step_summary import StepSummary

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

INF = TRACELENS / "inference"
INPUTS = {
    "run-folder": ([GPU_LOOP / "h200-2026-11-29" / "runs" / "bug"], {}),  # a bench: the unprofiled step
    "graph-replay-captured": ([INF / "sglang_decode/sglang_Qwen3-8B_decode.json.xz"],
                              {"capture": [INF / "sglang_decode/capture_traces/bs_32_rank0.json.xz"]}),
    "cpu-only": ([VLLM_CPU / "detailed.json.gz"], {}),
    "kernel-mix": ([KERNEL_MIX / "sample_topk.json.gz"], {}),
}


def _json(d: dict) -> str:
    return json.dumps(d, default=str)


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_a_rank_read_back_from_its_json_writes_the_same_json(name):
    paths, kw = INPUTS[name]
    d = diagnose(paths, **kw)
    for r in d.ranks:
        assert isinstance(r.steps, StepSummary) and r.ops and all(isinstance(o, Op) for o in r.ops)
        js = r.to_dict()
        back = RankAnalysis.from_dict(json.loads(_json(js)))
        assert _json(back.to_dict()) == _json(js)
        assert back.steps == r.steps
        assert [o.to_dict() for o in back.ops] == [o.to_dict() for o in r.ops]
    p = d.primary
    out = d.to_dict()
    # --json's top level carries the primary rank's records, as its rank entry does
    assert out["steps"] == p.steps.to_dict() == out["ranks"][d.ranks.index(p)]["steps"]
    assert out["ops"] == [o.to_dict() for o in p.ops]


def test_the_records_carry_what_the_analysis_found():
    run = diagnose(INPUTS["run-folder"][0]).primary
    # the bench measured the step without the profiler: only then the record says so
    assert run.steps.unprofiled and "unprofiled" in run.steps.to_dict()
    bare = diagnose(INPUTS["kernel-mix"][0]).primary
    assert bare.steps.unprofiled is None and "unprofiled" not in bare.steps.to_dict()
    cpu = diagnose(INPUTS["cpu-only"][0]).primary
    assert cpu.steps.cpu_only and not run.steps.cpu_only
    graph = diagnose(*INPUTS["graph-replay-captured"][:1], **INPUTS["graph-replay-captured"][1]).primary
    replayed = [o for o in graph.ops if o.attribution.graph_replay]
    assert replayed and all(o.attribution.captured for o in replayed[:3])
    # grid and block are tuples in the record and lists in the JSON, as the trace wrote them
    o = next(o for o in graph.ops if o.grid)
    assert isinstance(o.grid, tuple) and o.to_dict()["grid"] == list(o.grid)
    for r in (run, bare, cpu, graph):
        ms = [o.ms_per_step for o in r.ops]
        assert ms == sorted(ms, reverse=True) and 0 < sum(o.share for o in r.ops) <= 1 + 1e-9


def test_a_rank_analysed_in_a_worker_equals_one_analysed_here():
    """Two files go to worker processes, whose results come back as JSON; each equals the same file
    analysed in this process (the op's ``sample``, an index into the trace, stays behind)."""
    files = [KERNEL_MIX / "sample_topk.json.gz", VLLM_CPU / "detailed.json.gz"]
    d = diagnose(files, workers=2)
    assert d.parallel.get("workers", 0) >= 2
    assert sorted(r.file for r in d.ranks) == sorted(map(str, files))
    for r in d.ranks:
        (here,) = diagnose([r.file]).ranks  # one file: analysed in this process
        assert here.ops[0].sample >= 0 and r.ops[0].sample == -1
        assert _json(r.to_dict()) == _json(here.to_dict())
