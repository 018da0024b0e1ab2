"""One GPU product's figures (:class:`GPU`) and the conventions every row of the table follows.

One row per product, each figure from the vendor's datasheet (``source`` names it, ``url`` points at
it). Conventions, the same for every row:

- ``mem_bw_tbs``: peak DRAM bandwidth in TB/s (10^12 B/s), as the datasheet states it.
- ``link_gbs``: peak GPU-to-GPU bandwidth per GPU in GB/s, *both directions added* (how NVIDIA
  quotes NVLink: 900 GB/s on H100 SXM is 450 GB/s each way). For boards with no GPU link it is
  the PCIe x16 figure, also both directions. A collective moves data one way at ``link_gbs / 2``.
- ``bf16_tflops`` / ``fp8_tflops`` / ``fp4_tflops``: *dense* tensor-core peaks. NVIDIA lists
  sparse peaks ("with sparsity", 2x dense); those are halved here, and ``notes`` says where.
  ``None``: no tensor-core support for that type (the GEMM then runs at the BF16/FP16 rate).
- ``cc``: CUDA compute capability as torch reports it in a trace's ``deviceProperties``
  (``computeMajor.computeMinor``); for AMD, what torch on ROCm reports (gfx942 -> 9.4,
  gfx950 -> 9.5, gfx90a -> 9.0).

The rows: :mod:`perfscope.analysis.gpus_nvidia` and :mod:`perfscope.analysis.gpus_amd`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

SPARSE_HALVED = "datasheet tensor peaks are 'with sparsity': halved here to dense"


@dataclass(frozen=True)
class GPU:
    key: str
    name: str  # product name
    vendor: str  # nvidia | amd
    arch: str
    cc: str  # compute capability as torch reports it
    mem_gb: float  # marketing GB (10^9 B)
    mem_bw_tbs: float  # peak DRAM bandwidth, TB/s
    link_gbs: float  # GPU-to-GPU, per GPU, both directions added, GB/s
    link: str  # what that link is
    bf16_tflops: float  # dense
    fp8_tflops: Optional[float]  # dense; None: no FP8 tensor cores
    fp4_tflops: Optional[float]  # dense; None: no FP4 tensor cores
    patterns: tuple[str, ...]  # regexes searched in deviceProperties.name (case-insensitive)
    source: str
    url: str
    notes: str = ""

    @property
    def link_one_way_gbs(self) -> float:
        return self.link_gbs / 2

    def peak_tflops(self, dtype: str) -> float:
        """The dense tensor peak a GEMM of weights in ``dtype`` can reach (falls back to BF16)."""
        d = dtype.lower()
        if d in ("fp4", "nvfp4", "mxfp4") and self.fp4_tflops:
            return self.fp4_tflops
        if d in ("fp4", "nvfp4", "mxfp4", "fp8") and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("patterns")
        return d


def row(key, name, vendor, arch, cc, mem_gb, bw, link_gbs, link, bf16, fp8, fp4, patterns, src, notes=""):
    return GPU(
        key, name, vendor, arch, cc, mem_gb, bw, link_gbs, link, bf16, fp8, fp4, tuple(patterns), src[0], src[1], notes
    )
