"""What ``perfscope trace`` was asked to do, shared by the tracer, its load and its waits."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TraceOptions:
    port: int = 30000
    steps: int = 20
    engine: str = "sglang"  # or "vllm"
    concurrency: int = 1
    input_len: int = 256
    output_len: int = 128
    timeout: float = 300.0  # for the whole wait for complete traces, per host
    http_timeout: float = 30.0
    api_key: str | None = field(default=None, repr=False)  # never written anywhere
    remote_dir: str = "/tmp"  # where the fresh output folder is made (sglang)
    profile_dir: str | None = None  # vLLM: the server's torch profiler dir
    by_stage: bool | None = None  # None: when the server's version supports it
    profile_prefix: str | None = None  # SGLang 0.5.10+: names its files <prefix>-<id>-TP-<r>...
    with_stack: bool = True
    record_shapes: bool = True
    # GPU activity only (kernels, CUDA runtime calls): the host timeline without the CPU-op profiler's
    # per-event cost, read by diagnose for the host's own time per step (perfscope.analysis.hosttime)
    gpu_only: bool = False
    # SGLang on a GPU: a short GPU-only profile first, in the run folder's host-timing/ (rundir.HOST_TIMING_DIR)
    host_timing: bool = True
    keep_remote: bool = False
    poll_s: float = 1.0  # seconds between two looks at the files being written (trace --poll)
    seed: int = 0
    bench_requests: int = 0  # > 0: measure TPOT without the profiler first, before any profile (perfscope bench)
    python: str | None = None  # the server's interpreter, for its versions (else found, when it may be run)
    # trace --analyse-on-host: "analyse" (the traces analysed by the host's Python, only the results
    # copied back: perfscope.cluster.onhost), "keep" (left on the host, listed, analysed with the run
    # they belong to: the host-timing profile's), "" (copied back)
    analyse_on_host: str = ""
    analysis_timeout: float = 3600.0  # seconds the host's analysis may take
