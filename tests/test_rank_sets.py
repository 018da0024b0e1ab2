"""Which files are ranks of one job (issue 13 item 7), on real traces.

A profile folder's `capture_traces/` subfolder is the graph-capture map (as `--capture-trace`
gives it), not more ranks; the same file twice is one rank; files from different GPUs or jobs
are not compared as ranks (no straggler); the straggler line compares like with like.
"""

from __future__ import annotations

import re
import shutil

from paths import HTA, TRACELENS
from perfscope.analysis.diagnose import diagnose

SGL_DIR = TRACELENS / "inference/sglang_decode"  # sglang_Qwen3-8B_decode.json.gz + capture_traces/bs_32_rank0.json.gz
VLLM_DIR = TRACELENS / "inference/vllm_decode_full"
A100 = HTA / "negative_queue_length_values_check/rank0.json.gz"
V100 = HTA / "df_index_resolver/df_index_resolver.json.gz"
H100 = TRACELENS / "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def test_capture_traces_folder_is_the_capture_map_not_a_rank():
    assert (SGL_DIR / "capture_traces/bs_32_rank0.json.gz").is_file()
    d = diagnose([SGL_DIR]).to_dict()
    assert len(d["ranks"]) == 1
    assert any("capture_traces/" in w for w in d["warnings"])
    # the same attribution as naming the capture trace explicitly
    e = diagnose([SGL_DIR / "sglang_Qwen3-8B_decode.json.gz"], capture=[SGL_DIR / "capture_traces"]).to_dict()
    assert d["ranks"][0].get("capture_map") or any("capture trace" in n for n in d["ranks"][0]["notes"])
    assert [o["op_chain"] for o in d["ops"][:5]] == [o["op_chain"] for o in e["ops"][:5]]
    assert d["steps"]["median_ms"] == e["steps"]["median_ms"]


def test_vllm_capture_traces_folder_is_not_a_rank():
    assert list((VLLM_DIR / "capture_traces").glob("*.json.gz"))
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
    d = diagnose([HTA / "trace_filter/sampled_rank-0.json.gz", HTA / "trace_filter/sampled_rank-1.json.gz"]).to_dict()
    s = d["straggler"]
    assert s and not d["warnings"]
    ratio = float(re.search(r"([\d.]+)x", s["line"]).group(1))
    assert ratio == round(s["slower_than_others"], 2)
    if s["signal"] == "compute-before-collective":
        # the ratio is of compute: the line says so and names compute times, the step time apart
        assert "compute" in s["line"] and f"{s['compute_ms']:.3g} ms of compute" in s["line"]
    else:
        assert f"{s['median_ms']:.3g} ms/step" in s["line"]
