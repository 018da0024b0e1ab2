"""Achieved TB/s and TFLOP/s of the dominant ops against the H200's peaks, tied to the step's floor.

Real H200 traces: the FP8 KV-cast bug (tests/traces/corpus/h200-mla-fp8-kv; field-facts §4 measured
that cast kernel at about 1 TB/s) and the FlashInfer kernel-mix decode loop of this project.
"""

from __future__ import annotations

import pytest

from paths import H200, KERNEL_MIX, REPO
from realtraces import real_diagnosis
from perfscope.analysis.floor import with_floor_inputs

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)


def row(d, pred):
    return next(o for o in d["roofline"]["ops"] if pred(o))


def test_pool_cast_runs_at_a_fifth_of_hbm_and_owns_the_gap_above_the_floor():
    cfg = with_floor_inputs({}, REPO / "examples/h200_mla_repro.config.json", batch=1, context=4096)
    d = real_diagnosis(H200 / "mla_pool_eager.json.xz", config=cfg).to_dict()
    r = d["roofline"]
    assert r["available"] and r["peak_tb_s"] == 4.8
    cast = row(d, lambda o: o["bucket"] == "copy")
    assert cast["bytes"] == 495000 * 576 * 3  # 1 B read + 2 B written per element, from Input Dims
    assert cast["achieved_tb_s"] == pytest.approx(1.0, abs=0.1)
    assert cast["bw_fraction_of_peak"] == pytest.approx(0.21, abs=0.02)
    assert cast["bound_by"] == "memory" and 4 < cast["times_its_floor"] < 5.5
    assert cast["ms_per_step_above_floor"] == pytest.approx(40.3, abs=1.0)
    # tied to the step: the ops sized here explain most of the step's gap above the floor model
    assert r["share_of_gap_these_ops_explain"] > 0.7
    assert r["step_gap_above_floor_ms"] == pytest.approx(d["steps"]["median_ms"] - d["floor"]["floor_ms"], rel=1e-3)


def test_graph_cast_is_sized_from_launch_geometry():
    d = real_diagnosis(H200 / "mla_pool_graph.json.xz").to_dict()
    cast = row(d, lambda o: o["bucket"] == "copy")
    assert "launch geometry" in cast["how"]
    assert cast["achieved_tb_s"] == pytest.approx(1.0, abs=0.1)


def test_lm_head_gemm_of_the_flashinfer_loop():
    d = real_diagnosis(KERNEL_MIX / "fi_decode_eager.json.gz").to_dict()
    g = row(d, lambda o: "8x2048x151936" in o["how"])
    assert g["flops"] == 2 * 8 * 2048 * 151936
    assert g["bytes"] == (8 * 2048 + 2048 * 151936 + 8 * 151936) * 2
    assert g["bound_by"] == "memory"  # batch 8: weight-read bound
    assert 0.8 < g["bw_fraction_of_peak"] <= 1.0
    assert g["achieved_tflops"] == pytest.approx(g["flops"] / (g["avg_us"] * 1e-6) / 1e12, rel=1e-2)


@pytest.mark.parametrize("path", [H200 / "mla_pool_eager.json.xz", H200 / "mla_fp8_eager.json.xz",
                                  H200 / "mla_pages_eager.json.xz", KERNEL_MIX / "fi_decode_eager.json.gz",
                                  KERNEL_MIX / "sample_topp.json.gz", KERNEL_MIX / "triton_norm_rope_eager.json.gz"])
def test_no_op_beats_the_hardware(path):
    d = real_diagnosis(path).to_dict()
    for o in d["roofline"].get("ops", []):
        assert o["bw_fraction_of_peak"] <= 1.05, o
        assert o["flops_fraction_of_peak"] is None or o["flops_fraction_of_peak"] <= 1.05, o
