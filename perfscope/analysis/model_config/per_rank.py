"""Bytes one rank reads in a decode step under SGLang's sharding (tp, ep, DP attention): weights by
part, the experts a step touches, KV-cache bytes per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from perfscope.analysis.model_config.quantization import DTYPE_BYTES, Quantization, _fmt
from perfscope.analysis.model_config.shape import ModelShape


# ----------------------------------------------------------------------------------- bytes per rank
@dataclass
class Parallel:
    tp: int = 1
    ep: int = 1
    dp_attention: int = 1  # dp_size when DP attention is on, else 1

    @property
    def attn_tp(self) -> int:
        return max(self.tp // max(self.dp_attention, 1), 1)

    @property
    def moe_tp(self) -> int:
        return max(self.tp // max(self.ep, 1), 1)


def expected_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts ``tokens`` tokens route to, each to ``top_k`` of ``n_experts``, routing uniform."""
    if tokens <= 0 or n_experts <= 0:
        return 0.0
    k = min(top_k, n_experts)
    return n_experts * (1.0 - (1.0 - k / n_experts) ** tokens)


@dataclass
class WeightRead:
    """Bytes of weights one rank reads in one decode step, by part, and the FLOPs they feed."""

    parts: dict[str, float]  # bytes
    params: dict[str, float]  # parameters read (for FLOPs: 2 * params * tokens, experts per token)
    gemm_dtype: str
    experts_touched_per_rank: Optional[float] = None
    explicit: bool = False

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def _layer_modules(shape: ModelShape, i: int) -> dict[str, tuple[int, bool]]:
    """Attention weights of layer i as {module: (params, split over tp)}."""
    h, nh = shape.hidden or 0, shape.heads or 0
    p = f"model.layers.{i}.self_attn."
    if shape.attention == "mla":
        nope = shape.qk_nope_head_dim or 128
        rope = shape.qk_rope_head_dim or 64
        v = shape.v_head_dim or 128
        r = shape.kv_lora_rank or 512
        mods: dict[str, tuple[int, bool]] = {}
        if shape.q_lora_rank:
            mods[p + "q_a_proj"] = (h * shape.q_lora_rank, False)
            mods[p + "q_b_proj"] = (shape.q_lora_rank * nh * (nope + rope), True)
        else:
            mods[p + "q_proj"] = (h * nh * (nope + rope), True)
        mods[p + "kv_a_proj_with_mqa"] = (h * (r + rope), False)
        mods[p + "kv_b_proj"] = (r * nh * (nope + v), True)
        mods[p + "o_proj"] = (nh * v * h, True)
        return mods
    hd = shape.head_dim or 0
    return {
        p + "q_proj": (h * nh * hd, True),
        p + "k_proj": (h * (shape.kv_heads or nh) * hd, True),
        p + "v_proj": (h * (shape.kv_heads or nh) * hd, True),
        p + "o_proj": (nh * hd * h, True),
    }


_MLP_PROJ = ("gate_proj", "up_proj", "down_proj")


def weight_read(shape: ModelShape, par: Parallel, tokens: int) -> WeightRead:
    """The weights one rank reads in a decode step of ``tokens`` tokens (batch x tokens per request)."""
    q = shape.quant or Quantization(_fmt("bf16"), _fmt("bf16"))
    parts = {
        "attention": 0.0,
        "dense_mlp": 0.0,
        "shared_experts": 0.0,
        "routed_experts": 0.0,
        "router": 0.0,
        "lm_head": 0.0,
    }
    params = dict(parts)
    h = shape.hidden or 0
    lm = 0.0
    if shape.vocab and h:
        lm_params = shape.vocab * h / par.tp  # vocabulary-parallel lm_head
        lm = lm_params * q.unquantized.bytes_per_param
        params["lm_head"] = lm_params
    total = shape.weight_bytes
    if total is None and shape.weight_bytes_per_layer is not None:
        total = shape.weight_bytes_per_layer * shape.layers
    if total is not None:  # given by the server
        parts["layers"] = total / par.tp
        params["layers"] = parts["layers"] / q.default.bytes_per_param
        parts["lm_head"] = lm
        return WeightRead(
            {k: v for k, v in parts.items() if v},
            {k: v for k, v in params.items() if v},
            q.default.gemm_dtype,
            explicit=True,
        )
    touched = None
    kvh = shape.kv_heads or 1
    per: float  # parameters of one module on this rank
    for i in range(shape.layers):
        for mod, (n, split) in _layer_modules(shape, i).items():
            if not split:
                per = n
            elif mod.endswith(("k_proj", "v_proj")):
                per = n * max(kvh // par.attn_tp, 1) / kvh  # KV heads never split below one per rank
            else:
                per = n / par.attn_tp
            parts["attention"] += per * q.format_of(mod).bytes_per_param
            params["attention"] += per
        mlp = f"model.layers.{i}.mlp."
        if shape.moe_layers and shape.moe_layers[i]:
            e_params = h * (shape.moe_intermediate or 0)  # one projection of one expert
            touched = expected_experts(shape.n_experts, shape.top_k, tokens) / max(par.ep, 1)
            for proj in _MLP_PROJ:
                per = touched * e_params / par.moe_tp
                parts["routed_experts"] += per * q.format_of(mlp + "experts.0." + proj).bytes_per_param
                params["routed_experts"] += shape.top_k * e_params / max(par.ep, 1) / par.moe_tp  # per token
                if shape.n_shared:
                    sh = shape.n_shared * h * (shape.shared_intermediate or 0) / par.tp
                    parts["shared_experts"] += sh * q.format_of(mlp + "shared_experts." + proj).bytes_per_param
                    params["shared_experts"] += sh
            r = h * shape.n_experts  # the router: small, kept in the model dtype
            parts["router"] += r * q.unquantized.bytes_per_param
            params["router"] += r
        else:
            for proj in _MLP_PROJ:
                dense = h * (shape.intermediate or 0) / par.tp
                parts["dense_mlp"] += dense * q.format_of(mlp + proj).bytes_per_param
                params["dense_mlp"] += dense
    parts["lm_head"] = lm
    return WeightRead(
        {k: v for k, v in parts.items() if v},
        {k: v for k, v in params.items() if v},
        q.default.gemm_dtype,
        experts_touched_per_rank=touched,
    )


def kv_bytes_per_token_per_layer(shape: ModelShape, kv_dtype_bytes: float, par: Parallel) -> float:
    """KV-cache bytes one rank reads per attended token per layer (MLA: the latent, replicated)."""
    if shape.attention == "mla":
        return (shape.kv_cache_dim or 576) * kv_dtype_bytes
    kvh = shape.kv_heads or 1
    per_rank = max(kvh // par.attn_tp, 1)
    return 2 * per_rank * (shape.head_dim or 0) * kv_dtype_bytes


def kv_dtype_bytes(kv_cache_dtype: Optional[str], model_dtype: str) -> tuple[float, str]:
    """(bytes per element, dtype name) of SGLang's ``--kv-cache-dtype`` ("auto": the model dtype)."""
    k = (kv_cache_dtype or "auto").lower().replace("torch.", "")
    if k in ("auto", "", "none"):
        k = model_dtype
    b = DTYPE_BYTES.get(k)
    if b is None:
        if "fp8" in k or "float8" in k:
            b = 1.0
        elif "fp4" in k:
            b = 0.5 + 1.0 / 16
        else:
            b = 2.0
    return b, k


def summary_for_rank(shape: ModelShape, par: Parallel) -> dict[str, Any]:
    """Active weight bytes per token per rank (one token, batch 1): what a step costs at the least."""
    w = weight_read(shape, par, tokens=1)
    return {"active_weight_bytes_per_token": int(w.total), "parts": {k: int(v) for k, v in w.parts.items()}}
