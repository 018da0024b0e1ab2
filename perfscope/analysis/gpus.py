"""What each GPU can move and compute: the denominators of the floor model.

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

A trace names its GPU in ``deviceProperties.name``; :func:`match_gpu` finds the row by name, then
(ROCm traces may carry an empty name) by platform, compute capability and memory size.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional

NVIDIA_H100 = ("NVIDIA H100 Tensor Core GPU datasheet", "https://www.nvidia.com/en-us/data-center/h100/")
NVIDIA_H200 = ("NVIDIA H200 Tensor Core GPU datasheet", "https://www.nvidia.com/en-us/data-center/h200/")
NVIDIA_HGX_B200 = ("NVIDIA DGX B200 / HGX B200 datasheet", "https://www.nvidia.com/en-us/data-center/hgx/")
NVIDIA_GB200 = ("NVIDIA GB200 NVL72 datasheet", "https://www.nvidia.com/en-us/data-center/gb200-nvl72/")
NVIDIA_RTX_PRO_6000 = ("NVIDIA RTX PRO 6000 Blackwell Server Edition / Workstation Edition datasheet",
                       "https://www.nvidia.com/en-us/data-center/rtx-pro-6000-blackwell-server-edition/")
NVIDIA_A100 = ("NVIDIA A100 Tensor Core GPU datasheet",
               "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
               "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
NVIDIA_L40S = ("NVIDIA L40S GPU datasheet", "https://www.nvidia.com/en-us/data-center/l40s/")
NVIDIA_L4 = ("NVIDIA L4 Tensor Core GPU datasheet", "https://www.nvidia.com/en-us/data-center/l4/")
NVIDIA_V100 = ("NVIDIA Tesla V100 GPU datasheet",
               "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")
AMD_MI300X = ("AMD Instinct MI300X accelerator data sheet",
              "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html")
AMD_MI325X = ("AMD Instinct MI325X accelerator data sheet",
              "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html")
AMD_MI355X = ("AMD Instinct MI355X accelerator data sheet",
              "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html")
AMD_MI250X = ("AMD Instinct MI250X / MI210 accelerator data sheets",
              "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html")

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


def _g(key, name, vendor, arch, cc, mem_gb, bw, link_gbs, link, bf16, fp8, fp4, patterns, src, notes=""):
    return GPU(key, name, vendor, arch, cc, mem_gb, bw, link_gbs, link, bf16, fp8, fp4, tuple(patterns),
               src[0], src[1], notes)


# Order matters for name matching: the more specific pattern first (H200 NVL before H200).
GPUS: tuple[GPU, ...] = (
    # ---- NVIDIA Hopper
    _g("h200-nvl", "NVIDIA H200 NVL", "nvidia", "hopper", "9.0", 141, 4.8, 900, "NVLink bridge (2/4-way)",
       835.5, 1671, None, [r"H200\s*NVL"], NVIDIA_H200,
       SPARSE_HALVED + " (1,671 / 3,341 TFLOPS BF16 / FP8)"),
    _g("h200", "NVIDIA H200 SXM", "nvidia", "hopper", "9.0", 141, 4.8, 900, "NVLink 4",
       989.5, 1979, None, [r"\bH200\b"], NVIDIA_H200,
       SPARSE_HALVED + " (1,979 / 3,958 TFLOPS BF16 / FP8)"),
    _g("h100-nvl", "NVIDIA H100 NVL", "nvidia", "hopper", "9.0", 94, 3.9, 600, "NVLink bridge",
       835.5, 1670.5, None, [r"H100\s*NVL"], NVIDIA_H100,
       SPARSE_HALVED + " (1,671 / 3,341 TFLOPS BF16 / FP8)"),
    _g("h100-pcie", "NVIDIA H100 PCIe", "nvidia", "hopper", "9.0", 80, 2.0, 600, "NVLink bridge (2-way)",
       756.5, 1513, None, [r"H100\s*PCIe"], NVIDIA_H100,
       SPARSE_HALVED + " (1,513 / 3,026 TFLOPS BF16 / FP8)"),
    _g("h100-sxm", "NVIDIA H100 SXM", "nvidia", "hopper", "9.0", 80, 3.35, 900, "NVLink 4",
       989.5, 1979, None, [r"H100\s*(SXM|80GB\s*HBM3)", r"\bH100\b"], NVIDIA_H100,
       SPARSE_HALVED + " (1,979 / 3,958 TFLOPS BF16 / FP8); torch names it 'NVIDIA H100 80GB HBM3'"),
    # ---- NVIDIA Blackwell
    _g("gb200", "NVIDIA GB200 (one Blackwell GPU of a GB200 superchip)", "nvidia", "blackwell", "10.0", 186, 8.0,
       1800, "NVLink 5", 2500, 5000, 10000, [r"GB200"], NVIDIA_GB200,
       "per-superchip figures (2 GPUs: 372 GB, 16 TB/s, 10 / 20 / 40 PFLOPS BF16 / FP8 / FP4 sparse) "
       "halved per GPU, then " + SPARSE_HALVED),
    _g("b200", "NVIDIA B200 (HGX/DGX B200)", "nvidia", "blackwell", "10.0", 180, 8.0, 1800, "NVLink 5",
       2250, 4500, 9000, [r"\bB200\b"], NVIDIA_HGX_B200,
       "8-GPU figures (1,440 GB, 64 TB/s; 36 / 72 / 144 PFLOPS BF16 / FP8 / FP4 sparse) divided by 8, then "
       + SPARSE_HALVED + "; the HGX B200 page lists 7.7 TB/s per GPU (8.0 kept: a floor takes the higher)"),
    _g("rtx-pro-6000-maxq", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "nvidia", "blackwell",
       "12.0", 96, 1.792, 128, "PCIe Gen5 x16 (no NVLink)", 439, 878, 1755,
       [r"RTX\s*PRO\s*6000.*Max-?Q"], NVIDIA_RTX_PRO_6000,
       "3,511 AI TOPS (FP4, sparse) on the datasheet; FP4 dense = half, FP8 and BF16 derived at 1/2 and 1/4 of "
       "FP4 dense (Blackwell tensor-core ratios)"),
    _g("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell (Server / Workstation Edition)", "nvidia", "blackwell",
       "12.0", 96, 1.792, 128, "PCIe Gen5 x16 (no NVLink)", 500, 1000, 2000,
       [r"RTX\s*PRO\s*6000"], NVIDIA_RTX_PRO_6000,
       "4,000 AI TOPS (FP4, sparse) on the datasheet; FP4 dense = half, FP8 and BF16 derived at 1/2 and 1/4 of "
       "FP4 dense (Blackwell tensor-core ratios); 1,792 GB/s GDDR7"),
    # ---- NVIDIA Ampere / Ada / Volta
    _g("a100-80-pcie", "NVIDIA A100 80GB PCIe", "nvidia", "ampere", "8.0", 80, 1.935, 600, "NVLink bridge (2-way)",
       312, None, None, [r"A100[- ]80GB[- ]PCIe", r"A100[- ]PCIE[- ]80GB"], NVIDIA_A100, "no FP8 tensor cores"),
    _g("a100-80-sxm", "NVIDIA A100 80GB SXM", "nvidia", "ampere", "8.0", 80, 2.039, 600, "NVLink 3",
       312, None, None, [r"A100[- ]SXM4?[- ]80GB", r"A100.*80GB"], NVIDIA_A100, "no FP8 tensor cores"),
    _g("a100-40-pcie", "NVIDIA A100 40GB PCIe", "nvidia", "ampere", "8.0", 40, 1.555, 600, "NVLink bridge (2-way)",
       312, None, None, [r"A100[- ]PCIE[- ]40GB", r"A100[- ]40GB[- ]PCIe"], NVIDIA_A100, "no FP8 tensor cores"),
    _g("a100-40-sxm", "NVIDIA A100 40GB SXM", "nvidia", "ampere", "8.0", 40, 1.555, 600, "NVLink 3",
       312, None, None, [r"A100"], NVIDIA_A100,
       "no FP8 tensor cores; also any other A100 name (e.g. 'A100-PG509-200') with ~40 GB"),
    _g("l40s", "NVIDIA L40S", "nvidia", "ada", "8.9", 48, 0.864, 64, "PCIe Gen4 x16 (no NVLink)",
       362, 733, None, [r"L40S"], NVIDIA_L40S, SPARSE_HALVED + " (733 / 1,466 TFLOPS BF16 / FP8)"),
    _g("l4", "NVIDIA L4", "nvidia", "ada", "8.9", 24, 0.300, 64, "PCIe Gen4 x16 (no NVLink)",
       121, 242.5, None, [r"\bL4\b"], NVIDIA_L4, SPARSE_HALVED + " (242 / 485 TFLOPS BF16 / FP8)"),
    _g("v100s-pcie", "NVIDIA V100S PCIe", "nvidia", "volta", "7.0", 32, 1.134, 32, "PCIe Gen3 x16 (no NVLink)",
       130, None, None, [r"V100S"], NVIDIA_V100, "no BF16 tensor cores: FP16 tensor peak given as bf16_tflops"),
    _g("v100-pcie", "NVIDIA V100 PCIe", "nvidia", "volta", "7.0", 32, 0.900, 32, "PCIe Gen3 x16 (no NVLink)",
       112, None, None, [r"V100[- ]PCIE"], NVIDIA_V100, "no BF16 tensor cores: FP16 tensor peak given as bf16_tflops"),
    _g("v100-sxm2", "NVIDIA V100 SXM2", "nvidia", "volta", "7.0", 32, 0.900, 300, "NVLink 2",
       125, None, None, [r"V100"], NVIDIA_V100,
       "no BF16 tensor cores: FP16 tensor peak given as bf16_tflops; 16 GB and 32 GB boards share the bandwidth"),
    # ---- AMD Instinct
    _g("mi355x", "AMD Instinct MI355X", "amd", "cdna4", "9.5", 288, 8.0, 1075.2, "Infinity Fabric (7 x 153.6 GB/s)",
       2516.6, 5033.2, 10066.3, [r"MI355"], AMD_MI355X, "dense peaks; FP4 = MXFP4"),
    _g("mi325x", "AMD Instinct MI325X", "amd", "cdna3", "9.4", 256, 6.0, 896, "Infinity Fabric (7 x 128 GB/s)",
       1307.4, 2614.9, None, [r"MI325"], AMD_MI325X, "dense peaks"),
    _g("mi300x", "AMD Instinct MI300X", "amd", "cdna3", "9.4", 192, 5.3, 896, "Infinity Fabric (7 x 128 GB/s)",
       1307.4, 2614.9, None, [r"MI300X"], AMD_MI300X, "dense peaks; also the SR-IOV 'MI300X VF'"),
    _g("mi200-gcd", "AMD Instinct MI250X / MI250 (one GCD) or MI210", "amd", "cdna2", "9.0", 64, 1.6384, 400,
       "Infinity Fabric", 181, None, None, [r"MI2[15]0"], AMD_MI250X,
       "torch sees each MI250(X) GCD as one device (64 GB, 1.6384 TB/s, half the OAM's 3.2768 TB/s); BF16 is "
       "MI210's / an MI250 GCD's 181 TFLOPS (an MI250X GCD has 191.5): the lower kept; link: half of the "
       "OAM's 8 x 100 GB/s Infinity Fabric links"),
)

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


def match_gpu(device_name: Optional[str], compute_capability: Optional[str] = None,
              total_mem_bytes: Optional[int] = None, platform: Optional[str] = None) -> GPUMatch:
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
            return GPUMatch(by_cc, "compute capability + memory", name or None,
                            f"name {name!r} not in the table" if name else "trace has no device name")
    return GPUMatch(None, "none", name or None,
                    f"GPU {name or '(unnamed)'} (cc {compute_capability or '?'}) is not in perfscope's table "
                    "(perfscope/analysis/gpus.py)")


def device_label(meta: dict) -> Optional[str]:
    """The GPU's name for a report header: the trace's own, else the table row its compute capability
    and memory match (ROCm traces often carry an empty name), marked as matched; None if neither."""
    if meta.get("device_name"):
        return str(meta["device_name"])
    m = match_gpu(None, meta.get("compute_capability"), meta.get("total_mem_bytes"), meta.get("platform"))
    return f"{m.gpu.name} (matched by compute capability and memory)" if m.gpu is not None else None
