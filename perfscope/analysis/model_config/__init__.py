"""A model's shape from its Hugging Face ``config.json``: the bytes a decode step must read.

Read here: DeepSeek V2/V3/R1-style MLA (``kv_lora_rank``, ``qk_rope_head_dim``, ``q_lora_rank``),
Llama/Qwen/Mistral-style GQA (``num_key_value_heads``, ``head_dim``), MoE in the DeepSeek/GLM
(``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``),
Qwen (``num_experts``, ``shared_expert_intermediate_size``, ``decoder_sparse_step``,
``mlp_only_layers``) and Mixtral/gpt-oss (``num_local_experts``) spellings, sliding-window layers
(``layer_types`` + ``sliding_window``), nested ``text_config``, and the weight formats:
BF16/FP16, FP8 (block or per-tensor scales), NVFP4 (FP4 + an FP8 scale per 16 + FP32 tensor
scale), MXFP4 (FP4 + an E8M0 scale per 32), INT4/INT8 AWQ/GPTQ, with their exclusion lists.

Also read: what the reproduction server puts in ``/server_info`` (the same field names, plus
``weight_bytes_per_layer`` / ``weight_bytes`` and ``kv_cache_dim``, which win over what this
module would compute).

Per rank under SGLang's sharding: attention heads, the dense MLP, shared experts and the
vocabulary-parallel ``lm_head`` are split over ``tp``; MLA's down-projections (``q_a_proj``,
``kv_a_proj_with_mqa``) are replicated; KV heads are split over ``tp`` but never below one per
rank; the routed experts are split over ``ep`` (``E/ep`` whole experts per rank), each one's
intermediate dimension over ``tp/ep``; with DP attention the attention weights are split over
``tp/dp`` only. The experts a step reads: the distinct experts its tokens route to, expected under
uniform routing, ``E * (1 - (1 - k/E)^tokens)``.

Modules: ``quantization`` (weight formats, :class:`ModelConfigError`, dtype sizes), ``shape``
(:func:`parse_model`, :func:`load_model_config`), ``per_rank`` (:func:`weight_read`, KV bytes,
:class:`Parallel`). Import from this package.
"""

from __future__ import annotations

from perfscope.analysis.model_config.per_rank import (
    Parallel,
    WeightRead,
    expected_experts,
    kv_bytes_per_token_per_layer,
    kv_dtype_bytes,
    summary_for_rank,
    weight_read,
)
from perfscope.analysis.model_config.quantization import (
    DTYPE_BYTES,
    ModelConfigError,
    Quantization,
    WeightFormat,
    parse_quantization,
)
from perfscope.analysis.model_config.shape import ModelShape, load_model_config, parse_model

__all__ = [
    "DTYPE_BYTES",
    "ModelConfigError",
    "ModelShape",
    "Parallel",
    "Quantization",
    "WeightFormat",
    "WeightRead",
    "expected_experts",
    "kv_bytes_per_token_per_layer",
    "kv_dtype_bytes",
    "load_model_config",
    "parse_model",
    "parse_quantization",
    "summary_for_rank",
    "weight_read",
]
