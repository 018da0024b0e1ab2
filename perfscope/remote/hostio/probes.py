"""What the host says about its server: the versions its interpreter reports, nvidia-smi's GPUs, the
process listening on the server's port."""

from __future__ import annotations

import re

# The python program that reports versions; run with the server's interpreter.
VERSIONS_PY = r"""
import json, sys, platform
out = {"python": platform.python_version(), "executable": sys.executable}
try:
    from importlib.metadata import version, PackageNotFoundError
except Exception:
    version = None
for key, dists in (("sglang", ["sglang"]), ("vllm", ["vllm"]),
                   ("flashinfer", ["flashinfer-python", "flashinfer"]), ("torch", ["torch"]),
                   ("transformers", ["transformers"]), ("sgl_kernel", ["sgl-kernel"]),
                   ("triton", ["triton", "pytorch-triton"])):
    for d in dists:
        try:
            out[key] = version(d)
            break
        except Exception:
            pass
# torch's CUDA / HIP versions read from its version.py, not by importing torch (an import holds
# hundreds of MB, 0.7 GB with SGLang's torch, for two strings)
try:
    import ast, importlib.util, os, re
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
            text = f.read(1 << 16)
        for key in ("cuda", "hip"):
            m = re.search(r"^" + key + r"\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.M)
            out[key] = ast.literal_eval(m.group(1)) if m else None
except Exception:
    pass
print(json.dumps(out))
"""

NVSMI_FIELDS = [
    ("index", "index", int),
    ("name", "name", str),
    ("uuid", "uuid", str),
    ("driver_version", "driver_version", str),
    ("memory.total", "memory_total_mib", float),
    ("clocks.sm", "clocks_sm_mhz", float),
    ("clocks.mem", "clocks_mem_mhz", float),
    ("clocks.max.sm", "clocks_max_sm_mhz", float),
    ("clocks.max.mem", "clocks_max_mem_mhz", float),
    ("power.limit", "power_limit_w", float),
    ("temperature.gpu", "temperature_c", float),
    ("utilization.gpu", "utilization_pct", float),
]


def parse_nvidia_smi(text: str) -> list[dict]:
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(NVSMI_FIELDS):
            continue
        g: dict = {}
        for (_, key, typ), val in zip(NVSMI_FIELDS, parts):
            if val in ("", "[N/A]", "N/A", "[Not Supported]"):
                g[key] = None
                continue
            try:
                g[key] = typ(val)
            except ValueError:
                g[key] = val
        gpus.append(g)
    return gpus


def listen_pid(ss_out: str, port: int) -> int | None:
    """The pid of the process listening on ``port`` from ``ss -ltnpH`` output."""
    for line in ss_out.splitlines():
        cols = line.split()
        if len(cols) < 4 or not re.search(rf"[:\]]{port}$", cols[3]):
            continue
        m = re.search(r"pid=(\d+)", line)
        if m:
            return int(m.group(1))
    return None
