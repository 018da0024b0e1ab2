"""Achieved bandwidth and FLOP rate of the dominant ops, against the GPU's peaks, tied to the step.

For each top op whose recorded shapes (eager traces with ``record_shapes``, or a graph-capture
map) or launch geometry give its bytes and FLOPs:

- GEMMs (``aten::mm`` / ``addmm`` / ``bmm`` / ``linear`` / ``matmul``): FLOPs = 2·M·K·N (x batch),
  bytes = the inputs read once + the output written once;
- copies and casts (``aten::copy_`` / ``_to_copy``): elements x (source + destination dtype size);
  a graph-replayed torch copy kernel (no shapes): grid x block x elements per thread, 1 B read +
  2 B written (the FP8 -> BF16 KV cast, the only one sized that way);
- pointwise torch ops (``aten::add``, ``mul``, ...) and index writes: their tensors read + the first
  one written.

Each op gets achieved TB/s and TFLOP/s, their fraction of the GPU's peak (perfscope.analysis.gpus),
which one binds it (the larger of bytes/peak-bandwidth and FLOPs/peak-rate: its floor), how many
times its floor it takes, and the ms per step it spends above its floor: the part of the step's
gap above the floor model that this op owns.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from perfscope.analysis.gpus import match_gpu

_DTYPE_BYTES = {
    "float": 4,
    "c10::Float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
}
_GEMM_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "aten::_scaled_mm",
)
_COPY_OPS = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous")
_POINTWISE = re.compile(
    r"^aten::(add|sub|mul|div|add_|sub_|mul_|div_|silu|gelu|relu|sigmoid|tanh|neg|exp|"
    r"rsqrt|pow|where|masked_fill_?|index_put_|_index_put_impl_|index_copy_|fill_|zero_)$"
)
_HELPER = re.compile(r"splitKreduce|splitK_reduce|reduce_kernel|epilogue", re.I)
_EPT = re.compile(r"elementwise_kernel(?:_manual_unroll)?<\d+, (\d+)")


def _size(t) -> Optional[int]:
    return _DTYPE_BYTES.get(t) if isinstance(t, str) else None


def _numel(d) -> Optional[int]:
    if isinstance(d, list) and all(isinstance(x, int) for x in d):
        return math.prod(d) if d else 1
    return None


def _tensors(types, dims) -> list[tuple[int, int, list]]:
    """(elements, bytes per element, dims) of the tensor arguments with a known dtype."""
    out = []
    for t, d in zip(types or [], dims or []):
        n, b = _numel(d), _size(t)
        if n is not None and b is not None and isinstance(d, list) and d:
            out.append((n, b, d))
    return out


def op_work(op: dict) -> Optional[dict]:
    """{bytes, flops, dtype, how} of one instance of a top op (``Op.to_dict()``), or None."""
    chain = op.get("op_chain") or []
    name = chain[-1] if chain else None
    types, dims = op.get("input_types"), op.get("input_dims")
    ts = _tensors(types, dims)
    if name in _GEMM_OPS and len(ts) >= 2:
        a, b = (ts[1], ts[2]) if name in ("aten::addmm", "aten::baddbmm") and len(ts) >= 3 else (ts[0], ts[1])
        da, db = a[2], b[2]
        if len(da) < 2 or len(db) < 2:
            return None
        if name == "aten::linear":  # x [.., K], weight [N, K]
            k, n = da[-1], db[0]
            m = math.prod(da[:-1])
            batch = 1
        else:  # [.., M, K] x [.., K, N]
            m, k, n = da[-2], da[-1], db[-1]
            batch = math.prod(da[:-2]) if len(da) > 2 else 1
        if k != (db[-1] if name == "aten::linear" else db[-2]):
            return None
        elem = a[1]
        flops = 2.0 * batch * m * k * n
        nbytes = a[0] * a[1] + b[0] * b[1] + batch * m * n * elem
        return {
            "bytes": nbytes,
            "flops": flops,
            "dtype": "fp8" if elem == 1 else "bf16",
            "how": f"GEMM {batch}x{m}x{k}x{n} from recorded shapes"
            if batch > 1
            else f"GEMM {m}x{k}x{n} from recorded shapes",
        }
    if name in _COPY_OPS and ts:
        if name == "aten::copy_" and len(ts) >= 2:
            dst, src = ts[0], ts[1]
            return {
                "bytes": src[0] * src[1] + dst[0] * dst[1],
                "flops": 0.0,
                "dtype": None,
                "how": "copy: source read + destination written (recorded shapes)",
            }
        return {
            "bytes": ts[0][0] * ts[0][1] * 2,
            "flops": 0.0,
            "dtype": None,
            "how": "copy: input read + a same-size output written (recorded shapes)",
        }
    if name in ("aten::index_put_", "aten::_index_put_impl_", "aten::index_copy_") and ts:
        v = ts[-1] if name != "aten::index_copy_" else ts[-1]  # the values written (not the whole target)
        return {
            "bytes": 2 * v[0] * v[1],
            "flops": 0.0,
            "dtype": None,
            "how": "index write: the values read + written at their places (recorded shapes)",
        }
    if name and _POINTWISE.match(name) and ts:
        nbytes = sum(n * b for n, b, _ in ts) + ts[0][0] * ts[0][1]
        return {
            "bytes": nbytes,
            "flops": float(ts[0][0]),
            "dtype": None,
            "how": "pointwise: tensors read + the first one's size written (recorded shapes)",
        }
    if (
        not chain
        and op.get("sub") == "cast"
        and "direct_copy_kernel" in (op.get("name") or "")
        and op.get("grid")
        and op.get("block")
    ):
        m = _EPT.search(op["name"])
        el = math.prod(op["grid"]) * math.prod(op["block"]) * (int(m.group(1)) if m else 4)
        if "Float8" in op["name"] or "LoadWithCast" in op["name"]:
            return {
                "bytes": el * 3,
                "flops": 0.0,
                "dtype": None,
                "how": "cast from launch geometry (grid x block x elements per thread; 1 B read + 2 B written)",
            }
    return None


def roofline(ops: list[dict], meta: dict, step_ms: float, floor_ms: Optional[float] = None, limit: int = 12) -> dict:
    """Per top op: achieved TB/s and TFLOP/s, fraction of peak, its floor and the time above it."""
    g = match_gpu(
        meta.get("device_name"), meta.get("compute_capability"), meta.get("total_mem_bytes"), meta.get("platform")
    ).gpu
    if g is None:
        return {"available": False, "missing": "roofline: GPU not in the table (perfscope.analysis.gpus)"}
    rows = []
    above = 0.0
    for o in ops[:limit]:
        if _HELPER.search(o.get("name") or ""):
            continue  # a split-K reduction shares its GEMM's op: the GEMM kernel carries the op's work
        w = op_work(o)
        if w is None or not o.get("avg_us"):
            continue
        us = o["avg_us"]
        tbs = w["bytes"] / (us * 1e-6) / 1e12
        tflops = w["flops"] / (us * 1e-6) / 1e12 if w["flops"] else 0.0
        peak_tf = g.peak_tflops(w["dtype"] or "bf16")
        t_mem = w["bytes"] / (g.mem_bw_tbs * 1e12) * 1e6
        t_cmp = w["flops"] / (peak_tf * 1e12) * 1e6 if w["flops"] else 0.0
        floor_us = max(t_mem, t_cmp)
        bound = "memory" if t_mem >= t_cmp else "compute"
        if tbs > 1.05 * g.mem_bw_tbs or (w["flops"] and tflops > 1.05 * peak_tf):
            continue  # the op's work is not this kernel's alone (several kernels per op): no figure
        over = (us - floor_us) * o.get("count_per_step", 0) / 1e3
        above += max(over, 0.0)
        rows.append(
            {
                "name": o.get("short") or o.get("name"),
                "bucket": o.get("bucket"),
                "avg_us": round(us, 3),
                "count_per_step": o.get("count_per_step"),
                "ms_per_step": o.get("ms_per_step"),
                "bytes": int(w["bytes"]),
                "flops": int(w["flops"]),
                "how": w["how"],
                "achieved_tb_s": round(tbs, 3),
                "achieved_tflops": round(tflops, 2),
                "bw_fraction_of_peak": round(tbs / g.mem_bw_tbs, 4),
                "flops_fraction_of_peak": round(tflops / peak_tf, 4) if w["flops"] else None,
                "bound_by": bound,
                "floor_us": round(floor_us, 3),
                "times_its_floor": round(us / floor_us, 2) if floor_us > 0 else None,
                "ms_per_step_above_floor": round(max(over, 0.0), 4),
            }
        )
    if not rows:
        return {
            "available": False,
            "missing": "roofline: no top op with recorded shapes or sizing launch geometry "
            "(profile with record_shapes)",
        }
    out = {
        "available": True,
        "gpu": g.name,
        "peak_tb_s": g.mem_bw_tbs,
        "peak_bf16_tflops": g.bf16_tflops,
        "ops": rows,
        "ms_per_step_above_op_floors": round(above, 4),
        "share_of_step_above_op_floors": round(above / step_ms, 4) if step_ms else None,
    }
    if floor_ms:
        gap = max(step_ms - floor_ms, 0.0)
        out["step_gap_above_floor_ms"] = round(gap, 4)
        out["share_of_gap_these_ops_explain"] = round(min(above / gap, 1.0), 4) if gap > 0 else None
    return out
