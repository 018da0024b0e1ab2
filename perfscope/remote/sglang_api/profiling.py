"""What perfscope asks an SGLang server's profiler to record (``/start_profile``'s fields and activities),
and the note a GPU trace leaves about the server's speed afterwards."""

from __future__ import annotations

from typing import Optional

PROFILE_FIELDS = (
    "output_dir",
    "num_steps",
    "activities",
    "with_stack",
    "record_shapes",
    "profile_by_stage",
    "profile_prefix",
    "start_step",
    "merge_profiles",
    "profile_id",
    "profile_stages",
)


def server_has_gpu(info: Optional[dict], gpus: Optional[list] = None) -> bool:
    """Whether the server runs on a GPU: its ``device`` (SGLang's server arg) says so, or
    nvidia-smi on its host listed one. A server that says ``device: cpu`` has none."""
    dev = str((info or {}).get("device") or "").lower()
    if dev:
        return dev not in ("cpu",)
    return bool(gpus)


def profile_activities(info: Optional[dict], gpus: Optional[list] = None) -> list[str]:
    """What perfscope asks the profiler to record: CPU ops always, GPU kernels where there is a GPU.
    Never ``MEM``: torch's CUDA memory history on a host without a GPU kills the whole SGLang
    server (0.5.23: ``Found no NVIDIA driver``)."""
    return ["CPU", "GPU"] if server_has_gpu(info, gpus) else ["CPU"]


# What a GPU trace leaves behind in the server's process: Kineto, the torch
# profiler's backend, finalizes CUPTI at the end of a trace only when the server's environment has
# TEARDOWN_CUPTI=1 (libkineto's cuptiTearDown_); otherwise CUPTI stays attached until the process
# ends. Measured on the pages-patched real SGLang 0.5.13 on an H200 (batch 1, host-bound,
# examples/gpu_loop/results/h200-2026-12-01-sglang/slowdown): no profile left running and no
# profiler thread using CPU, but the fastest per-request TPOT went from 1.03 ms before the first
# trace to 1.20 ms after it (70 requests), the scheduler's fastest 40-step window from 1.04 to
# 1.18 ms. perfscope cannot detach CUPTI from outside the process; it says so.
GPU_TRACE_AFTER_NOTE = (
    "a GPU trace leaves CUPTI attached to the server's process: a host-bound server can stay slower until "
    "it restarts (real SGLang on an H200, batch 1: TPOT 1.07-1.68 ms before a trace, 1.45-1.92 ms after). "
    "TEARDOWN_CUPTI=1 in the server's environment is no cure there: torch 2.11 / CUDA 13 servers started "
    "with it wrote GPU traces without a single kernel. For a before/after speed comparison, bench before "
    "tracing (trace --bench does) or after a restart."
)


def gpu_trace_after_note(activities: Optional[list] = None, gpu_server: bool = False) -> Optional[str]:
    """The note for a trace that recorded GPU activity (``activities`` holds GPU, or the engine
    configures its own profiler and the server has a GPU: vLLM); None for a CPU-only trace."""
    if any(str(a).upper() in ("GPU", "CUDA") for a in activities or []) or (activities is None and gpu_server):
        return GPU_TRACE_AFTER_NOTE
    return None
