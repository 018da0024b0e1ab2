"""Which files are ranks of one job (issue 13 item 7), on real traces.

A profile folder's `capture_traces/` subfolder is the graph-capture map (as `--capture-trace`
gives it), not more ranks; the same file twice is one rank; files from different GPUs or jobs
are not compared as ranks (no straggler); the straggler line compares like with like.
"""

from __future__ import annotations

import re
import statistics
import shutil

import pytest

from paths import HTA, TRACELENS
from perfscope.analysis.diagnose import diagnose
from perfscope.analysis.step_summary import StepSummary

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

SGL_DIR = TRACELENS / "inference/sglang_decode"  # sglang_Qwen3-8B_decode.json.xz + capture_traces/bs_32_rank0.json.xz
VLLM_DIR = TRACELENS / "inference/vllm_decode_full"
A100 = HTA / "negative_queue_length_values_check/rank0.json.xz"
V100 = HTA / "df_index_resolver/df_index_resolver.json.xz"
H100 = TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"


def test_capture_traces_folder_is_the_capture_map_not_a_rank():
    assert (SGL_DIR / "capture_traces/bs_32_rank0.json.xz").is_file()
    d = diagnose([SGL_DIR]).to_dict()
    assert len(d["ranks"]) == 1
    assert any("capture_traces/" in w for w in d["warnings"])
    # the same attribution as naming the capture trace explicitly
    e = diagnose([SGL_DIR / "sglang_Qwen3-8B_decode.json.xz"], capture=[SGL_DIR / "capture_traces"]).to_dict()
    assert d["ranks"][0].get("capture_map") or any("capture trace" in n for n in d["ranks"][0]["notes"])
    assert [o["op_chain"] for o in d["ops"][:5]] == [o["op_chain"] for o in e["ops"][:5]]
    assert d["steps"]["median_ms"] == e["steps"]["median_ms"]


def test_vllm_capture_traces_folder_is_not_a_rank():
    assert list((VLLM_DIR / "capture_traces").glob("*.json.xz"))
    d = diagnose([VLLM_DIR]).to_dict()
    assert len(d["ranks"]) == 1 and d["straggler"] is None


def test_same_file_twice_is_one_rank(tmp_path):
    d = diagnose([H100, H100]).to_dict()
    assert len(d["ranks"]) == 1 and "same path" in d["warnings"][0]
    copy = tmp_path / "copy.json.gz"
    shutil.copyfile(H100, copy)
    d = diagnose([H100, copy]).to_dict()
    assert len(d["ranks"]) == 1 and "identical bytes" in d["warnings"][0]


def test_different_gpus_are_not_ranks_of_one_job():
    d = diagnose([A100, V100]).to_dict()
    assert len(d["ranks"]) == 2
    assert d["straggler"] is None  # was "straggler 2.12x"
    assert any("different GPUs" in w and "A100" in w and "V100" in w for w in d["warnings"])
    assert any("different GPUs" in n for n in d["notes"])


def test_straggler_line_compares_like_with_like():
    d = diagnose([HTA / "trace_filter/sampled_rank-0.json.xz", HTA / "trace_filter/sampled_rank-1.json.xz"]).to_dict()
    s = d["straggler"]
    assert s and not d["warnings"]
    ratio = float(re.search(r"([\d.]+)x", s["line"]).group(1))
    assert ratio == round(s["slower_than_others"], 2)
    if s["signal"] == "compute-before-collective":
        # the ratio is of compute: the line says so and names compute times, the step time apart
        assert "compute" in s["line"] and f"{s['compute_ms']:.3g} ms of compute" in s["line"]
    else:
        assert f"{s['median_ms']:.3g} ms/step" in s["line"]


def test_a_rank_late_in_every_step_is_a_straggler_when_every_step_is_noisy():
    # the step times of a CI run that failed (tests/test_tp.py, repro server on CPU, rank 1 held back 400 ms
    # at the tail of each step, a loaded 2-core box slowing both ranks' steps alike): the ranks' own
    # step-to-step noise (~135 ms, 3x = 404 ms) hid a 360 ms lead that rank 1 had in EVERY step. Paired step by
    # step, the common slowdown cancels out.
    from types import SimpleNamespace

    from perfscope.analysis.split import _noise, _paired_noise, straggler

    steps = {0: [671.9, 425.5, 687.7, 382.3, 778.4, 703.0, 447.0, 522.1, 896.6, 610.9],
             1: [938.4, 813.6, 1089.7, 797.7, 1180.5, 1131.5, 848.8, 936.5, 1298.4, 1064.1]}

    def rank(r):
        xs = steps[r]
        return SimpleNamespace(rank=r, stage="DECODE", steps=StepSummary(count=len(xs), median_ms=statistics.median(xs),
                                                                  phase="decode", analysed_on="cpu-ops"),
                               per_step=[{"cpu_ms": x, "kernel_ms": 0.0} for x in xs], kernel_ms_per_step=0.0,
                               buckets={})

    ranks = [rank(0), rank(1)]
    step = lambda m: m["cpu_ms"]  # noqa: E731
    assert _paired_noise(ranks, step, ranks[1]) < _noise(ranks, step) / 3
    s = straggler(ranks)
    assert s["significant"] and s["rank"] == 1 and "x the other ranks' median" in s["line"], s
    # steps that do not pair up (different counts) fall back to the ranks' own noise: not significant here
    steps[1] = steps[1][:-1]
    ranks = [rank(0), rank(1)]
    assert _paired_noise(ranks, step, ranks[1]) is None
    s = straggler(ranks)
    assert not s["significant"] and "within the steps' noise" in s["line"], s
