"""Numbers and names as a person writes them, shared by the terminal, Markdown and HTML renderers:
milliseconds at one precision, bytes in MB/GB, bandwidth in GB/s, dtypes as ``fp8_e4m3 -> bf16``,
and a finding's evidence as a short list of readable items instead of ``key=value`` dumps."""

from __future__ import annotations

import re
from typing import Any, Optional

from perfscope.analysis.finding import Finding

# torch / Kineto dtype spellings -> the short names engineers use
_DTYPES = {
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fnuz": "fp8_e4m3fnuz",
    "float8_e5m2": "fp8_e5m2",
    "float8_e5m2fnuz": "fp8_e5m2fnuz",
    "bfloat16": "bf16",
    "half": "fp16",
    "float16": "fp16",
    "float": "fp32",
    "float32": "fp32",
    "double": "fp64",
    "float64": "fp64",
    "int": "int32",
    "long": "int64",
    "long int": "int64",
    "unsigned char": "uint8",
    "signed char": "int8",
    "bool": "bool",
    "int8": "int8",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "c10::complex<float>": "complex64",
}


def prediction_basis(f: Finding) -> Optional[str]:
    """What a prediction is made of, in a line: the GPU work left and the host's own time per step
    without the profiler (and where that came from). None without the step model's host side."""
    model = (f.evidence or {}).get("prediction") or {}
    host, gpu = model.get("host"), model.get("gpu_work_ms")
    if not isinstance(host, dict) or not isinstance(gpu, (int, float)):
        return None
    src = {
        "bench": "measured by the bench",
        "gpu-only": "from the GPU-only profile, unprofiled",
        "full": "from the trace, unprofiled",
    }.get(str(host.get("source")), "unprofiled")
    bound = "the host bounds it" if model.get("bound") == "host" else "the GPU bounds it"
    return f"GPU work ~{ms(gpu)} ms; the host's own work ~{ms(host.get('point'))} ms per step ({src}): {bound}"


def per_step_count(n: Optional[float]) -> str:
    """A count per step: whole numbers as such, a fraction (an op in some steps only: 0.4 per step)
    with two digits, never rounded to 0."""
    if n is None:
        return "-"
    return f"{n:.0f}" if n >= 10 or n == int(n) else f"{n:.2g}"


def saving_note(f: Finding, step_ms: Optional[float]) -> Optional[str]:
    """Why a finding's cost and its predicted saving differ, when they do (None: they agree within
    20%). A cost between steps (a share of the step cycle) comes off the cycle, not off the step;
    anything else: the step model replays the step without it, and the rest is hidden."""
    pred = f.predicted_step_ms_after_fix
    cost = f.ms_per_step
    if (
        not isinstance(pred, (int, float))
        or pred <= 0
        or not step_ms
        or not isinstance(cost, (int, float))
        or cost <= 0
    ):
        return None
    saving = step_ms - pred
    if abs(saving - cost) <= 0.2 * cost:
        return None
    ev = f.evidence or {}
    cycle, gap = ev.get("step_cycle_ms"), ev.get("gap_between_steps_ms")
    if f.share_of == "the step cycle" and isinstance(cycle, (int, float)) and isinstance(gap, (int, float)):
        return (
            f"the {ms(cost)} ms it costs is mostly between steps ({ms(gap)} ms): it comes off the step cycle "
            f"({ms(cycle)} ms -> ~{ms(cycle - cost)} ms), while the step itself saves only its "
            f"{ms(max(saving, 0.0))} ms inside"
        )
    return (
        f"the step saves {ms(max(saving, 0.0))} ms of the {ms(cost)} ms this costs: the prediction replays "
        "the step without it, and the rest is hidden behind other work"
    )


def ms_range(r: tuple[float, float]) -> str:
    """'1.02-2.79' or '6.42' (a point)."""
    return ms(r[0]) if r[0] == r[1] else f"{ms(r[0])}-{ms(r[1])}"


def dtype_name(t: Any) -> str:
    """``c10::Float8_e4m3fn`` -> ``fp8_e4m3``, ``BFloat16`` -> ``bf16``, ``float`` -> ``fp32``;
    anything else as given (without ``c10::``)."""
    s = str(t).strip()
    s = re.sub(r"^(c10::|torch\.|at::)", "", s)
    return _DTYPES.get(s.lower(), s)


def ms(x: Optional[float]) -> str:
    """Milliseconds at one precision: two decimals (one from 1000 ms on)."""
    if x is None:
        return "-"
    return f"{x:,.1f}" if abs(x) >= 1000 else f"{x:.2f}"


def pct(share: Optional[float]) -> str:
    return "-" if share is None else f"{share:.1%}" if share < 0.995 else f"{share:.0%}"


def nbytes(b: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= div:
            return f"{b / div:,.2f} {unit}"
    return f"{b:.0f} B"


def count(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}" if isinstance(x, float) else str(x)


def _label(key: str) -> str:
    return key.replace("_", " ")


# evidence keys worth their own wording; the rest are shown as "label value"
_SKIP = {"kernel", "src_dtype", "dst_dtype"}


def evidence_items(ev: dict, limit: int = 12) -> list[str]:
    """A finding's evidence as readable items: ``495,000 pool tokens``, ``0.86 GB per cast``,
    ``1,006.7 GB/s achieved``, ``fp8_e4m3 -> bf16``; None values and internal keys left out."""
    items: list[str] = []
    src, dst = ev.get("src_dtype"), ev.get("dst_dtype")
    if src and dst:
        items.append(f"{dtype_name(src)} -> {dtype_name(dst)}")
    elif dst:
        items.append(f"cast to {dtype_name(dst)}")
    elif src:
        items.append(f"from {dtype_name(src)}")
    for k, v in ev.items():
        if v is None or k in _SKIP or isinstance(v, dict):
            continue
        items.append(_item(k, v))
        if len(items) >= limit:
            break
    return items


def _unit(k: str, v: float) -> tuple[str, str]:
    """(the key without its unit, the value with its unit)."""
    if k == "bytes" or k.startswith("bytes_") or k.endswith("_bytes"):
        return re.sub(r"^bytes_?|_?bytes$", "", k), nbytes(v)
    for suffix, fmt in (
        ("_gb_s", lambda x: f"{x:,.1f} GB/s"),
        ("_tb_s", lambda x: f"{x:,.2f} TB/s"),
        ("_tbs", lambda x: f"{x:,.2f} TB/s"),
        ("_us", lambda x: f"{x:,.1f} µs"),
        ("_ms", lambda x: f"{ms(x)} ms"),
    ):
        if k.endswith(suffix):
            return k[: -len(suffix)], fmt(v)
        if suffix == "_ms" and "_ms_" in k:  # idle_ms_per_step
            return k.replace("_ms_", "_"), fmt(v)
    if k.endswith("share") or k.endswith("_fraction") or k.startswith("share"):
        return k, pct(v)
    return k, count(v)


def _item(k: str, v: Any) -> str:
    if isinstance(v, bool):
        return f"{_label(k)}: {'yes' if v else 'no'}"
    if isinstance(v, (int, float)):
        key, val = _unit(k, float(v) if isinstance(v, float) else v)
        label = _label(key)
        if label.startswith("per "):  # bytes_per_cast -> "0.86 GB per cast"
            return f"{val} {label}"
        if " per " in label and not val.endswith(("ms", "µs", "GB/s", "TB/s", "%")):  # "60 casts per step"
            return f"{val} {label}"
        return f"{label} {val}".strip()
    if isinstance(v, (list, tuple)):
        return f"{_label(k)} {list(v)}"
    return f"{_label(k)}: {dtype_name(v) if 'dtype' in k else v}"


# ROCm reports the gfx target's major/minor as the "compute capability" (MI300X: 9.4 = gfx942)
_GFX = {"9.0": "gfx90a", "9.4": "gfx942", "9.5": "gfx950", "11.0": "gfx1100", "12.0": "gfx1200"}


def gpu_arch(meta: dict) -> Optional[str]:
    """The architecture as its vendor names it: ``sm 9.0`` (NVIDIA), ``gfx942`` (AMD, from the gfx
    target ROCm reports as the compute capability, or the trace's own gcnArchName)."""
    cc = meta.get("compute_capability")
    if meta.get("platform") == "rocm":
        arch = meta.get("gcn_arch") or meta.get("gcnArchName")
        if arch:
            return str(arch).split(":")[0]
        return _GFX.get(str(cc)) if cc else None
    return f"sm {cc}" if cc else None


def graph_word(meta: dict) -> str:
    """What the platform calls a captured graph: ``HIP graph`` on ROCm, else ``CUDA graph``."""
    return "HIP graph" if meta.get("platform") == "rocm" else "CUDA graph"


def evidence_pairs(ev: dict) -> list[tuple[str, str, bool]]:
    """A finding's evidence as (label, value with its unit, is_number) rows for a table: the
    HTML report's evidence, worded as the terminal's."""
    rows: list[tuple[str, str, bool]] = []
    src, dst = ev.get("src_dtype"), ev.get("dst_dtype")
    if src or dst:
        rows.append(("cast", f"{dtype_name(src) if src else '?'} -> {dtype_name(dst) if dst else '?'}", False))
    for k, v in ev.items():
        if v is None or k in _SKIP or isinstance(v, dict):
            continue
        if isinstance(v, bool):
            rows.append((_label(k), "yes" if v else "no", False))
        elif isinstance(v, (int, float)):
            key, val = _unit(k, float(v) if isinstance(v, float) else v)
            rows.append((_label(key) or _label(k), val, True))
        elif isinstance(v, (list, tuple)):
            rows.append((_label(k), "[" + ", ".join(str(x) for x in v) + "]", True))
        else:
            s = dtype_name(v) if "dtype" in k else str(v)
            rows.append((_label(k), s if len(s) <= 160 else s[:157] + "...", False))
    return rows


def skipped_note(skipped: list) -> Optional[str]:
    """The JSON files a folder held that are not profiler traces (a tool's own output, TraceLens'
    execution_details.json), skipped: one sentence naming up to three of them, or None."""
    if not skipped:
        return None
    from pathlib import Path

    names = ", ".join(Path(x["path"]).name for x in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
    n = len(skipped)
    return (
        f"skipped {n} JSON file{'s' if n != 1 else ''} that {'is' if n == 1 else 'are'} not a profiler trace: {names}"
    )
