"""AMD's Instinct accelerators: one row each, figures from the data sheets the rows name
(conventions: :mod:`perfscope.analysis.gpu_spec`)."""

from __future__ import annotations

from perfscope.analysis.gpu_spec import GPU, row

AMD_MI300X = (
    "AMD Instinct MI300X accelerator data sheet",
    "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
)
AMD_MI325X = (
    "AMD Instinct MI325X accelerator data sheet",
    "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html",
)
AMD_MI355X = (
    "AMD Instinct MI355X accelerator data sheet",
    "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html",
)
AMD_MI250X = (
    "AMD Instinct MI250X / MI210 accelerator data sheets",
    "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
)

# after NVIDIA's rows in the table (perfscope.analysis.gpus.GPUS); order matters there for name matching
ROWS: tuple[GPU, ...] = (
    # ---- AMD Instinct
    row(
        "mi355x",
        "AMD Instinct MI355X",
        "amd",
        "cdna4",
        "9.5",
        288,
        8.0,
        1075.2,
        "Infinity Fabric (7 x 153.6 GB/s)",
        2516.6,
        5033.2,
        10066.3,
        [r"MI355"],
        AMD_MI355X,
        "dense peaks; FP4 = MXFP4",
    ),
    row(
        "mi325x",
        "AMD Instinct MI325X",
        "amd",
        "cdna3",
        "9.4",
        256,
        6.0,
        896,
        "Infinity Fabric (7 x 128 GB/s)",
        1307.4,
        2614.9,
        None,
        [r"MI325"],
        AMD_MI325X,
        "dense peaks",
    ),
    row(
        "mi300x",
        "AMD Instinct MI300X",
        "amd",
        "cdna3",
        "9.4",
        192,
        5.3,
        896,
        "Infinity Fabric (7 x 128 GB/s)",
        1307.4,
        2614.9,
        None,
        [r"MI300X"],
        AMD_MI300X,
        "dense peaks; also the SR-IOV 'MI300X VF'",
    ),
    row(
        "mi200-gcd",
        "AMD Instinct MI250X / MI250 (one GCD) or MI210",
        "amd",
        "cdna2",
        "9.0",
        64,
        1.6384,
        400,
        "Infinity Fabric",
        181,
        None,
        None,
        [r"MI2[15]0"],
        AMD_MI250X,
        "torch sees each MI250(X) GCD as one device (64 GB, 1.6384 TB/s, half the OAM's 3.2768 TB/s); BF16 is "
        "MI210's / an MI250 GCD's 181 TFLOPS (an MI250X GCD has 191.5): the lower kept; link: half of the "
        "OAM's 8 x 100 GB/s Infinity Fabric links",
    ),
)
