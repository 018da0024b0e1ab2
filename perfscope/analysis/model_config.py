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
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from perfscope.errors import InputError

DTYPE_BYTES = {"bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0, "float32": 4.0,
               "fp32": 4.0, "float": 4.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "float8_e4m3fn": 1.0,
               "int8": 1.0, "fp4": 0.5, "fp4_e2m1": 0.5}


class ModelConfigError(InputError):
    """The model config lacks what the floor needs (one line says what)."""


# ----------------------------------------------------------------------------------- weight formats
@dataclass(frozen=True)
class WeightFormat:
    name: str  # bf16 | fp16 | fp8 | nvfp4 | mxfp4 | int4 | int8
    bytes_per_param: float  # the values and their scales
    gemm_dtype: str  # which tensor peak its GEMMs can use: bf16 | fp8 | fp4
    detail: str = ""


def _fmt(name: str, detail: str = "", group: Optional[int] = None, block: Optional[list] = None) -> WeightFormat:
    if name in ("bf16", "fp16"):
        return WeightFormat(name, 2.0, "bf16", detail)
    if name == "fp8":
        if block and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
            return WeightFormat("fp8", 1.0 + 4.0 / (block[0] * block[1]), "fp8",
                                detail or f"FP8 e4m3, FP32 scale per {block[0]}x{block[1]} block")
        return WeightFormat("fp8", 1.0, "fp8", detail or "FP8 e4m3, per-tensor/per-channel scales")
    if name == "nvfp4":
        g = group or 16
        return WeightFormat("nvfp4", 0.5 + 1.0 / g, "fp4", detail or f"NVFP4: FP4 e2m1 + FP8 e4m3 scale per {g}")
    if name == "mxfp4":
        g = group or 32
        return WeightFormat("mxfp4", 0.5 + 1.0 / g, "fp4", detail or f"MXFP4: FP4 e2m1 + E8M0 scale per {g}")
    if name == "int4":
        g = group or 128
        return WeightFormat("int4", 0.5 + 2.5 / g, "bf16", detail or f"INT4, FP16 scale + 4-bit zero per {g}")
    if name == "int8":
        return WeightFormat("int8", 1.0, "fp8", detail or "INT8, per-channel scales")
    raise ModelConfigError(f"unknown weight format {name!r}")


@dataclass
class Quantization:
    """Which weights are stored in which format."""

    default: WeightFormat  # quantised linear layers
    unquantized: WeightFormat  # the model dtype: excluded modules, router, lm_head
    exclude: list[str] = field(default_factory=list)
    per_module: dict[str, WeightFormat] = field(default_factory=dict)  # modelopt MIXED_PRECISION
    method: str = "none"

    def format_of(self, module: str) -> WeightFormat:
        if self.per_module:  # ModelOpt MIXED_PRECISION lists every quantised module; the rest stay as they are
            for key, f in self.per_module.items():
                k = key.replace("model.language_model.", "model.")
                if module == k or module.startswith(k + "."):
                    return f
            return self.unquantized
        if any(_pat_hit(p, module) for p in self.exclude):
            return self.unquantized
        return self.default

    def summary(self) -> dict:
        d = {"method": self.method, "weights": self.default.name, "bytes_per_param": round(self.default.bytes_per_param, 5),
             "detail": self.default.detail, "unquantized": self.unquantized.name}
        if self.exclude:
            d["exclude"] = self.exclude
        if self.per_module:
            d["per_module"] = {k: v.name for k, v in list(self.per_module.items())[:8]}
        return d


def _pat_hit(pat: str, module: str) -> bool:
    if not isinstance(pat, str) or not pat:
        return False
    if pat.startswith("re:"):
        return re.search(pat[3:], module) is not None
    if any(c in pat for c in "*?["):
        return fnmatch.fnmatch(module, pat) or fnmatch.fnmatch(module, pat + ".*") or \
            fnmatch.fnmatch(module, "*" + pat) or fnmatch.fnmatch(module, "*" + pat + ".*")
    return pat in module


def _algo_format(algo: str, group: Optional[int]) -> Optional[WeightFormat]:
    a = (algo or "").upper()
    if "NVFP4" in a or a in ("FP4", "W4A4_NVFP4"):
        return _fmt("nvfp4", group=group)
    if "MXFP4" in a:
        return _fmt("mxfp4", group=group)
    if "FP8" in a:
        return _fmt("fp8")
    if "INT4" in a or "W4A16" in a or "AWQ" in a:
        return _fmt("int4", group=group)
    if "INT8" in a or "W8A8" in a:
        return _fmt("int8")
    return None


def parse_quantization(cfg: dict, server_quant: Optional[str], model_dtype: str) -> Quantization:
    """The weight formats from ``quantization_config`` (or hf_quant_config.json's ``quantization``),
    else from SGLang's ``--quantization`` (online quantisation of a BF16 checkpoint)."""
    base = _fmt("fp16" if model_dtype in ("float16", "fp16", "half") else "bf16")
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict) and isinstance(cfg.get("quantization"), dict):
        qc = cfg["quantization"]  # hf_quant_config.json layout
    if isinstance(qc, dict):
        method = str(qc.get("quant_method") or ("modelopt" if "quant_algo" in qc else "")).lower()
        exclude = [x for x in (qc.get("modules_to_not_convert") or qc.get("exclude_modules") or qc.get("ignore")
                               or qc.get("ignored_layers") or []) if isinstance(x, str)]
        group = qc.get("group_size") if isinstance(qc.get("group_size"), int) else None
        if method == "fp8":
            fmt = _fmt("fp8", block=qc.get("weight_block_size"))
            return Quantization(fmt, base, exclude, method="fp8")
        if method in ("mxfp4",):
            return Quantization(_fmt("mxfp4"), base, exclude, method="mxfp4")
        if method.startswith("modelopt") or "quant_algo" in qc:
            algo = str(qc.get("quant_algo") or ("NVFP4" if "fp4" in method else "FP8"))
            per: dict[str, WeightFormat] = {}
            layers = qc.get("quantized_layers")
            if isinstance(layers, dict):
                for mod, spec in layers.items():
                    if isinstance(spec, dict):
                        f = _algo_format(str(spec.get("quant_algo") or ""), spec.get("group_size"))
                        if f:
                            per[mod] = f
            fmt = _algo_format(algo, group)
            if fmt is None and per:
                fmt = max(per.values(), key=lambda f: f.bytes_per_param)  # the heavier one as the default
            if fmt is None:
                raise ModelConfigError(f"unsupported ModelOpt quant_algo {algo!r} in quantization_config")
            return Quantization(fmt, base, exclude, per, method="modelopt " + algo.lower())
        if method == "compressed-tensors":
            groups = qc.get("config_groups") or {}
            w = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
            if isinstance(w, dict):
                bits, typ, gs = w.get("num_bits"), str(w.get("type") or ""), w.get("group_size")
                if bits == 4 and typ == "float":
                    fmt = _fmt("nvfp4", group=gs)
                elif bits == 8 and typ == "float":
                    fmt = _fmt("fp8")
                elif bits == 4:
                    fmt = _fmt("int4", group=gs)
                elif bits == 8:
                    fmt = _fmt("int8")
                else:
                    raise ModelConfigError(f"unsupported compressed-tensors weights: {bits}-bit {typ}")
                return Quantization(fmt, base, exclude, method="compressed-tensors")
            raise ModelConfigError("compressed-tensors quantization_config without config_groups weights")
        if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "auto_round"):
            bits = qc.get("bits") or qc.get("w_bit") or 4
            g = qc.get("group_size") or qc.get("q_group_size") or 128
            fmt = _fmt("int4", group=g if isinstance(g, int) and g > 0 else 128) if bits == 4 else _fmt("int8")
            return Quantization(fmt, base, exclude, method=method)
        if method in ("bitsandbytes",):
            raise ModelConfigError("bitsandbytes quantization is not modelled by the floor")
        if method:
            f = _algo_format(method, group)
            if f:
                return Quantization(f, base, exclude, method=method)
            raise ModelConfigError(f"unsupported quant_method {method!r} in quantization_config")
    sq = (server_quant or "").lower()
    if sq and sq not in ("none", "null"):
        f = _algo_format(sq.replace("modelopt_fp4", "nvfp4").replace("w8a8_fp8", "fp8").replace("w8a8_int8", "int8"),
                         None)
        if f is None:
            raise ModelConfigError(f"unsupported server quantization {server_quant!r}")
        return Quantization(f, base, method=f"server --quantization {server_quant}")
    return Quantization(base, base, method="none")


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
        return self.n_experts > 0 and self.top_k > 0

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


def parse_model(cfg: dict, *, server_quant: Optional[str] = None, server_dtype: Optional[str] = None,
                source: str = "config.json") -> ModelShape:
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
    dtype = str(server_dtype if server_dtype and server_dtype != "auto" else
                (c.get("torch_dtype") or c.get("dtype") or "bfloat16")).replace("torch.", "")
    kv_lora = _int(c, "kv_lora_rank")
    rope = _int(c, "qk_rope_head_dim")
    kv_dim = _int(c, "kv_cache_dim")
    mla = bool(kv_lora) or (kv_dim is not None and "mla" in str(c.get("architectures") or "").lower())
    shape = ModelShape(model_type=model_type, attention="mla" if mla else "gqa", layers=layers, hidden=hidden,
                       heads=heads, dtype=dtype, source=source)
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
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError(f"{path}: cannot read the model config ({e.strerror or e})") from None
    except ValueError as e:
        raise InputError(f"{path}: the model config is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: the model config must be a JSON object (a Hugging Face config.json)")
    return data


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
    return {p + "q_proj": (h * nh * hd, True), p + "k_proj": (h * (shape.kv_heads or nh) * hd, True),
            p + "v_proj": (h * (shape.kv_heads or nh) * hd, True), p + "o_proj": (nh * hd * h, True)}


_MLP_PROJ = ("gate_proj", "up_proj", "down_proj")


def weight_read(shape: ModelShape, par: Parallel, tokens: int) -> WeightRead:
    """The weights one rank reads in a decode step of ``tokens`` tokens (batch x tokens per request)."""
    q = shape.quant or Quantization(_fmt("bf16"), _fmt("bf16"))
    parts = {"attention": 0.0, "dense_mlp": 0.0, "shared_experts": 0.0, "routed_experts": 0.0, "router": 0.0,
             "lm_head": 0.0}
    params = dict(parts)
    h = shape.hidden or 0
    lm = 0.0
    if shape.vocab and h:
        lm_params = shape.vocab * h / par.tp  # vocabulary-parallel lm_head
        lm = lm_params * q.unquantized.bytes_per_param
        params["lm_head"] = lm_params
    if shape.weight_bytes_per_layer is not None or shape.weight_bytes is not None:
        total = shape.weight_bytes if shape.weight_bytes is not None else shape.weight_bytes_per_layer * shape.layers
        parts["layers"] = total / par.tp
        params["layers"] = parts["layers"] / q.default.bytes_per_param
        parts["lm_head"] = lm
        return WeightRead({k: v for k, v in parts.items() if v}, {k: v for k, v in params.items() if v},
                          q.default.gemm_dtype, explicit=True)
    touched = None
    kvh = shape.kv_heads or 1
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
                n = h * (shape.intermediate or 0) / par.tp
                parts["dense_mlp"] += n * q.format_of(mlp + proj).bytes_per_param
                params["dense_mlp"] += n
    parts["lm_head"] = lm
    return WeightRead({k: v for k, v in parts.items() if v}, {k: v for k, v in params.items() if v},
                      q.default.gemm_dtype, experts_touched_per_rank=touched)


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
