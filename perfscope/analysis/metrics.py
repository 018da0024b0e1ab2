"""Per-step numbers: kernel time per bucket, GPU busy and idle time, launches."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfscope.analysis.buckets import BUCKETS
from perfscope.analysis.kernel_table import kernel_table
from perfscope.analysis.sampling_path import step_overrides
from perfscope.analysis.steps import Step
from perfscope.load.model import Trace


@dataclass
class StepMetrics:
    index: int
    phase: str
    label: str
    gpu_ms: float  # first kernel start -> last kernel end of the work this step launched
    cpu_ms: float  # the CPU annotation's length
    kernel_ms: float  # summed kernel time (streams overlap: may exceed gpu_ms)
    busy_ms: float  # union of kernel intervals
    idle_ms: float  # gpu_ms - busy_ms
    comm_exposed_ms: float  # communication kernel time with no other kernel running beside it
    kernels: int
    launches: int
    graph_launches: int
    buckets: dict[str, float] = field(default_factory=dict)  # ms

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def union_us(intervals: list[tuple[float, float]]) -> float:
    ordered = iter(sorted(intervals))
    first = next(ordered, None)
    if first is None:
        return 0.0
    total = 0.0
    cur_s, cur_e = first
    for s, e in ordered:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + (cur_e - cur_s)


def step_metrics(trace: Trace, step: Step, sampler: bool = True) -> StepMetrics:
    """``sampler``: count the step's sampling path (perfscope.analysis.sampling_path) as sampling (LLM traces)."""
    kern = trace.kernels
    buckets = dict.fromkeys(BUCKETS, 0.0)
    ivs = []
    other = []  # everything but communication: what can hide a collective
    ksum = 0.0
    over = step_overrides(trace, step, serving=sampler)  # the sampler's softmax / cumsum; mid-step top-k
    bucket = kernel_table(trace).bucket  # classify(name, kind)[0] of each kernel, once per distinct name
    for i in step.kernels:
        k = kern[i]
        b = over[i][0] if i in over else bucket[i]
        buckets[b] += k.dur
        ksum += k.dur
        ivs.append((k.ts, k.ts + k.dur))
        if b != "communication":
            other.append(ivs[-1])
    busy = union_us(ivs)
    # exposed communication = busy time - time some non-communication kernel runs
    exposed = busy - union_us(other) if buckets["communication"] else 0.0
    gpu = step.gpu_us
    return StepMetrics(
        index=step.index,
        phase=step.phase,
        label=step.label,
        gpu_ms=gpu / 1e3,
        cpu_ms=step.cpu_us / 1e3,
        kernel_ms=ksum / 1e3,
        busy_ms=busy / 1e3,
        idle_ms=max(0.0, gpu - busy) / 1e3,
        comm_exposed_ms=max(0.0, exposed) / 1e3,
        kernels=len(step.kernels),
        launches=step.launches,
        graph_launches=step.graph_launches,
        buckets={b: v / 1e3 for b, v in buckets.items()},
    )
