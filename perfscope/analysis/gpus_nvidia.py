"""NVIDIA's data-center and workstation GPUs: one row each, figures from the datasheets the rows name
(conventions: :mod:`perfscope.analysis.gpu_spec`)."""

from __future__ import annotations

from perfscope.analysis.gpu_spec import GPU, SPARSE_HALVED, row

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

# Order matters for name matching: the more specific pattern first (H200 NVL before H200).
ROWS: tuple[GPU, ...] = (
    # ---- NVIDIA Hopper
    row("h200-nvl", "NVIDIA H200 NVL", "nvidia", "hopper", "9.0", 141, 4.8, 900, "NVLink bridge (2/4-way)",
        835.5, 1671, None, [r"H200\s*NVL"], NVIDIA_H200,
        SPARSE_HALVED + " (1,671 / 3,341 TFLOPS BF16 / FP8)"),
    row("h200", "NVIDIA H200 SXM", "nvidia", "hopper", "9.0", 141, 4.8, 900, "NVLink 4",
        989.5, 1979, None, [r"\bH200\b"], NVIDIA_H200,
        SPARSE_HALVED + " (1,979 / 3,958 TFLOPS BF16 / FP8)"),
    row("h100-nvl", "NVIDIA H100 NVL", "nvidia", "hopper", "9.0", 94, 3.9, 600, "NVLink bridge",
        835.5, 1670.5, None, [r"H100\s*NVL"], NVIDIA_H100,
        SPARSE_HALVED + " (1,671 / 3,341 TFLOPS BF16 / FP8)"),
    row("h100-pcie", "NVIDIA H100 PCIe", "nvidia", "hopper", "9.0", 80, 2.0, 600, "NVLink bridge (2-way)",
        756.5, 1513, None, [r"H100\s*PCIe"], NVIDIA_H100,
        SPARSE_HALVED + " (1,513 / 3,026 TFLOPS BF16 / FP8)"),
    row("h100-sxm", "NVIDIA H100 SXM", "nvidia", "hopper", "9.0", 80, 3.35, 900, "NVLink 4",
        989.5, 1979, None, [r"H100\s*(SXM|80GB\s*HBM3)", r"\bH100\b"], NVIDIA_H100,
        SPARSE_HALVED + " (1,979 / 3,958 TFLOPS BF16 / FP8); torch names it 'NVIDIA H100 80GB HBM3'"),
    # ---- NVIDIA Blackwell
    row("gb200", "NVIDIA GB200 (one Blackwell GPU of a GB200 superchip)", "nvidia", "blackwell", "10.0", 186, 8.0,
        1800, "NVLink 5", 2500, 5000, 10000, [r"GB200"], NVIDIA_GB200,
        "per-superchip figures (2 GPUs: 372 GB, 16 TB/s, 10 / 20 / 40 PFLOPS BF16 / FP8 / FP4 sparse) "
        "halved per GPU, then " + SPARSE_HALVED),
    row("b200", "NVIDIA B200 (HGX/DGX B200)", "nvidia", "blackwell", "10.0", 180, 8.0, 1800, "NVLink 5",
        2250, 4500, 9000, [r"\bB200\b"], NVIDIA_HGX_B200,
        "8-GPU figures (1,440 GB, 64 TB/s; 36 / 72 / 144 PFLOPS BF16 / FP8 / FP4 sparse) divided by 8, then "
        + SPARSE_HALVED + "; the HGX B200 page lists 7.7 TB/s per GPU (8.0 kept: a floor takes the higher)"),
    row("rtx-pro-6000-maxq", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "nvidia", "blackwell",
        "12.0", 96, 1.792, 128, "PCIe Gen5 x16 (no NVLink)", 439, 878, 1755,
        [r"RTX\s*PRO\s*6000.*Max-?Q"], NVIDIA_RTX_PRO_6000,
        "3,511 AI TOPS (FP4, sparse) on the datasheet; FP4 dense = half, FP8 and BF16 derived at 1/2 and 1/4 of "
        "FP4 dense (Blackwell tensor-core ratios)"),
    row("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell (Server / Workstation Edition)", "nvidia", "blackwell",
        "12.0", 96, 1.792, 128, "PCIe Gen5 x16 (no NVLink)", 500, 1000, 2000,
        [r"RTX\s*PRO\s*6000"], NVIDIA_RTX_PRO_6000,
        "4,000 AI TOPS (FP4, sparse) on the datasheet; FP4 dense = half, FP8 and BF16 derived at 1/2 and 1/4 of "
        "FP4 dense (Blackwell tensor-core ratios); 1,792 GB/s GDDR7"),
    # ---- NVIDIA Ampere / Ada / Volta
    row("a100-80-pcie", "NVIDIA A100 80GB PCIe", "nvidia", "ampere", "8.0", 80, 1.935, 600, "NVLink bridge (2-way)",
        312, None, None, [r"A100[- ]80GB[- ]PCIe", r"A100[- ]PCIE[- ]80GB"], NVIDIA_A100, "no FP8 tensor cores"),
    row("a100-80-sxm", "NVIDIA A100 80GB SXM", "nvidia", "ampere", "8.0", 80, 2.039, 600, "NVLink 3",
        312, None, None, [r"A100[- ]SXM4?[- ]80GB", r"A100.*80GB"], NVIDIA_A100, "no FP8 tensor cores"),
    row("a100-40-pcie", "NVIDIA A100 40GB PCIe", "nvidia", "ampere", "8.0", 40, 1.555, 600, "NVLink bridge (2-way)",
        312, None, None, [r"A100[- ]PCIE[- ]40GB", r"A100[- ]40GB[- ]PCIe"], NVIDIA_A100, "no FP8 tensor cores"),
    row("a100-40-sxm", "NVIDIA A100 40GB SXM", "nvidia", "ampere", "8.0", 40, 1.555, 600, "NVLink 3",
        312, None, None, [r"A100"], NVIDIA_A100,
        "no FP8 tensor cores; also any other A100 name (e.g. 'A100-PG509-200') with ~40 GB"),
    row("l40s", "NVIDIA L40S", "nvidia", "ada", "8.9", 48, 0.864, 64, "PCIe Gen4 x16 (no NVLink)",
        362, 733, None, [r"L40S"], NVIDIA_L40S, SPARSE_HALVED + " (733 / 1,466 TFLOPS BF16 / FP8)"),
    row("l4", "NVIDIA L4", "nvidia", "ada", "8.9", 24, 0.300, 64, "PCIe Gen4 x16 (no NVLink)",
        121, 242.5, None, [r"\bL4\b"], NVIDIA_L4, SPARSE_HALVED + " (242 / 485 TFLOPS BF16 / FP8)"),
    row("v100s-pcie", "NVIDIA V100S PCIe", "nvidia", "volta", "7.0", 32, 1.134, 32, "PCIe Gen3 x16 (no NVLink)",
        130, None, None, [r"V100S"], NVIDIA_V100, "no BF16 tensor cores: FP16 tensor peak given as bf16_tflops"),
    row("v100-pcie", "NVIDIA V100 PCIe", "nvidia", "volta", "7.0", 32, 0.900, 32, "PCIe Gen3 x16 (no NVLink)",
        112, None, None, [r"V100[- ]PCIE"], NVIDIA_V100, "no BF16 tensor cores: FP16 tensor peak given as bf16_tflops"),
    row("v100-sxm2", "NVIDIA V100 SXM2", "nvidia", "volta", "7.0", 32, 0.900, 300, "NVLink 2",
        125, None, None, [r"V100"], NVIDIA_V100,
        "no BF16 tensor cores: FP16 tensor peak given as bf16_tflops; 16 GB and 32 GB boards share the bandwidth"),
)
