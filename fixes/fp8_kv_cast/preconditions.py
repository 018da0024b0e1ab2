"""Preconditions: whether the fix applies to this server at all (FP8 KV pool, attention backend), and
which strategy it can use (native needs SM90, FlashInfer >= 0.6.14, e4m3 KV, a BF16 model; pages
runs anywhere)."""

from __future__ import annotations

from typing import Optional

from perfscope.fixengine.model import Detection, Environment, StrategyChoice, TargetSpec, parse_version

from .targets import REPRO

FP8_KV = ("fp8_e4m3", "fp8_e5m2", "fp8")
NATIVE_MIN_FLASHINFER = (0, 6, 14, -1)
NATIVE_FA2_MIN_FLASHINFER = (0, 6, 18, -1)


def applicable(env: Environment, target: TargetSpec) -> Optional[str]:
    kv = (env.kv_cache_dtype or "").lower()
    if kv and kv not in FP8_KV:
        return f"kv_cache_dtype is {env.kv_cache_dtype!r}: the KV pool is not FP8, so there is no cast to remove"
    backend = (env.decode_attention_backend or env.attention_backend or "").lower()
    if backend and target.backends and backend not in target.backends and target is not REPRO:
        if backend in ("flashinfer", "fa3"):
            return None  # the caller picked the other target on purpose
        return f"attention backend is {backend!r}: only 'flashinfer' (FlashInfer MLA) and 'fa3' convert the whole pool"
    return None


def choose_strategy(target: TargetSpec, det: Detection, env: Environment, requested: str = "auto") -> StrategyChoice:
    rejected = {}
    why_not_native = _native_blockers(target, env)
    if why_not_native:
        rejected["native"] = "; ".join(why_not_native)
    if requested == "native":
        if "native" in rejected:
            return StrategyChoice(None, f"--strategy native cannot work here: {rejected['native']}", rejected)
        return StrategyChoice("native", "requested; " + _native_reason(target, env), rejected)
    if requested == "pages":
        return StrategyChoice("pages", "requested: converts only the KV rows the batch reads (any GPU)", rejected)
    if "native" not in rejected:
        return StrategyChoice("native", _native_reason(target, env), rejected)
    return StrategyChoice(
        "pages",
        "converts only the KV rows the batch reads, on any GPU and FlashInfer, CUDA graphs included "
        f"(native not chosen: {rejected['native']})",
        rejected,
    )


def _native_reason(target: TargetSpec, env: Environment) -> str:
    how = (
        "the MLA kernel reads the FP8 pool itself (plan kv_data_type = FP8, run with ckv_scale = "
        "kpe_scale = 1.0); no conversion at all"
    )
    if target is REPRO and env.sm is None:
        return (
            "no GPU here: the reproduction server's attention reads the FP8 pool directly and "
            "upcasts only the rows it attends to"
        )
    return f"SM{env.compute_cap} with FlashInfer {env.flashinfer_version or 'unknown'}: {how}"


def _native_blockers(target: TargetSpec, env: Environment) -> list[str]:
    out = []
    if "native" not in target.strategies:
        return [
            f"{target.name} has no FP8-reading kernel to hand the pool to (FA3's MLA path needs BF16 KV "
            "with a BF16 query)"
        ]
    if target is REPRO:
        if env.compute_cap and env.sm != (9, 0) and env.compute_cap != "cpu":
            out.append(f"GPU is SM{env.compute_cap}")
        return out
    sm = env.sm
    if sm is None:
        out.append("GPU compute capability unknown (no nvidia-smi answer; pass --gpu-cc)")
    elif sm[0] != 9:
        out.append(
            f"GPU is SM{env.compute_cap}: FlashInfer's MLA kernels read FP8 KV with a BF16 query "
            "only on SM90 (SM100 trtllm-gen wants equal dtypes; SM120 has none)"
        )
    fi = parse_version(env.flashinfer_version)
    if not fi:
        out.append("FlashInfer version unknown")
    elif fi < NATIVE_MIN_FLASHINFER:
        out.append(
            f"FlashInfer {env.flashinfer_version} < 0.6.14 has no BF16-query/FP8-KV MLA kernel ('DType must be 16bit')"
        )
    kv = (env.kv_cache_dtype or "").lower()
    if kv == "fp8_e5m2":
        out.append("kv_cache_dtype fp8_e5m2: FlashInfer's FP8 MLA path reads e4m3 only")
    if env.dtype and env.dtype.lower() not in ("bfloat16", "bf16", "auto"):
        out.append(f"model dtype {env.dtype}: the FP8 MLA path needs a BF16 query")
    return out
