"""A model's shape from its config.json (or a server_info carrying the same fields): MLA or GQA
attention, dense/MoE layers in every spelling, sliding-window layers, nested ``text_config``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from perfscope.analysis.model_config.quantization import ModelConfigError, Quantization, parse_quantization
from perfscope.errors import InputError


# ----------------------------------------------------------------------------------- the shape
@dataclass
class ModelShape:
    model_type: str
    attention: str  # "mla" | "gqa"
    layers: int
    hidden: Optional[int]
    heads: Optional[int]
    kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    qk_nope_head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None
    q_lora_rank: Optional[int] = None
    kv_cache_dim: Optional[int] = None  # MLA latent per token (kv_lora_rank + qk_rope_head_dim)
    intermediate: Optional[int] = None  # dense MLP
    vocab: Optional[int] = None
    n_experts: int = 0
    top_k: int = 0
    moe_intermediate: Optional[int] = None
    n_shared: int = 0
    shared_intermediate: Optional[int] = None
    moe_layers: list[bool] = field(default_factory=list)  # per layer: MoE MLP?
    sliding_window: Optional[int] = None
    sliding_layers: list[bool] = field(default_factory=list)
    dtype: str = "bfloat16"
    quant: Optional[Quantization] = None
    weight_bytes_per_layer: Optional[int] = None  # given by the server: wins over the computed figure
    weight_bytes: Optional[int] = None
    source: str = "config.json"

    @property
    def is_moe(self) -> bool:
        # a config with experts whose every layer is dense (first_k_dense_replace >= layers) is dense
        return self.n_experts > 0 and self.top_k > 0 and (not self.moe_layers or any(self.moe_layers))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["quant"] = self.quant.summary() if self.quant else None
        d["moe_layers"] = sum(self.moe_layers) if self.moe_layers else 0
        d["sliding_layers"] = sum(self.sliding_layers) if self.sliding_layers else 0
        return {k: v for k, v in d.items() if v not in (None, 0, [], "") or k in ("layers",)}


def _int(d: dict, *keys: str) -> Optional[int]:
    for k in keys:
        v = d.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, int) and v >= 0:
            return v
        if isinstance(v, float) and v.is_integer() and v >= 0:
            return int(v)
    return None


def _flatten(cfg: dict) -> dict:
    """A config with its text model's fields on top (multimodal configs nest them)."""
    out = dict(cfg)
    mc = cfg.get("model_config")
    if isinstance(mc, dict):  # the reproduction server's /server_info nests the model fields too
        out = {**mc, **{k: v for k, v in cfg.items() if k not in mc}}
    for key in ("text_config", "language_config", "llm_config"):
        tc = out.get(key)
        if isinstance(tc, dict):
            qc = out.get("quantization_config")
            out = {**out, **tc}
            if qc is not None and "quantization_config" not in tc:
                out["quantization_config"] = qc
    return out


def parse_model(
    cfg: dict, *, server_quant: Optional[str] = None, server_dtype: Optional[str] = None, source: str = "config.json"
) -> ModelShape:
    """A :class:`ModelShape` from a HF config.json (or a server_info carrying the same fields)."""
    if not isinstance(cfg, dict):
        raise ModelConfigError("the model config must be a JSON object (a Hugging Face config.json)")
    c = _flatten(cfg)
    layers = _int(c, "num_hidden_layers", "num_layers", "n_layer", "n_layers")
    if not layers:
        raise ModelConfigError("model config has no num_hidden_layers")
    hidden = _int(c, "hidden_size", "d_model", "n_embd", "dim")
    heads = _int(c, "num_attention_heads", "n_head", "n_heads", "num_heads")
    model_type = str(c.get("model_type") or (c.get("architectures") or ["?"])[0])
    dtype = str(
        server_dtype
        if server_dtype and server_dtype != "auto"
        else (c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    ).replace("torch.", "")
    kv_lora = _int(c, "kv_lora_rank")
    rope = _int(c, "qk_rope_head_dim")
    kv_dim = _int(c, "kv_cache_dim")
    mla = bool(kv_lora) or (kv_dim is not None and "mla" in str(c.get("architectures") or "").lower())
    shape = ModelShape(
        model_type=model_type,
        attention="mla" if mla else "gqa",
        layers=layers,
        hidden=hidden,
        heads=heads,
        dtype=dtype,
        source=source,
    )
    if mla:
        shape.kv_lora_rank = kv_lora
        shape.qk_rope_head_dim = rope if rope is not None else (64 if kv_lora else None)
        shape.qk_nope_head_dim = _int(c, "qk_nope_head_dim")
        shape.v_head_dim = _int(c, "v_head_dim")
        shape.q_lora_rank = _int(c, "q_lora_rank")
        shape.kv_cache_dim = kv_dim or ((kv_lora or 0) + (shape.qk_rope_head_dim or 0)) or None
        shape.kv_heads = 1
    else:
        shape.kv_heads = _int(c, "num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num") or heads
        hd = _int(c, "head_dim", "kv_channels")
        shape.head_dim = hd or (hidden // heads if hidden and heads else None)
    shape.intermediate = _int(c, "intermediate_size", "ffn_hidden_size", "n_inner")
    shape.vocab = _int(c, "vocab_size", "padded_vocab_size")
    # MoE, in its several spellings
    n_exp = _int(c, "n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts") or 0
    top_k = _int(c, "num_experts_per_tok", "experts_per_token", "moe_topk", "top_k") or 0
    if n_exp and top_k:
        shape.n_experts, shape.top_k = n_exp, top_k
        shape.moe_intermediate = _int(c, "moe_intermediate_size", "expert_intermediate_size") or shape.intermediate
        shape.n_shared = _int(c, "n_shared_experts", "num_shared_experts") or 0
        shared_inter = _int(c, "shared_expert_intermediate_size")
        if shared_inter:  # Qwen2-MoE: one shared expert of its own size
            shape.n_shared, shape.shared_intermediate = 1, shared_inter
        elif shape.n_shared:
            shape.shared_intermediate = shape.moe_intermediate
        first_dense = _int(c, "first_k_dense_replace") or 0
        freq = _int(c, "moe_layer_freq") or 1
        step = _int(c, "decoder_sparse_step", "interleave_moe_layer_step") or 1
        mlp_only = set(x for x in (c.get("mlp_only_layers") or []) if isinstance(x, int))
        if "n_routed_experts" in c or "first_k_dense_replace" in c:
            shape.moe_layers = [i >= first_dense and i % freq == 0 for i in range(layers)]
        else:
            shape.moe_layers = [i not in mlp_only and (i + 1) % step == 0 for i in range(layers)]
        if not shape.moe_intermediate:
            raise ModelConfigError("MoE model config has no moe_intermediate_size / intermediate_size")
    else:
        shape.moe_layers = [False] * layers
    # sliding-window layers read at most the window
    win = _int(c, "sliding_window")
    types = c.get("layer_types")
    if win and isinstance(types, list) and len(types) == layers:
        shape.sliding_window = win
        shape.sliding_layers = ["sliding" in str(t) for t in types]
    # what the server states outright
    shape.weight_bytes_per_layer = _int(c, "weight_bytes_per_layer")
    shape.weight_bytes = _int(c, "weight_bytes")
    shape.quant = parse_quantization(c, server_quant, dtype)
    if shape.weight_bytes is None and shape.weight_bytes_per_layer is None:
        need = [n for n, v in (("hidden_size", hidden), ("num_attention_heads", heads)) if not v]
        if mla and not shape.kv_lora_rank:
            need.append("kv_lora_rank")
        if not shape.is_moe and not shape.intermediate:
            need.append("intermediate_size")
        if need:
            raise ModelConfigError("model config lacks " + ", ".join(need) + " (or weight_bytes_per_layer)")
    if mla and not shape.kv_cache_dim:
        raise ModelConfigError("MLA model config lacks kv_lora_rank/qk_rope_head_dim (or kv_cache_dim)")
    if not mla and not (shape.kv_heads and shape.head_dim):
        raise ModelConfigError("model config lacks num_key_value_heads/head_dim (or hidden_size and heads)")
    return shape


def load_model_config(path: Path) -> dict:
    """Read a config.json for ``--model-config`` (one-line errors)."""
    from perfscope.util import jsonio

    cfg = jsonio.read(path, "model config: a JSON object, a Hugging Face config.json", expect=dict)
    if not any(k in cfg for k in _MODEL_KEYS):
        raise InputError(
            f"--model-config {path}: not a model's config.json (none of {', '.join(_MODEL_KEYS[:4])}, ... "
            "in it): give the model's Hugging Face config.json"
        )
    return cfg


# a Hugging Face config.json has at least one of these (multimodal ones nest the LLM's under *_config)
_MODEL_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "model_type",
    "architectures",
    "n_layer",
    "num_layers",
    "text_config",
    "llm_config",
    "language_config",
    "weight_bytes_per_layer",
    "kv_lora_rank",
)
