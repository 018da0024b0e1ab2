"""Labels that are right, on the real AMD traces (TraceLens, MI300X): the GPU by its name and gfx
arch, graphs called HIP graphs on ROCm, in the terminal, Markdown and HTML; stages of one rank
labelled as stages. (CPU wording of a compare of CPU-only traces: tests/test_demo.py.)"""

from __future__ import annotations

import os

from clirun import invoke
from paths import H200, TRACELENS
from perfscope.report.html import rank_labels
from perfscope.report.wording import gpu_arch, graph_word

SGL_MI300X = TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz"
VLLM_MI300X = TRACELENS / "inference/vllm_decode_full/graph_execution.json.xz"  # an empty device name


def run(*args):
    return invoke(*args, env={**os.environ, "COLUMNS": "160"})


def test_amd_gpu_named_with_its_gfx_arch_and_hip_graphs(tmp_path):
    r = run("diagnose", SGL_MI300X, "--html", tmp_path / "r.html", "--markdown", tmp_path / "r.md")
    assert r.returncode == 0, r.stderr
    assert "AMD Instinct MI300X (gfx942)" in r.stdout and "sm 9.4" not in r.stdout
    assert "HIP-graph replay" in r.stdout and "CUDA-graph" not in r.stdout
    html = (tmp_path / "r.html").read_text()
    assert "AMD Instinct MI300X</b> (gfx942, 304 CUs" in html and "HIP-graph replay" in html
    assert "(sm 9.4" not in html
    assert "HIP-graph replay" in (tmp_path / "r.md").read_text()
    # no name in the trace: matched by compute capability and memory, still gfx942
    r = run("diagnose", VLLM_MI300X)
    assert r.returncode == 0 and "MI300X (matched by compute capability and memory) (gfx942)" in r.stdout, r.stdout[:800]
    # NVIDIA stays sm X.Y and CUDA graph
    r = run("diagnose", H200 / "mla_pool_graph.json.xz")
    assert "NVIDIA H200 (sm 9.0)" in r.stdout and "CUDA-graph replay" in r.stdout


def test_arch_and_graph_words():
    assert gpu_arch({"platform": "rocm", "compute_capability": "9.4"}) == "gfx942"
    assert gpu_arch({"platform": "rocm", "compute_capability": "9.4", "gcn_arch": "gfx942:sramecc+:xnack-"}) == "gfx942"
    assert gpu_arch({"platform": "cuda", "compute_capability": "9.0"}) == "sm 9.0"
    assert graph_word({"platform": "rocm"}) == "HIP graph" and graph_word({"platform": "cuda"}) == "CUDA graph"


def test_stages_of_one_rank_are_labelled_as_stages():
    one = [{"rank": 0, "stage": "EXTEND"}, {"rank": 0, "stage": "DECODE"}]
    assert rank_labels(one) == (["EXTEND stage (prefill)", "DECODE stage"], "Per stage")
    two = [{"rank": 0, "stage": "DECODE"}, {"rank": 1, "stage": "DECODE"}]
    assert rank_labels(two) == (["rank 0 · DECODE stage", "rank 1 · DECODE stage"], "Per rank and stage")
    assert rank_labels([{"rank": 0, "stage": None}, {"rank": 1, "stage": None}]) == (["rank 0", "rank 1"], "Per rank")
