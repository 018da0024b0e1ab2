"""What each GPU can move and compute: the denominators of the floor model.

The table (:data:`GPUS`) holds one row per product (:class:`~perfscope.analysis.gpu_spec.GPU`; the
conventions in :mod:`perfscope.analysis.gpu_spec`), NVIDIA's rows (:mod:`~perfscope.analysis.gpus_nvidia`)
before AMD's (:mod:`~perfscope.analysis.gpus_amd`). A trace names its GPU in ``deviceProperties.name``;
:func:`match_gpu` finds the row by name, then (ROCm traces may carry an empty name) by platform, compute
capability and memory size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from perfscope.analysis import gpus_amd, gpus_nvidia
from perfscope.analysis.gpu_spec import GPU

__all__ = ["GPU", "GPUS", "GPUMatch", "device_label", "gpu_by_key", "match_gpu"]

# Order matters for name matching: the more specific pattern first (H200 NVL before H200).
GPUS: tuple[GPU, ...] = gpus_nvidia.ROWS + gpus_amd.ROWS

_BY_KEY = {g.key: g for g in GPUS}


@dataclass
class GPUMatch:
    gpu: Optional[GPU]
    matched_by: str  # "name" | "compute capability + memory" | "none"
    device_name: Optional[str]
    note: str = ""

    def to_dict(self) -> dict:
        d = {"device_name": self.device_name, "matched_by": self.matched_by, "note": self.note or None}
        if self.gpu:
            d.update(self.gpu.to_dict())
        return d


def gpu_by_key(key: str) -> Optional[GPU]:
    return _BY_KEY.get(key)


def _mem_gb(total_mem_bytes: Optional[int]) -> Optional[float]:
    return total_mem_bytes / 1e9 if total_mem_bytes else None


def _closest_mem(cands: list[GPU], mem: Optional[float]) -> Optional[GPU]:
    if not cands:
        return None
    if mem is None:
        return cands[0] if len(cands) == 1 else None
    best = min(cands, key=lambda g: abs(g.mem_gb - mem) / g.mem_gb)
    # torch reports a little more or less than the marketing size (GiB vs GB, reserved memory)
    return best if abs(best.mem_gb - mem) / best.mem_gb <= 0.2 else None


def match_gpu(
    device_name: Optional[str],
    compute_capability: Optional[str] = None,
    total_mem_bytes: Optional[int] = None,
    platform: Optional[str] = None,
) -> GPUMatch:
    """The table row for a trace's device: by name first, then by compute capability and memory size."""
    name = (device_name or "").strip()
    mem = _mem_gb(total_mem_bytes)
    if name:
        hits = [g for g in GPUS if any(re.search(p, name, re.I) for p in g.patterns)]
        if hits:
            # A100 names do not always say the size: let the memory decide among the name's hits
            if len({g.name.split()[1] for g in hits}) == 1 and len(hits) > 1 and mem is not None:
                pick = _closest_mem(hits, mem) or hits[0]
            else:
                pick = hits[0]
            note = ""
            if compute_capability and compute_capability != pick.cc:
                note = f"trace reports compute capability {compute_capability}, the table {pick.cc}"
            return GPUMatch(pick, "name", name, note)
    if compute_capability:
        vendor = "amd" if (platform or "").lower() == "rocm" else ("nvidia" if platform else None)
        cands = [g for g in GPUS if g.cc == compute_capability and (vendor is None or g.vendor == vendor)]
        by_cc = _closest_mem(cands, mem)
        if by_cc is not None:
            return GPUMatch(
                by_cc,
                "compute capability + memory",
                name or None,
                f"name {name!r} not in the table" if name else "trace has no device name",
            )
    return GPUMatch(
        None,
        "none",
        name or None,
        f"GPU {name or '(unnamed)'} (cc {compute_capability or '?'}) is not in perfscope's table "
        "(perfscope/analysis/gpus.py)",
    )


def device_label(meta: dict) -> Optional[str]:
    """The GPU's name for a report header: the trace's own, else the table row its compute capability
    and memory match (ROCm traces often carry an empty name), marked as matched; None if neither."""
    if meta.get("device_name"):
        return str(meta["device_name"])
    m = match_gpu(None, meta.get("compute_capability"), meta.get("total_mem_bytes"), meta.get("platform"))
    return f"{m.gpu.name} (matched by compute capability and memory)" if m.gpu is not None else None
