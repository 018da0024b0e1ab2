"""The floor model: the GPU table, model configs -> bytes per rank, and the floor of real H200 traces.

The model configs below are the real config.json fields of public checkpoints (transcribed: the
Hugging Face Hub cannot be reached from CI); their published parameter counts are the check.
"""

from __future__ import annotations

import json

import pytest

from clirun import invoke
from paths import H200, REPO, TRACELENS
from realtraces import real_diagnosis, real_trace
from perfscope.analysis.floor import compute_floor, with_floor_inputs
from perfscope.analysis.gpus import GPUS, match_gpu
from perfscope.analysis.model_config import (
    ModelConfigError,
    Parallel,
    expected_experts,
    kv_bytes_per_token_per_layer,
    parse_model,
    weight_read,
)
from perfscope.errors import InputError

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

MEASURED = json.loads((H200 / "measured.json").read_text())
EXAMPLE = REPO / "examples" / "h200_mla_repro.config.json"

# deepseek-ai/DeepSeek-V3 config.json (the fields the floor reads)
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
# meta-llama/Llama-3.1-8B-Instruct
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16"}
# meta-llama/Llama-3.1-70B-Instruct
LLAMA_31_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
                "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
                "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16"}
# Qwen/Qwen3-30B-A3B
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# openai/gpt-oss-120b
GPT_OSS_120B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
                "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
                "experts_per_token": 4, "num_hidden_layers": 36, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18, "torch_dtype": "bfloat16",
                "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                                                                   "model.layers.*.mlp.router",
                                                                   "model.embed_tokens", "lm_head"],
                                        "quant_method": "mxfp4"}}

H200_META = {"device_name": "NVIDIA H200", "compute_capability": "9.0", "total_mem_bytes": 150109880320,
             "platform": "cuda"}


def params(cfg: dict, par: Parallel = Parallel(), tokens: int = 1) -> float:
    w = weight_read(parse_model(cfg), par, tokens)
    return sum(w.params.values())


# ------------------------------------------------------------------------------------------ GPU table
def test_every_gpu_row_has_its_source_and_sane_figures():
    for g in GPUS:
        assert g.source and g.url.startswith("https://"), g.key
        assert 0.2 < g.mem_bw_tbs < 10 and g.mem_gb >= 16 and g.link_gbs > 0 and g.bf16_tflops > 50, g.key
        assert g.fp8_tflops is None or g.fp8_tflops >= g.bf16_tflops, g.key
        assert g.fp4_tflops is None or g.fp4_tflops >= (g.fp8_tflops or 0), g.key
    keys = {g.key for g in GPUS}
    for need in ("h100-sxm", "h100-pcie", "h200", "b200", "gb200", "rtx-pro-6000", "a100-40-sxm", "a100-80-sxm",
                 "l40s", "mi300x", "mi325x", "mi355x", "v100-sxm2"):
        assert need in keys


# (deviceProperties name, computeMajor.Minor, totalGlobalMem, platform) as real traces in
# tests/traces/corpus carry them, then names as torch reports other boards
@pytest.mark.parametrize("name,cc,mem,platform,key", [
    ("NVIDIA H200", "9.0", 150109880320, "cuda", "h200"),
    ("NVIDIA H100 80GB HBM3", "9.0", 85018279936, "cuda", "h100-sxm"),
    ("NVIDIA B200", "10.0", 191503138816, "cuda", "b200"),
    ("AMD Instinct MI300X", "9.4", 206141652992, "rocm", "mi300x"),
    ("AMD Instinct MI300X VF", "9.4", 205571227648, "rocm", "mi300x"),
    ("", "9.4", 206141652992, "rocm", "mi300x"),  # TraceLens MI300X traces with an empty name
    ("NVIDIA A100-SXM4-80GB", "8.0", 84990623744, "cuda", "a100-80-sxm"),
    ("NVIDIA A100-PG509-200", "8.0", 42505273344, "cuda", "a100-40-sxm"),
    ("Tesla V100-SXM2-16GB", "7.0", 16945512448, "cuda", "v100-sxm2"),
    ("Tesla V100-SXM2-32GB", "7.0", 34089730048, "cuda", "v100-sxm2"),
    ("AMD Radeon Graphics", "9.0", 68702699520, "rocm", "mi200-gcd"),  # HTA's MI250 trace
    ("NVIDIA H100 PCIe", "9.0", 85000000000, "cuda", "h100-pcie"),
    ("NVIDIA H100 NVL", "9.0", 99900000000, "cuda", "h100-nvl"),
    ("NVIDIA H200 NVL", "9.0", 150000000000, "cuda", "h200-nvl"),
    ("NVIDIA GB200", "10.0", 199000000000, "cuda", "gb200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", 102000000000, "cuda", "rtx-pro-6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "12.0", 102000000000, "cuda", "rtx-pro-6000-maxq"),
    ("NVIDIA A100 80GB PCIe", "8.0", 85000000000, "cuda", "a100-80-pcie"),
    ("NVIDIA A100-PCIE-40GB", "8.0", 42000000000, "cuda", "a100-40-pcie"),
    ("NVIDIA L40S", "8.9", 48000000000, "cuda", "l40s"),
    ("AMD Instinct MI325X", "9.4", 274000000000, "rocm", "mi325x"),
    ("AMD Instinct MI355X", "9.5", 309000000000, "rocm", "mi355x"),
])
def test_gpu_matched_from_trace_device_properties(name, cc, mem, platform, key):
    m = match_gpu(name, cc, mem, platform)
    assert m.gpu is not None and m.gpu.key == key, (name, m)


def test_unknown_gpu_says_so():
    m = match_gpu("NVIDIA GeForce RTX 3090", "8.6", 25000000000, "cuda")
    assert m.gpu is None and "not in perfscope's table" in m.note


# ------------------------------------------------------------------------------------------ model configs
def test_deepseek_v3_parameter_counts():
    s = parse_model(DEEPSEEK_V3)
    assert s.attention == "mla" and s.kv_cache_dim == 576 and sum(s.moe_layers) == 58
    embed = 129280 * 7168
    # 671B in all (the 14B MTP module aside), 37B activated per token
    every_expert = sum(v for k, v in weight_read(s, Parallel(), 1).params.items() if k != "routed_experts") \
        + 58 * 256 * 3 * 7168 * 2048
    assert every_expert + embed == pytest.approx(671e9, rel=0.01)
    assert params(DEEPSEEK_V3) + embed == pytest.approx(37e9, rel=0.03)


def test_deepseek_v3_fp8_bytes_per_rank():
    s = parse_model(DEEPSEEK_V3)
    assert s.quant.default.name == "fp8" and s.quant.default.bytes_per_param == pytest.approx(1 + 4 / 128 ** 2)
    one = weight_read(s, Parallel(), 1)
    assert one.parts["lm_head"] == 129280 * 7168 * 2  # lm_head stays BF16
    assert one.total == pytest.approx(37.7e9, rel=0.02)
    tp8 = weight_read(s, Parallel(tp=8), 1)
    # q_a/kv_a projections are replicated, the rest split: per rank more than 1/8 of the whole
    assert one.total / 8 < tp8.total < one.total / 6
    # with uniform routing EP and TP-split experts read the same bytes per rank
    assert weight_read(s, Parallel(tp=8, ep=8), 1).total == pytest.approx(tp8.total, rel=1e-6)
    # a batch of 256 tokens touches nearly every expert: far more bytes than one token
    assert weight_read(s, Parallel(tp=8), 256).parts["routed_experts"] > 25 * tp8.parts["routed_experts"]


def test_mla_kv_bytes_fp8_and_bf16():
    s = parse_model(DEEPSEEK_V3)
    assert kv_bytes_per_token_per_layer(s, 1.0, Parallel(tp=8)) == 576  # replicated latent, FP8
    assert kv_bytes_per_token_per_layer(s, 2.0, Parallel()) == 1152


def test_dense_gqa_llama():
    s = parse_model(LLAMA_31_8B)
    assert s.attention == "gqa" and s.head_dim == 128 and s.kv_heads == 8
    assert params(LLAMA_31_8B) + 128256 * 4096 == pytest.approx(8.03e9, rel=0.01)
    assert kv_bytes_per_token_per_layer(s, 2.0, Parallel()) == 2 * 8 * 128 * 2
    # 8 KV heads over TP 16: one head per rank, never fewer
    assert kv_bytes_per_token_per_layer(s, 2.0, Parallel(tp=16)) == 2 * 1 * 128 * 2
    assert params(LLAMA_31_70B) + 128256 * 8192 == pytest.approx(70.6e9, rel=0.01)


def test_qwen3_moe_counts():
    s = parse_model(QWEN3_30B_A3B)
    assert s.is_moe and sum(s.moe_layers) == 48 and s.n_shared == 0
    assert params(QWEN3_30B_A3B) + 151936 * 2048 == pytest.approx(3.3e9, rel=0.03)  # "3.3B activated"


def test_gpt_oss_mxfp4_and_sliding_window():
    s = parse_model(GPT_OSS_120B)
    assert s.quant.default.name == "mxfp4" and s.quant.default.bytes_per_param == pytest.approx(0.53125)
    assert sum(s.sliding_layers) == 18 and s.sliding_window == 128
    assert params(GPT_OSS_120B) == pytest.approx(5.1e9, rel=0.03)  # "5.1B active"
    every = weight_read(s, Parallel(), 10 ** 6)
    # attention excluded from MXFP4 (BF16), experts MXFP4: ~61 GB of experts, ~64 GB read in all
    assert every.parts["attention"] == pytest.approx(0.955e9 * 2, rel=0.02)
    assert every.parts["routed_experts"] == pytest.approx(114.7e9 * 0.53125, rel=0.01)


def test_nvfp4_with_excluded_attention():
    cfg = dict(DEEPSEEK_V3, quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                                 "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]})
    s = parse_model(cfg)
    assert s.quant.default.name == "nvfp4" and s.quant.default.bytes_per_param == pytest.approx(0.5625)
    w = weight_read(s, Parallel(), 1)
    fp8 = weight_read(parse_model(DEEPSEEK_V3), Parallel(), 1)
    assert w.parts["attention"] == pytest.approx(fp8.parts["attention"] * 2, rel=0.01)  # excluded: BF16
    assert w.parts["routed_experts"] == pytest.approx(fp8.parts["routed_experts"] * 0.5625, rel=0.01)


def test_mixed_precision_modelopt_and_server_quantization():
    cfg = dict(LLAMA_31_8B, quantization_config={
        "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
        "quantized_layers": {f"model.layers.{i}.mlp.gate_proj": {"quant_algo": "NVFP4", "group_size": 16}
                             for i in range(32)}})
    w = weight_read(parse_model(cfg), Parallel(), 1)
    assert w.parts["dense_mlp"] == pytest.approx((4096 * 14336 * 32) * (0.5625 + 2 + 2), rel=1e-6)
    # a BF16 checkpoint served with --quantization fp8: every linear layer FP8 (lm_head aside)
    s = parse_model(LLAMA_31_8B, server_quant="fp8")
    assert weight_read(s, Parallel(), 1).parts["dense_mlp"] == pytest.approx(3 * 4096 * 14336 * 32)


def test_expected_experts():
    assert expected_experts(256, 8, 1) == pytest.approx(8)
    assert expected_experts(256, 8, 10_000) == pytest.approx(256)
    assert 8 < expected_experts(256, 8, 32) < 256


def test_model_config_errors_are_one_line():
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        parse_model({"hidden_size": 4096})
    with pytest.raises(ModelConfigError, match="intermediate_size"):
        parse_model({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    with pytest.raises(ModelConfigError, match="unsupported quant_method"):
        parse_model(dict(LLAMA_31_8B, quantization_config={"quant_method": "hqq"}))


# ------------------------------------------------------------------------------------------ the floor
def test_tp_allreduce_floor():
    """Llama-3.1-70B on 8 H100 SXM, batch 32: two all-reduces per layer over NVLink."""
    meta = {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "platform": "cuda"}
    cfg = {"model_config": LLAMA_31_70B, "tp_size": 8, "floor_inputs": {"batch": 32, "context": 2048}}
    f = compute_floor(meta, cfg, buckets_ms={"gemm": 5.0, "attention": 1.0, "communication": 3.0}, step_ms=10.0)
    assert f["available"], f
    msg = 32 * 8192 * 2
    assert f["bytes_per_step"]["communication"] == pytest.approx(2 * 80 * msg * 2 * 7 / 8)
    assert f["buckets"]["communication"]["floor_ms"] == pytest.approx(2 * 80 * msg * 2 * 7 / 8 / 450e6, rel=1e-3)
    weights = f["bytes_per_step"]["weights"]
    assert f["buckets"]["gemm"]["floor_ms"] == pytest.approx(weights / 3.35e9, rel=1e-3)
    assert f["inputs"]["kv_bytes_per_token_per_layer"] == 2 * 1 * 128 * 2  # 8 KV heads over 8 ranks


def test_large_batch_gemm_is_compute_bound():
    cfg = {"model_config": LLAMA_31_8B, "floor_inputs": {"batch": 4096, "context": 128}}
    f = compute_floor(H200_META, cfg, buckets_ms={"gemm": 80.0}, step_ms=90.0)
    assert f["buckets"]["gemm"]["bound"] == "compute"
    assert f["buckets"]["gemm"]["floor_ms"] == pytest.approx(2 * 4096 * params(LLAMA_31_8B) / 989.5e9, rel=1e-3)


def test_missing_inputs_named_in_one_line():
    f = compute_floor(H200_META, {}, buckets_ms={}, step_ms=5.0)
    assert not f["available"]
    assert f["missing"].startswith("floor: needs --model-config")
    assert "--batch" in f["missing"] and "--context" in f["missing"] and "\n" not in f["missing"]
    mc = json.loads(EXAMPLE.read_text())
    mc.pop("workload")
    f = compute_floor(H200_META, {"model_config": mc, "floor_inputs": {"batch": 1}}, buckets_ms={}, step_ms=5.0)
    assert f["missing"] == "floor: needs --context (tokens each request attends)"
    # SGLang's step labels carry the batch
    f = compute_floor(H200_META, {"model_config": mc, "floor_inputs": {"context": 100}}, buckets_ms={}, step_ms=5.0,
                      step_labels=["step[DECODE bs=32]", "step[DECODE bs=32]"])
    assert f["available"] and f["inputs"]["batch"] == 32 and f["inputs"]["sources"]["batch"].startswith("step labels")
    # a perfscope run's workload gives both
    f = compute_floor(H200_META, {"model_config": mc, "workload": {"concurrency": 8, "input_len": 1000,
                                                                   "output_len": 200}}, buckets_ms={}, step_ms=5.0)
    assert f["inputs"]["batch"] == 8 and f["inputs"]["context"] == 1100
    # SGLang's server_info names the model: the line says whose config.json
    f = compute_floor(H200_META, {"model_path": "deepseek-ai/DeepSeek-R1", "tp_size": 8}, buckets_ms={}, step_ms=5.0)
    assert "config.json of deepseek-ai/DeepSeek-R1" in f["missing"]
    f = compute_floor({"device_name": "cpu"}, {"model_config": mc}, buckets_ms={}, step_ms=5.0)
    assert "not in perfscope's table" in f["missing"]


def test_repro_server_info_shape():
    """The reproduction server's /server_info: SGLang's flattened args plus the model fields, nested too."""
    model = {"num_hidden_layers": 60, "hidden_size": 7168, "num_attention_heads": 16, "kv_lora_rank": 512,
             "qk_rope_head_dim": 64, "vocab_size": 32000, "context_length": 8192, "kv_cache_dim": 576,
             "weight_bytes_per_layer": 257818624, "weight_bytes": 257818624 * 60,
             "architectures": ["ReproMLAForCausalLM"]}
    info = {"model_path": "perfscope-repro/mla-fp8-60l-7168h", "dtype": "bfloat16", "quantization": None,
            "kv_cache_dtype": "fp8_e4m3", "tp_size": 1, "ep_size": 1, **model, "model_config": model}
    f = compute_floor(H200_META, with_floor_inputs(info, batch=1, context=4096), buckets_ms={"gemm": 4.0},
                      step_ms=7.0)
    assert f["available"], f
    assert f["weights"]["layers"] == 257818624 * 60 and f["weights"]["lm_head"] == 32000 * 7168 * 2
    assert f["inputs"]["kv_bytes_per_token_per_layer"] == 576 and f["inputs"]["kv_cache_dtype"] == "fp8_e4m3"


# ------------------------------------------------------------------------------------------ real H200 traces
def _diag(name: str, **opts) -> dict:
    cfg = with_floor_inputs({}, EXAMPLE, opts.get("batch"), opts.get("context"))
    return real_diagnosis(H200 / name, config=cfg).to_dict()


def test_fixed_step_floor_on_h200():
    """The native-FP8 step (measured 6.98 ms) against its floor at H200's 4.8 TB/s: 60 x 249.6 MB of BF16
    weights (3.12 ms) + 60 x 4096 x 576 B of FP8 KV (0.03 ms) = 3.15 ms, 2.2x below the measurement. The
    bucket that keeps the step above its floor is attention: 60 small MLA kernels (batch 1, 16 heads) at
    ~43 us each against 0.5 us of bandwidth."""
    d = _diag("mla_fp8_graph.json.xz")
    f = d["floor"]
    assert f["available"], f
    assert f["floor_ms"] == pytest.approx((60 * 249561088 + 60 * 4096 * 576) / 4.8e9, rel=1e-3)
    measured = MEASURED["graph"]["fp8"]["median_ms"]
    assert f["floor_ms"] < measured < 2.5 * f["floor_ms"]
    assert f["ratio"] == pytest.approx(d["steps"]["median_ms"] / f["floor_ms"], rel=1e-3)
    assert f["worst_bucket"] == "attention"
    assert f["buckets"]["gemm"]["floor_ms"] < f["buckets"]["gemm"]["measured_ms"] < 1.5 * f["buckets"]["gemm"]["floor_ms"]
    assert f["gpu"]["key"] == "h200" and f["gpu"]["matched_by"] == "name"
    assert f["inputs"]["batch"] == 1 and f["inputs"]["context"] == 4096
    assert f["inputs"]["sources"]["context"] == "model config workload.context"


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_pool_trace_gap_points_at_copy(mode):
    d = _diag(f"mla_pool_{mode}.json.xz")
    f = d["floor"]
    assert f["available"] and f["worst_bucket"] == "copy"
    assert f["buckets"]["copy"]["floor_ms"] == 0
    assert f["worst_gap_ms"] == pytest.approx(d["buckets"]["copy"]["ms_per_step"], rel=1e-3)
    assert f["ratio"] > 15
    # the finding keeps its own prediction; the floor sits beside it
    fp8 = next(x for x in d["findings"] if x["id"] == "fp8-kv-cast")
    assert fp8["evidence"]["floor_step_ms"] == f["floor_ms"]
    assert fp8["evidence"]["predicted_over_floor"] == pytest.approx(fp8["predicted_step_ms_after_fix"] / f["floor_ms"],
                                                                    rel=1e-3)
    if mode == "graph":
        assert fp8["predicted_step_ms_after_fix"] == pytest.approx(MEASURED["graph"]["fp8"]["median_ms"], rel=0.25)
    else:  # eager: the launch timeline holds the step up (tests/test_stepmodel.py)
        assert fp8["evidence"]["prediction"]["lower_bound_ms"] <= MEASURED["eager"]["fp8"]["median_ms"]


def test_eager_fixed_trace_gap_is_idle():
    f = _diag("mla_fp8_eager.json.xz")["floor"]
    assert f["worst_bucket"] == "idle"


def test_options_override_the_example_workload():
    f = _diag("mla_fp8_graph.json.xz", batch=4, context=1000)["floor"]
    assert f["inputs"]["batch"] == 4 and f["inputs"]["context"] == 1000
    assert f["bytes_per_step"]["kv"] == 4 * 1000 * 576 * 60


def test_without_model_config_the_json_says_what_is_missing():
    d = real_diagnosis(H200 / "mla_fp8_graph.json.xz").to_dict()
    assert d["floor"]["available"] is False
    assert d["floor"]["missing"].startswith("floor: needs --model-config")


def test_cli_model_config_option():
    r = invoke("diagnose", H200 / "mla_pool_graph.json.xz", "--json", "--model-config", EXAMPLE, "--context", "4096")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["floor"]["worst_bucket"] == "copy" and d["floor"]["inputs"]["context"] == 4096
    r = invoke("diagnose", H200 / "mla_pool_graph.json.xz", "--model-config", REPO / "nonexistent.json")
    assert r.returncode == 2 and "model config" in r.stderr and "Traceback" not in r.stderr


def test_with_floor_inputs_rejects_bad_numbers():
    with pytest.raises(InputError, match="--batch"):
        with_floor_inputs({}, None, 0, None)


def test_html_report_shows_the_floor_and_its_worst_bucket(tmp_path):
    """The HTML diagnosis carries the floor section (rendered by the report template)."""

    from paths import H200, REPO

    out = tmp_path / "r.html"
    r = invoke("diagnose", H200 / "mla_pool_graph.json.xz", "--model-config", REPO / "examples" / "h200_mla_repro.config.json", "--html", out)
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    section = page[page.index('id="floor"'):]
    assert "Hardware floor" in page and "Furthest above its floor: <b>copy</b>" in section
    assert "NVIDIA H200" in section and "should cost <b>3.15 ms</b>" in section  # ms at one precision (report/wording.py)


def test_report_header_names_an_unnamed_rocm_gpu_by_its_match():
    """vLLM's MI300X trace (TraceLens) carries an empty device name: the header says which table row
    its compute capability and memory match, and that it was matched, not named."""
    from perfscope.analysis.analyze import analyze_trace
    from perfscope.analysis.gpus import device_label

    r = analyze_trace(real_trace(TRACELENS / "inference/vllm_decode_full/graph_execution.json.xz"))
    assert not r.meta.get("device_name")
    assert device_label(r.meta) == "AMD Instinct MI300X (matched by compute capability and memory)"
    assert device_label({"device_name": "NVIDIA H200"}) == "NVIDIA H200"
    assert device_label({"compute_capability": "8.6", "total_mem_bytes": 25 << 30, "platform": "cuda"}) is None
