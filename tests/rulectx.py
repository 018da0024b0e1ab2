"""A rule's input built from a few events (tests/ is on sys.path): ``context(steps)`` writes a
small Kineto trace as torch's profiler lays one out (a ``ProfilerStep#N`` range per step on the
CPU thread, each kernel launched by a ``cudaLaunchKernel`` with the correlation id its GPU event
carries, an H200's device properties), reads it with perfscope's own reader and runs the analysis
passes that come before the rules, so the ``RuleContext`` a rule's ``check`` gets is the one
``diagnose`` would build for that trace.

A test says what a step holds, kernel by kernel: ``[("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 300.0),
("nvjet_gemm", 100.0)]`` is one step of two kernels (name, µs), run back to back on one stream.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from perfscope.analysis import analyze
from perfscope.analysis.rules import RuleContext
from perfscope.load.reader import load_trace

H200 = {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9, "computeMinor": 0,
        "numSms": 132, "maxThreadsPerBlock": 1024, "warpSize": 32}

Step = Sequence[tuple[str, float]]  # (kernel name, duration in µs), in launch order


def kineto(steps: Sequence[Step], *, launch_us: float = 5.0, gap_us: float = 2.0, device: Optional[dict] = None) -> dict:
    """A Kineto trace of ``steps``: each step a ``ProfilerStep#N`` range on the CPU thread whose
    launches (``launch_us`` apart) start its kernels on stream 7, ``gap_us`` after the previous one ends."""
    pid, tid, stream = 100, 100, 7
    ev: list[dict] = []
    cpu = gpu = 1_000_000.0
    corr = 1
    for n, step in enumerate(steps):
        start = cpu
        for name, dur in step:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                       "ts": cpu, "dur": 3.0, "args": {"correlation": corr}})
            gpu = max(gpu, cpu + 4.0)
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": gpu, "dur": float(dur),
                       "args": {"device": 0, "stream": stream, "correlation": corr, "grid": [1, 1, 1],
                                "block": [128, 1, 1]}})
            gpu += dur + gap_us
            cpu += launch_us
            corr += 1
        cpu = max(cpu, gpu) + 10.0  # the step ends when its work has
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": pid, "tid": tid,
                   "ts": start - 1.0, "dur": cpu - start, "args": {}})
    return {"schemaVersion": 1, "deviceProperties": [device or H200], "traceEvents": ev}


def context(steps: Sequence[Step], config: Optional[dict] = None, **kw) -> RuleContext:
    """The ``RuleContext`` of the trace :func:`kineto` writes for ``steps``, as the analysis builds it."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "small.trace.json"
        path.write_text(json.dumps(kineto(steps, **kw)))
        trace = load_trace(path)
    st = analyze.State(trace=trace, config=dict(config or {}), file=trace.meta.path)
    for p in analyze.PASSES[:analyze.PASSES.index(analyze.pass_findings)]:
        p(st)
    return RuleContext(trace=st.trace, stepset=st.stepset, steps=st.steps, metrics=st.metrics, phase=st.phase,
                       step_ms=st.step_ms, kernel_ms_per_step=st.kernel_ms_per_step, buckets_ms=st.buckets_ms,
                       ops=st.ops, attributor=st.attributor, config=st.config, gpu_timeline=not st.cpu_only,
                       server=st.workload.get("model") != "transformers")
