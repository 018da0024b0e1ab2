"""The floor: what a decode step should cost on this GPU, and how far each bucket is above it.

A decode step must at least

- read the weights its tokens use (per rank: the model's config and weight format, MoE experts
  the batch routes to, see :mod:`perfscope.analysis.model_config`): the ``gemm`` floor,
- read the KV cache it attends (batch x context x bytes per token per layer x layers; MLA: the
  576-element latent, FP8 576 B or BF16 1152 B; GQA: 2 x KV heads x head_dim x dtype): the
  ``attention`` floor,
- all-reduce its activations when tensor-parallel (2 per layer of tokens x hidden x 2 B, ring
  algorithm: 2(n-1)/n of that leaves each rank, at the link's one-way bandwidth): the
  ``communication`` floor,

each at the GPU's peak bandwidth (:mod:`perfscope.analysis.gpus`), or at its peak tensor rate
where the FLOPs take longer (large batches). Copies, casts, routing, sampling, elementwise work and
GPU idle time have a floor of 0 in decode: a step needs none of them. The floor is a bandwidth
model only: kernel-launch, per-kernel ramp and collective latencies are not in it, so a well-tuned
small-batch step still lands above it.

The gap per bucket is the measured ms/step minus its floor; the bucket with the largest gap is
the one that keeps the step above its floor.
"""

from __future__ import annotations

import re
import statistics
from typing import Any, Optional

from perfscope.analysis.gpus import GPUMatch, match_gpu
from perfscope.analysis.model_config import (
    ModelConfigError,
    ModelShape,
    Parallel,
    kv_bytes_per_token_per_layer,
    kv_dtype_bytes,
    parse_model,
    weight_read,
)

FLOOR_BUCKETS = ("gemm", "attention", "communication", "copy")
_BS = re.compile(r"\bbs=(\d+)")
# vLLM's step annotations: ..._generation_<requests>(<tokens>) and, with detailed_trace_annotation,
# ..._generation_<requests>(sq<tokens>sk<KV tokens summed over the requests>...)
_VLLM_GEN = re.compile(r"_generation_(\d+)\((?:sq\d+sk(\d+))?")
# keys of a server_info (or the repro server's) that say it carries the model's shape itself
_SHAPE_KEYS = ("num_hidden_layers", "kv_lora_rank", "num_key_value_heads", "weight_bytes_per_layer")


def _pos_int(v) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and v > 0:
        return v
    if isinstance(v, float) and v.is_integer() and v > 0:
        return int(v)
    if isinstance(v, str) and v.strip().isdigit() and int(v) > 0:
        return int(v)
    return None


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _model_source(config: dict) -> tuple[Optional[dict], str]:
    mc = config.get("model_config")
    if isinstance(mc, dict) and mc:
        return mc, str(config.get("model_config_source") or "server_info model_config")
    if any(k in config for k in _SHAPE_KEYS):
        return config, "server_info"
    return None, ""


def _ms(nbytes: float, tb_s: float) -> float:
    return nbytes / (tb_s * 1e9) if tb_s > 0 else 0.0  # TB/s = 1e9 B/ms


def floor_inputs(meta: dict, config: dict, step_labels: list[str]) -> dict[str, Any]:
    """Everything the floor needs, each with where it came from; ``missing`` lists what is not known."""
    fi = _dict(config.get("floor_inputs"))
    mc, msrc = _model_source(config)
    workload = _dict((mc or {}).get("workload"))
    out: dict[str, Any] = {"missing": [], "assumed": [], "sources": {}}
    # batch: option > model-config workload > SGLang's step[DECODE bs=N] labels
    batch, bsrc = _pos_int(fi.get("batch")), "--batch"
    if batch is None and _pos_int(workload.get("batch")):
        batch, bsrc = _pos_int(workload.get("batch")), "model config workload.batch"
    if batch is None:
        bss = [int(m.group(1)) for lab in step_labels if (m := _BS.search(lab or ""))]
        if bss:
            batch, bsrc = int(statistics.median(bss)), "step labels (bs=N)"
    gens = [(int(m.group(1)), m.group(2)) for lab in step_labels if (m := _VLLM_GEN.search(lab or ""))]
    gens = [(g, sk) for g, sk in gens if g > 0]
    if batch is None and gens:
        batch, bsrc = int(statistics.median(g for g, _ in gens)), "vLLM step annotations (generation_G)"
    context, csrc = _pos_int(fi.get("context")), "--context"
    if context is None and _pos_int(workload.get("context")):
        context, csrc = _pos_int(workload.get("context")), "model config workload.context"
    per_request = [int(sk) / g for g, sk in gens if sk is not None]
    if context is None and per_request:
        context = max(1, round(statistics.median(per_request)))
        csrc = "vLLM detailed step annotations (KV tokens per generation request)"
    # a perfscope run's workload (run.json: concurrency, input_len, output_len), when the caller passes it on
    run = _dict(config.get("workload"))
    if batch is None and _pos_int(run.get("concurrency")):
        batch, bsrc = _pos_int(run.get("concurrency")), "run workload concurrency"
    input_len = _pos_int(run.get("input_len"))
    if context is None and input_len:
        context = input_len + (_pos_int(run.get("output_len")) or 0) // 2
        csrc = "run workload input_len + output_len/2"
    out["batch"], out["context"] = batch, context
    if batch:
        out["sources"]["batch"] = bsrc
    else:
        out["missing"].append("--batch (requests per decode step)")
    if context:
        out["sources"]["context"] = csrc
    else:
        out["missing"].append("--context (tokens each request attends)")
    # parallelism: server config > trace's distributedInfo > one GPU
    tp = _pos_int(config.get("tp_size"))
    if tp:
        out["sources"]["tp"] = "server config tp_size"
    elif world := _pos_int(meta.get("world_size")):
        tp = world
        out["sources"]["tp"] = "trace distributedInfo world_size"
        out["assumed"].append(f"tp_size={tp} (the trace's world size)")
    else:
        tp = 1
        out["assumed"].append("tp_size=1 (no server config, no distributedInfo in the trace)")
    ep = _pos_int(config.get("ep_size")) or 1
    dp = _pos_int(config.get("dp_size")) or 1
    out["parallel"] = Parallel(tp=tp, ep=min(ep, tp), dp_attention=dp if config.get("enable_dp_attention") else 1)
    # dtypes
    kv = config.get("kv_cache_dtype") or (mc or {}).get("kv_cache_dtype")
    if not kv:
        out["assumed"].append("kv_cache_dtype=auto (SGLang's default: the model dtype)")
        kv = "auto"
    out["kv_cache_dtype"] = str(kv)
    # the model
    out["model"] = None
    if mc is None:
        where = (
            f" of {config['model_path']}" if isinstance(config.get("model_path"), str) and config["model_path"] else ""
        )
        out["missing"].insert(
            0, f"--model-config config.json (the model's shape and weight format: the config.json{where})"
        )
    else:
        try:
            out["model"] = parse_model(
                mc, server_quant=config.get("quantization"), server_dtype=config.get("dtype"), source=msrc
            )
        except ModelConfigError as e:
            out["missing"].insert(0, f"a usable model config ({e})")
    # the GPU
    g = match_gpu(
        meta.get("device_name"), meta.get("compute_capability"), meta.get("total_mem_bytes"), meta.get("platform")
    )
    out["gpu"] = g
    if g.gpu is None:
        out["missing"].append(g.note)
    return out


def _bucket_row(floor_ms: float, measured_ms: float, **extra) -> dict:
    row = {
        "floor_ms": round(floor_ms, 4),
        "measured_ms": round(measured_ms, 4),
        "gap_ms": round(measured_ms - floor_ms, 4),
        "ratio": round(measured_ms / floor_ms, 3) if floor_ms > 0 else None,
    }
    row.update({k: v for k, v in extra.items() if v is not None})
    return row


def compute_floor(
    meta: dict,
    config: dict,
    *,
    buckets_ms: dict[str, float],
    step_ms: float,
    idle_ms: float = 0.0,
    phase: str = "decode",
    step_labels: Optional[list[str]] = None,
    moe_gemm_ms: float = 0.0,
) -> dict[str, Any]:
    """The floor section of an analysis: ``available`` and the numbers, or ``missing`` in one line.
    ``moe_gemm_ms``: the step's expert GEMMs (``moe/gemm``); when they run there, the routed experts'
    weights are the ``moe`` bucket's floor, not the ``gemm`` bucket's."""
    inp = floor_inputs(meta, config, step_labels or [])
    gm: GPUMatch = inp["gpu"]
    base: dict[str, Any] = {"available": False, "gpu": gm.to_dict(), "assumed": inp["assumed"]}
    if phase not in ("decode", "unknown"):
        base["missing"] = f"floor: modelled for decode steps; this trace's analysed steps are {phase}"
        return base
    if inp["missing"]:
        base["missing"] = "floor: needs " + "; ".join(inp["missing"])
        # what the user can add on the command line (all of it, or the floor cannot be had this way)
        flags = [m.split(" (")[0] for m in inp["missing"] if m.startswith("--")]
        base["missing_options"] = flags if len(flags) == len(inp["missing"]) else []
        return base
    shape: ModelShape = inp["model"]
    gpu = gm.gpu
    if gpu is None:  # floor_inputs lists an unmatched GPU as missing
        raise ValueError(f"no GPU model for the floor: {gm.note}")
    par: Parallel = inp["parallel"]
    batch, context = inp["batch"], inp["context"]
    tokens = batch  # one new token per request per decode step
    bw = gpu.mem_bw_tbs
    notes: list[str] = []

    # gemm: the weights the step reads
    w = weight_read(shape, par, tokens)
    w_ms = _ms(w.total, bw)
    flops = 2.0 * tokens * sum(v for k, v in w.params.items() if k != "routed_experts") + 2.0 * tokens * w.params.get(
        "routed_experts", 0.0
    )
    peak = gpu.peak_tflops(w.gemm_dtype)
    f_ms = flops / (peak * 1e9) if peak else 0.0  # TFLOP/s = 1e9 FLOP/ms
    gemm_floor = max(w_ms, f_ms)
    moe_floor = 0.0
    routed = w.parts.get("routed_experts", 0.0)
    if moe_gemm_ms > 0 and routed > 0:
        # the expert GEMMs are their own bucket: their weights and FLOPs are its floor
        r_flops = 2.0 * tokens * w.params.get("routed_experts", 0.0)
        moe_floor = max(_ms(routed, bw), r_flops / (peak * 1e9) if peak else 0.0)
        gemm_floor = max(_ms(w.total - routed, bw), (flops - r_flops) / (peak * 1e9) if peak else 0.0)

    # attention: the KV cache the batch attends
    kvb, kv_name = kv_dtype_bytes(inp["kv_cache_dtype"], shape.dtype)
    per_tok_layer = kv_bytes_per_token_per_layer(shape, kvb, par)
    ctx_sum = sum(
        min(context, shape.sliding_window)
        if (shape.sliding_layers and shape.sliding_layers[i] and shape.sliding_window)
        else context
        for i in range(shape.layers)
    )
    kv_bytes = batch * ctx_sum * per_tok_layer
    heads_rank = (shape.heads or 0) / par.attn_tp
    if shape.attention == "mla":
        attn_flops = (
            2.0 * batch * heads_rank * ctx_sum * (2 * (shape.kv_lora_rank or 512) + (shape.qk_rope_head_dim or 64))
        )
    else:
        attn_flops = 4.0 * batch * heads_rank * ctx_sum * (shape.head_dim or 0)
    attn_floor = max(_ms(kv_bytes, bw), attn_flops / (gpu.bf16_tflops * 1e9))

    # communication: TP all-reduces (2 per layer), or EP all-to-all
    comm_bytes = 0.0
    comm_ms = 0.0
    act = 2.0  # BF16 activations
    link = gpu.link_one_way_gbs  # GB/s = 1e6 B/ms
    if par.tp > 1 and shape.hidden:
        msg = tokens * shape.hidden * act
        n_attn = shape.layers if par.attn_tp > 1 else 0
        a2a = str(config.get("moe_a2a_backend") or "none").lower() not in ("none", "", "false")
        n_mlp = sum(1 for i in range(shape.layers) if not (a2a and shape.moe_layers and shape.moe_layers[i]))
        ring = 2.0 * (par.tp - 1) / par.tp
        comm_bytes = (n_attn * 2.0 * (par.attn_tp - 1) / par.attn_tp + n_mlp * ring) * msg
        if a2a and shape.is_moe and par.ep > 1:
            moe_layers = sum(shape.moe_layers)
            # dispatch (FP8) + combine (BF16) of each token's top-k copies, the remote share
            comm_bytes += moe_layers * tokens * shape.top_k * shape.hidden * (1 + 2) * (par.ep - 1) / par.ep
        comm_ms = comm_bytes / (link * 1e6) if link else 0.0
        if par.dp_attention > 1:
            notes.append("DP attention's gathers/scatters are not modelled")
    floors = {"gemm": gemm_floor, "attention": attn_floor, "communication": comm_ms, "copy": 0.0}
    if moe_floor:
        floors["moe"] = moe_floor
    floor_ms = sum(floors.values())

    # the gap, per bucket (every measured bucket; those with no floor row have floor 0)
    rows: dict[str, dict] = {}
    rows["gemm"] = _bucket_row(
        gemm_floor, buckets_ms.get("gemm", 0.0), bytes=int(w.total), bound="compute" if f_ms > w_ms else "memory"
    )
    rows["attention"] = _bucket_row(
        attn_floor,
        buckets_ms.get("attention", 0.0),
        bytes=int(kv_bytes),
        bound="compute" if attn_floor > _ms(kv_bytes, bw) else "memory",
    )
    rows["communication"] = _bucket_row(comm_ms, buckets_ms.get("communication", 0.0), bytes=int(comm_bytes))
    rows["copy"] = _bucket_row(0.0, buckets_ms.get("copy", 0.0))
    if moe_floor:
        rows["gemm"]["bytes"] = int(w.total - routed)
        rows["moe"] = _bucket_row(moe_floor, buckets_ms.get("moe", 0.0), bytes=int(routed))
    for b, ms in buckets_ms.items():
        if b not in rows and ms > 0:
            rows[b] = _bucket_row(0.0, ms)
    if idle_ms and idle_ms > 0:
        rows["idle"] = _bucket_row(0.0, idle_ms)
    worst = max(rows, key=lambda b: rows[b]["gap_ms"])
    below = [
        b for b in floors if floors[b] > 0 and rows[b]["measured_ms"] > 0 and rows[b]["measured_ms"] < 0.9 * floors[b]
    ]
    if below:
        notes.append(
            "measured below the floor in "
            + ", ".join(below)
            + ": the model config, batch or context does not match the traced run"
        )
    if shape.is_moe and w.experts_touched_per_rank is not None:
        notes.append(
            f"routed experts read: {w.experts_touched_per_rank:.1f} per MoE layer per rank, expected "
            f"for {tokens} token(s) under uniform routing"
        )
    notes.append("bandwidth model: launch, per-kernel ramp and collective latencies are not in the floor")
    mbu = (w.total + kv_bytes) / (step_ms * bw * 1e9) if step_ms > 0 else None
    return {
        "available": True,
        "floor_ms": round(floor_ms, 4),
        "measured_ms": round(step_ms, 4),
        "gap_ms": round(step_ms - floor_ms, 4),
        "ratio": round(step_ms / floor_ms, 3) if floor_ms > 0 else None,
        "worst_bucket": worst,
        "worst_gap_ms": rows[worst]["gap_ms"],
        "memory_bandwidth_utilisation": round(mbu, 4) if mbu is not None else None,
        "buckets": rows,
        "bytes_per_step": {"weights": int(w.total), "kv": int(kv_bytes), "communication": int(comm_bytes)},
        "weights": {k: int(v) for k, v in w.parts.items()},
        "inputs": {
            "batch": batch,
            "context": context,
            "tp_size": par.tp,
            "ep_size": par.ep,
            "attn_tp_size": par.attn_tp,
            "layers": shape.layers,
            "attention": shape.attention,
            "kv_cache_dtype": kv_name,
            "kv_bytes_per_token_per_layer": round(per_tok_layer, 3),
            "weight_format": (shape.quant.summary() if shape.quant else None),
            "weight_bytes_explicit": w.explicit,
            "model_type": shape.model_type,
            "model_source": shape.source,
            "gemm_peak_tflops": peak,
            "gemm_dtype": w.gemm_dtype,
            "sources": inp["sources"],
        },
        "gpu": gm.to_dict(),
        "assumed": inp["assumed"],
        "notes": notes,
    }


def annotate_findings(findings: list, floor: dict) -> None:
    """Put the floor beside each finding's predicted step time (the prediction itself is the rule's)."""
    if not floor.get("available"):
        return
    fl = floor["floor_ms"]
    for f in findings:
        pred = getattr(f, "predicted_step_ms_after_fix", None)
        if pred is None or not isinstance(getattr(f, "evidence", None), dict):
            continue
        f.evidence["floor_step_ms"] = fl
        f.evidence["predicted_over_floor"] = round(pred / fl, 3) if fl > 0 else None


def with_floor_inputs(
    config: dict, model_config: Optional[Any] = None, batch: Optional[int] = None, context: Optional[int] = None
) -> dict:
    """The server config with the floor's options added (``--model-config`` wins over the server's)."""
    from perfscope.analysis.model_config import load_model_config
    from perfscope.errors import InputError

    cfg = dict(config or {})
    if model_config is not None:
        cfg["model_config"] = load_model_config(model_config)
        cfg["model_config_source"] = str(model_config)
    fi = dict(cfg.get("floor_inputs") or {})
    for name, v in (("batch", batch), ("context", context)):
        if v is not None:
            if v < 1:
                raise InputError(f"--{name} must be a positive number (got {v})")
            fi[name] = v
    if fi:
        cfg["floor_inputs"] = fi
    return cfg
