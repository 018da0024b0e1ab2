"""Weight formats and quantisation: bytes per parameter of BF16/FP16, FP8 (block or per-tensor
scales), NVFP4, MXFP4, INT4/INT8 AWQ/GPTQ, read from ``quantization_config`` (or SGLang's
``--quantization``) with the exclusion lists. Also the package's error and the dtype sizes."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Optional

from perfscope.errors import InputError

DTYPE_BYTES = {
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "half": 2.0,
    "float32": 4.0,
    "fp32": 4.0,
    "float": 4.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "float8_e4m3fn": 1.0,
    "int8": 1.0,
    "fp4": 0.5,
    "fp4_e2m1": 0.5,
}


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
            return WeightFormat(
                "fp8",
                1.0 + 4.0 / (block[0] * block[1]),
                "fp8",
                detail or f"FP8 e4m3, FP32 scale per {block[0]}x{block[1]} block",
            )
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
        d = {
            "method": self.method,
            "weights": self.default.name,
            "bytes_per_param": round(self.default.bytes_per_param, 5),
            "detail": self.default.detail,
            "unquantized": self.unquantized.name,
        }
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
        return (
            fnmatch.fnmatch(module, pat)
            or fnmatch.fnmatch(module, pat + ".*")
            or fnmatch.fnmatch(module, "*" + pat)
            or fnmatch.fnmatch(module, "*" + pat + ".*")
        )
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
        exclude = [
            x
            for x in (
                qc.get("modules_to_not_convert")
                or qc.get("exclude_modules")
                or qc.get("ignore")
                or qc.get("ignored_layers")
                or []
            )
            if isinstance(x, str)
        ]
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
            default = _algo_format(algo, group)
            if default is None and per:
                default = max(per.values(), key=lambda f: f.bytes_per_param)  # the heavier one as the default
            if default is None:
                raise ModelConfigError(f"unsupported ModelOpt quant_algo {algo!r} in quantization_config")
            return Quantization(default, base, exclude, per, method="modelopt " + algo.lower())
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
        f = _algo_format(
            sq.replace("modelopt_fp4", "nvfp4").replace("w8a8_fp8", "fp8").replace("w8a8_int8", "int8"), None
        )
        if f is None:
            raise ModelConfigError(f"unsupported server quantization {server_quant!r}")
        return Quantization(f, base, method=f"server --quantization {server_quant}")
    return Quantization(base, base, method="none")
