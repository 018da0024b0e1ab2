"""The windows of a trace that are its steps, by the markers that bound them (see perfscope.analysis.steps,
which attaches each window's GPU work): SGLang and vLLM step annotations, vLLM's model-runner frames,
torch.profiler's ProfilerStep ranges, training iterations, runs of piecewise CUDA-graph replays, single
graph launches, else the whole trace. :class:`Step` is one window."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from perfscope.load.model import Trace

_SGLANG_STEP = re.compile(r"^step\[(DECODE|EXTEND|MIXED|PREFILL|IDLE|TARGET_VERIFY|DRAFT_EXTEND)\b([^\]]*)\]")
_EXECUTE = re.compile(r"^execute_(\d+)_context_(\d+)\(.*?\)_generation_(\d+)")
# vLLM's own model-runner annotation: execute_context_<reqs>(<tokens>)_generation_<reqs>(<tokens>)
# (some builds write the tokens and their square: `execute_context_1(888_788544)_generation_0(0)`)
_VLLM_EXECUTE = re.compile(r"^execute_context_(\d+)\((\d+)(?:_\d+)*\)_generation_(\d+)\((\d+)(?:_\d+)*\)")
TAIL_US = 2000.0  # how far after a step annotation its sampler's launches may come (see find_steps)
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_VLLM_RUNNER_FRAME = re.compile(r"(^|/)vllm/(v1/)?worker/(gpu_)?model_runner\.py\(\d+\): execute_model$")
_GRAPH_LAUNCH = ("cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch")
_PHASE_OF = {
    "DECODE": "decode",
    "EXTEND": "prefill",
    "PREFILL": "prefill",
    "MIXED": "mixed",
    "IDLE": "idle",
    "TARGET_VERIFY": "decode",
    "DRAFT_EXTEND": "prefill",
}


def is_graph_launch(name: str) -> bool:
    return name.startswith(_GRAPH_LAUNCH)


def is_kernel_launch(name: str) -> bool:
    n = name
    return (
        "LaunchKernel" in n
        or "LaunchCooperativeKernel" in n
        or n.startswith(_GRAPH_LAUNCH)
        or n in ("cudaLaunchKernelExC", "cuLaunchKernelEx", "cuLaunchKernel", "hipExtLaunchKernel")
    )


@dataclass
class Step:
    index: int
    phase: str  # decode | prefill | mixed | idle | unknown
    label: str
    cpu_start: float
    cpu_end: float
    pid: object = None
    kernels: list[int] = field(default_factory=list)  # indices into trace.kernels
    launches: int = 0
    graph_launches: int = 0
    gpu_start: Optional[float] = None
    gpu_end: Optional[float] = None
    tid: object = None  # the thread of the step's annotation: on a CPU-only trace its ops are the step's

    @property
    def gpu_us(self) -> float:
        if self.gpu_start is None or self.gpu_end is None:
            return 0.0
        return self.gpu_end - self.gpu_start

    @property
    def cpu_us(self) -> float:
        return self.cpu_end - self.cpu_start


def windows(trace: Trace) -> tuple[str, list[Step], str]:
    cpu_ann = [a for a in trace.annotations if not a.gpu]
    sg = []
    for a in cpu_ann:
        m = _SGLANG_STEP.match(a.name)
        if m:
            sg.append(Step(0, _PHASE_OF.get(m.group(1), "unknown"), a.name, a.ts, a.ts + a.dur, a.pid, tid=a.tid))
    if sg:
        return "sglang-annotation", sg, "SGLang step annotations"
    ex = []
    for a in cpu_ann:
        m = _EXECUTE.match(a.name)
        v = None if m else _VLLM_EXECUTE.match(a.name)
        if m is not None:
            ctx, gen = int(m.group(2)), int(m.group(3))
        elif v is not None:
            ctx, gen = int(v.group(2)), int(v.group(4))
        else:
            continue
        # vLLM annotates an empty step too (execute_0_context_0(..)_generation_0(..)): idle, as SGLang's IDLE
        phase = "idle" if ctx == 0 and gen == 0 else "decode" if ctx == 0 else "prefill" if gen == 0 else "mixed"
        ex.append(Step(0, phase, a.name, a.ts, a.ts + a.dur, a.pid, tid=a.tid))
    if ex:
        return "execute-annotation", ex, "vLLM execute_context_C_generation_G annotations"
    runner: dict = {}  # frame name -> a vLLM model-runner execute_model frame? (asked once per name)
    fr = []
    for f in trace.frames:
        hit = runner.get(f.name)
        if hit is None:
            hit = runner[f.name] = _VLLM_RUNNER_FRAME.search(f.name) is not None
        if hit:
            fr.append(Step(0, "unknown", f.name, f.ts, f.ts + f.dur, f.pid, tid=f.tid))
    if fr:
        return "model-runner-frames", fr, "vLLM model-runner execute_model calls (Python frames)"
    ps = [
        Step(0, "decode", a.name, a.ts, a.ts + a.dur, a.pid, tid=a.tid) for a in cpu_ann if _PROFILER_STEP.match(a.name)
    ]
    if ps:
        return "ProfilerStep", ps, "torch.profiler ProfilerStep#N ranges"
    it = _optimizer_iterations(trace)
    if it:
        return "optimizer-steps", it, "training iterations, each ending with its Optimizer.step"
    pieces = _graph_piece_steps(trace)
    if pieces:
        return (
            "graph-pieces",
            pieces,
            "runs of piecewise CUDA-graph replays, one per forward (no step annotations in the trace)",
        )
    gl = [Step(0, "decode", l.name, l.ts, l.ts + l.dur, l.pid) for l in trace.launches if is_graph_launch(l.name)]
    if len(gl) >= 2:
        return "graph-replay", gl, "one CUDA-graph launch per step (no step annotations in the trace)"
    return whole_trace(trace)


def whole_trace(trace: Trace) -> tuple[str, list[Step], str]:
    if trace.kernels:
        t0 = min(k.ts for k in trace.kernels)
        t1 = max(k.end for k in trace.kernels)
        c0 = min([l.ts for l in trace.launches] + [t0])
        c1 = max([l.ts + l.dur for l in trace.launches] + [t1])
        return (
            "whole-trace",
            [Step(0, "unknown", "whole trace", min(c0, t0), max(c1, t1))],
            "no step markers: the whole trace is one window",
        )
    if trace.cpu_ops:
        t0 = min(o.ts for o in trace.cpu_ops)
        t1 = max(o.ts + o.dur for o in trace.cpu_ops)
        return "whole-trace", [Step(0, "unknown", "whole trace", t0, t1)], "no step markers and no GPU kernels"
    return "whole-trace", [], "empty trace"


def _optimizer_iterations(trace: Trace) -> list[Step]:
    from perfscope.analysis.workload import optimizer_steps

    opt = optimizer_steps(trace)
    if not opt:
        return []
    tid = opt[0][0]
    starts = [o.ts for o in trace.cpu_ops if o.tid == tid] + [
        a.ts for a in trace.annotations if a.tid == tid and not a.gpu
    ]
    prev = min(starts + [opt[0][1]])
    pid = next((o.pid for o in trace.cpu_ops if o.tid == tid), None)
    steps = []
    for i, (t, _, end) in enumerate(o for o in opt if o[0] == tid):
        steps.append(Step(0, "unknown", f"iteration {i} (Optimizer.step)", prev, end, pid, tid=t))
        prev = end
    return steps


def _graph_piece_steps(trace: Trace) -> list[Step]:
    """Steps of piecewise CUDA-graph replay (see perfscope.analysis.steps' module doc); [] when no launches are pieces.

    A forward replayed piecewise is a run ``X M M .. M Y``: a first piece, two or more middle pieces
    replaying the same kernels (the layers), a last piece, each of the three replaying other kernels
    than the others. Every complete run is one step; a run cut by the profiler's window at the
    trace's start (``M .. M Y``) or end (``X M ..``) is one too. A graph launch in no run replays a
    whole forward (a full graph: SGLang captures decode whole and replays prefill piecewise, as vLLM's
    FULL_AND_PIECEWISE mode does) and is a step of its own. Complete runs of different lengths are not pieces of one model: []."""
    gl = sorted((l for l in trace.launches if is_graph_launch(l.name)), key=lambda l: l.ts)
    if len(gl) < 4:
        return []
    names: dict[Optional[int], list[str]] = {}
    for k in trace.kernels:
        names.setdefault(k.corr, []).append(k.name)
    sig = [tuple(names.get(l.corr, ())) for l in gl]
    n = len(sig)
    runs: list[tuple[int, int]] = []  # [start, end) of each run of pieces
    i = 0
    while i + 1 < n:
        mid, j = sig[i + 1], i + 1
        while j < n and sig[j] == mid:
            j += 1
        # sig[i]: a first piece, sig[i+1 .. j-1]: the middle ones, sig[j]: the last
        if j - (i + 1) >= 2 and j < n and sig[i] != mid and sig[j] != mid:
            runs.append((i, j + 1))
            i = j + 1
        else:
            i += 1
    if not runs:
        return []
    if len({e - b for b, e in runs}) != 1:
        return []  # not pieces of one model: e.g. full graphs of varying batch sizes, each replaying other kernels
    middles = {sig[b + 1] for b, _ in runs}
    lasts = {sig[e - 1] for _, e in runs}
    firsts = {sig[b] for b, _ in runs}
    b0 = runs[0][0]
    lead = 0
    while lead < b0 and sig[lead] in middles:
        lead += 1
    if lead and lead < b0 and sig[lead] in lasts:
        runs.insert(0, (0, lead + 1))  # cut at the start: middle pieces, then a last one
    e1 = runs[-1][1]
    if e1 < n and sig[e1] in firsts and e1 + 1 < n and all(x in middles for x in sig[e1 + 1 :]):
        runs.append((e1, n))  # cut at the end: a first piece, then middle ones
    in_run = [False] * n
    for b, e in runs:
        for x in range(b, e):
            in_run[x] = True
    starts = sorted(
        [(gl[b].ts, "run", b, e) for b, e in runs]
        + [
            (gl[x].ts, "full", x, x + 1)
            for x in range(n)
            if not in_run[x] and sig[x] not in middles and sig[x] not in firsts and sig[x] not in lasts
        ]
    )
    steps = []
    for i, (_, kind, b, e) in enumerate(starts):
        first, last = gl[b], gl[e - 1]
        if kind == "full":
            steps.append(Step(0, "unknown", GRAPH_FULL, first.ts, first.ts + first.dur, first.pid, tid=first.tid))
            continue
        end = last.ts + last.dur + TAIL_US
        if i + 1 < len(starts):
            end = min(end, starts[i + 1][0] - 1e-3)
        steps.append(Step(0, "unknown", f"graph pieces x{e - b}", first.ts, end, first.pid, tid=first.tid))
    return steps


GRAPH_FULL = "graph launch (full graph)"
