"""Analyse one trace: a list of passes, each a function of the same shape, run in order.

Each pass reads the :class:`State` (the trace and what earlier passes found) and adds its part.
The result is a :class:`RankAnalysis`: typed records and plain data, no events.
"""

from __future__ import annotations

import operator
import statistics
from collections import defaultdict
from itertools import compress, repeat
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Optional

from perfscope.analysis.attribution import Attributor
from perfscope.analysis.buckets import BUCKETS
from perfscope.analysis import cpuhost, hosttime
from perfscope.analysis.floor import annotate_findings, compute_floor
from perfscope.analysis.kernel_table import kernel_table
from perfscope.analysis.cpu_ops import NOTE as CPU_ONLY_NOTE, cpu_ops_as_kernels
from perfscope.analysis.metrics import StepMetrics, step_metrics
from perfscope.analysis.ops import Op, top_ops
from perfscope.analysis.result import RankAnalysis
from perfscope.analysis.roofline import roofline
from perfscope.analysis.rules import RuleContext, run_rules
from perfscope.analysis.rules.eager_decode import EagerDecode
from perfscope.analysis.sampling_path import step_overrides
from perfscope.analysis.step_summary import StepSummary, analysed_window, median_step_timeline, phase_rows, top_cpu_ops
from perfscope.analysis.steps import Step, StepSet, find_steps
from perfscope.analysis.workload import classify_workload
from perfscope.load.model import KERNEL_DUR, KERNEL_KIND, Trace

if TYPE_CHECKING:
    from perfscope.analysis.capture_map import CaptureSet


@dataclass
class State:
    trace: Trace
    config: dict
    file: str = ""
    rank: Optional[int] = None
    stage: Optional[str] = None
    capture: Optional[CaptureSet] = None  # attributes graph-replayed kernels
    stepset: StepSet = field(default_factory=lambda: StepSet("none", []))  # pass_steps finds them
    phase: str = "unknown"
    steps: list[Step] = field(default_factory=list)  # analysed steps (primary phase, with GPU work)
    metrics: list[StepMetrics] = field(default_factory=list)
    step_ms: float = 0.0
    kernel_ms_per_step: float = 0.0
    buckets_ms: dict = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    attributor: Optional[Attributor] = None
    findings: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cpu_only: bool = False
    workload: dict = field(default_factory=dict)  # perfscope.analysis.workload: what the trace is
    window: dict = field(default_factory=dict)  # analysed_window: the steps, or the whole trace
    summary: StepSummary = field(default_factory=StepSummary)  # pass_metrics: the analysed steps
    out: dict = field(default_factory=dict)


def pass_steps(st: State) -> None:
    if not st.trace.kernels and st.trace.cpu_ops:
        st.trace = replace(st.trace, kernels=cpu_ops_as_kernels(st.trace))
        st.cpu_only = True
    st.stepset = find_steps(st.trace)
    st.window = analysed_window(st.trace, st.stepset)
    if st.window["analysed"] == "whole-trace":
        marked = st.stepset
        st.stepset = find_steps(st.trace, whole=True)
        st.stepset.note = f"the whole trace as one window ({marked.method} ranges hold almost none of its GPU work)"
        st.notes.append(
            f"the {len(marked.steps)} step(s) found ({marked.how}) hold {st.window['steps_gpu_share']:.1%} "
            f"of the trace's GPU time ({st.window['gpu_ms_total']:.2f} ms, {st.window['outside_top']} outside "
            "them): the whole trace is analysed as one window"
        )
    st.workload = classify_workload(st.trace)
    if st.workload["kind"] == "training":
        # training iterations, not decode steps
        for s in st.stepset.steps:
            if s.phase in ("decode", "unknown"):
                s.phase = "train"
        if st.stepset.taken_as:
            st.stepset.taken_as = "training iterations"
    elif not st.workload["serving_rules"]:
        # non-LLM inference (a diffusion pipeline, a CNN): its iterations are no decode steps either
        for s in st.stepset.steps:
            if s.phase in ("decode", "unknown"):
                s.phase = "inference"
        if st.stepset.taken_as:
            st.stepset.taken_as = "inference iterations"
    if not st.workload["serving_rules"]:
        st.notes.append(f"This is {st.workload['how']}.")
    st.phase = st.stepset.primary_phase
    st.steps = [s for s in st.stepset.steps if s.phase == st.phase and s.kernels] or [
        s for s in st.stepset.steps if s.phase == st.phase
    ]
    if st.trace.meta.repaired_names:
        st.notes.append(
            f"{st.trace.meta.repaired_names} event name(s) held unescaped quotes (a torch profiler "
            "bug that breaks the JSON) and were repaired on load"
        )
    m = st.trace.meta
    if m.lone_surrogates:
        st.notes.append(
            f"{m.lone_surrogates} lone UTF-16 surrogate escape(s) in the trace's strings were read as "
            "U+FFFD (the replacement character)"
        )
    if m.negative_durations:
        kern = f", {m.negative_kernels} of them GPU kernels or copies" if m.negative_kernels else ""
        st.notes.append(
            f"{m.negative_durations} event(s) with a negative duration{kern} were left out of the "
            "analysis (the profiler's clock went back for them)"
        )
    if st.cpu_only:
        st.notes.append(CPU_ONLY_NOTE)
        dev = str(st.config.get("device") or "").lower()
        if dev in ("cuda", "gpu") or (dev == "" and st.trace.meta.device_name):
            # measured on the H200: SGLang servers started with TEARDOWN_CUPTI=1 (torch 2.11, CUDA 13)
            # wrote GPU traces without a single kernel (examples/gpu_loop/results/h200-2026-12-01-predict)
            st.notes.append(
                "the server runs on a GPU, yet its trace recorded no GPU kernel: a server started "
                "with TEARDOWN_CUPTI=1 in its environment traces so (torch 2.11, CUDA 13, H200); "
                "restart it without that variable and trace again"
            )


def pass_metrics(st: State) -> None:
    sampler = bool(st.workload.get("serving_rules"))
    st.metrics = [step_metrics(st.trace, s, sampler=sampler) for s in st.steps]
    gpu = [m.gpu_ms for m in st.metrics if m.kernels]
    st.step_ms = (
        statistics.median(gpu) if gpu else (statistics.median([m.cpu_ms for m in st.metrics]) if st.metrics else 0.0)
    )
    n = max(len(st.metrics), 1)
    st.kernel_ms_per_step = sum(m.kernel_ms for m in st.metrics) / n
    st.buckets_ms = {b: sum(m.buckets[b] for m in st.metrics) / n for b in BUCKETS}
    st.out["phases"] = phase_rows(st.stepset)
    idle = [m.idle_ms for m in st.metrics if m.kernels]
    cpu = [m.cpu_ms for m in st.metrics]
    st.summary = StepSummary(
        phase=st.phase,
        count=len(st.metrics),
        median_ms=round(st.step_ms, 4),
        method=st.stepset.method,
        how=st.stepset.how,
        window=st.window,
        workload=st.workload.get("kind"),
        workload_how=st.workload.get("how"),
        workload_model=st.workload.get("model"),
        workload_evidence=st.workload.get("evidence"),
        analysed_on="cpu-ops" if st.cpu_only else "gpu-kernels",
        mean_ms=round(statistics.fmean(gpu), 4) if gpu else None,
        min_ms=round(min(gpu), 4) if gpu else None,
        max_ms=round(max(gpu), 4) if gpu else None,
        cpu_median_ms=round(statistics.median(cpu), 4) if cpu else None,
        idle_median_ms=round(statistics.median(idle), 4) if idle else None,
        launches_per_step=statistics.median([m.launches for m in st.metrics]) if st.metrics else 0,
        graph_launches_per_step=statistics.median([m.graph_launches for m in st.metrics]) if st.metrics else 0,
    )
    unprof = hosttime.unprofiled_step(st.stepset.steps, st.config.get("bench"))
    if unprof:
        if st.cpu_only and cpuhost.on_cpu(st.config):  # a CPU server: the profiler's cost per event
            unprof["cpu_host"] = cpuhost.profiler_cost(st.trace, st.stepset.steps, st.config.get("bench"))
        st.summary.unprofiled = unprof
        if unprof["profiler_slowdown"] > 1 + 2 * hosttime.BENCH_NOISE:  # beyond two benches' noise
            st.notes.append(
                f"the profiled step cycle ({unprof['profiled_cycle_ms']:.2f} ms) is "
                f"{unprof['profiler_slowdown']:.2f}x the {unprof['step_ms']:.2f} ms the bench measured "
                f"without the profiler: the idle and host time this trace shows are the profiled host's; "
                f"the findings take the host's time from the bench, or scale it to the unprofiled one"
            )
    cpu_ms = st.summary.cpu_median_ms
    if cpu_ms and gpu and cpu_ms > 1.5 * st.step_ms:
        st.notes.append(
            f"CPU step ranges ({cpu_ms:.1f} ms) are much longer than the "
            f"GPU work they launch ({st.step_ms:.1f} ms): profiler overhead or host-side waits"
        )


def pass_buckets(st: State) -> None:
    total = st.kernel_ms_per_step or 1e-12
    st.out["buckets"] = {
        b: {"ms_per_step": round(ms, 4), "share": round(ms / total, 4)} for b, ms in st.buckets_ms.items()
    }
    comm = st.out["buckets"].get("communication")
    if comm and comm["ms_per_step"] > 0 and not st.cpu_only and st.metrics:
        # a collective hidden behind compute on another stream costs no step time; an exposed one does
        exposed = sum(m.comm_exposed_ms for m in st.metrics) / len(st.metrics)
        comm["exposed_ms_per_step"] = round(exposed, 4)
        comm["overlapped_share"] = round(max(0.0, 1 - exposed / comm["ms_per_step"]), 4)
    sub: defaultdict = defaultdict(float)
    kern = st.trace.kernels
    pair = kernel_table(st.trace).pair  # classify(name, kind) of each kernel, once per distinct name
    labels: dict = {}  # (bucket, sub-bucket) -> "bucket/sub-bucket"
    for s in st.steps:
        over = step_overrides(st.trace, s, serving=bool(st.workload.get("serving_rules")))
        for i in s.kernels:
            bs = over.get(i) or pair[i]  # the sampler's softmax / cumsum; mid-step top-k
            lab = labels.get(bs)
            if lab is None:
                lab = labels[bs] = f"{bs[0]}/{bs[1]}"
            sub[lab] += kern[i].dur
    n = max(len(st.steps), 1)
    st.out["sub_buckets"] = {
        k: {"ms_per_step": round(v / n / 1e3, 4), "share": round(v / n / 1e3 / total, 4)}
        for k, v in sorted(sub.items(), key=lambda kv: -kv[1])
    }


def pass_ops(st: State) -> None:
    replay = None
    if st.capture is not None:
        replay = st.capture.map_trace(st.trace)
        st.notes.append(replay.note())
        st.out["capture_map"] = replay.to_dict()
    st.attributor = Attributor(st.trace, capture=replay)
    st.ops = top_ops(st.trace, st.steps, st.attributor)


def pass_findings(st: State) -> None:
    assert st.attributor is not None, "pass_ops runs first"
    ctx = RuleContext(
        trace=st.trace,
        stepset=st.stepset,
        steps=st.steps,
        metrics=st.metrics,
        phase=st.phase,
        step_ms=st.step_ms,
        kernel_ms_per_step=st.kernel_ms_per_step,
        buckets_ms=st.buckets_ms,
        ops=st.ops,
        attributor=st.attributor,
        config=st.config,
        gpu_timeline=not st.cpu_only,
        server=st.workload.get("model") != "transformers",
    )
    # model forwards outside a server (transformers): the rules that hold for forwards (launch-bound steps)
    rules_apply = st.workload.get("serving_rules", True) or not ctx.server
    st.findings = run_rules(ctx) if st.trace.kernels and rules_apply else []
    if st.trace.kernels and rules_apply and not st.cpu_only and not any(f.id == "eager-decode" for f in st.findings):
        forward = not ctx.server and ctx.phase == "inference"
        note = EagerDecode.host_work_note(ctx) if (ctx.phase == "decode" or forward) else None
        if note:
            st.notes.append(note)
    top = st.ops[0] if st.ops else None
    if (
        st.cpu_only
        and not st.findings
        and top is not None
        and top.bucket == "copy"
        and top.share >= 0.3
        and not top.attribution.input_types
    ):
        # the cast rule reads dtypes and shapes from CPU ops when there are no kernels to size
        st.notes.append(
            f"the top op ({top.short}, {top.share:.0%} of op time) is a copy, but this trace recorded "
            "no input dtypes or shapes, which fp8-kv-cast needs on a trace without GPU kernels: "
            "profile with shapes (SGLang: record_shapes, on by default since 0.5.5; vLLM: "
            "VLLM_TORCH_PROFILER_RECORD_SHAPES=1)"
        )


def pass_floor(st: State) -> None:
    """What a step should cost on this GPU (perfscope.analysis.floor), the gap per bucket, and the floor
    beside each finding's predicted step time."""
    if not st.trace.kernels:
        st.out["floor"] = {"available": False, "missing": "floor: the trace has no GPU kernels to compare with"}
        return
    idle = st.summary.idle_median_ms or 0.0
    st.out["floor"] = compute_floor(
        st.trace.meta.to_dict(),
        st.config,
        buckets_ms=st.buckets_ms,
        step_ms=st.step_ms,
        idle_ms=idle,
        phase=st.phase,
        step_labels=[s.label for s in st.steps],
        moe_gemm_ms=(st.out.get("sub_buckets") or {}).get("moe/gemm", {}).get("ms_per_step", 0.0),
    )
    annotate_findings(st.findings, st.out["floor"])


def pass_roofline(st: State) -> None:
    """Achieved TB/s and TFLOP/s of the dominant ops against the GPU's peaks (perfscope.analysis.roofline)."""
    if not st.trace.kernels or st.cpu_only:
        st.out["roofline"] = {"available": False, "missing": "roofline: no GPU kernels"}
        return
    fl = st.out.get("floor") or {}
    st.out["roofline"] = roofline(
        [o.to_dict() for o in st.ops],
        st.trace.meta.to_dict(),
        st.step_ms,
        fl.get("floor_ms") if fl.get("available") else None,
    )


def pass_timeline(st: State) -> None:
    """The kernels of the step whose time is the median: what the report draws."""
    st.out["timeline"] = median_step_timeline(
        st.trace, st.metrics, st.steps, st.step_ms, serving=bool(st.workload.get("serving_rules"))
    )


def pass_cpu_ops(st: State) -> None:
    """Top CPU ops by total time in the analysed window (the whole analysis for CPU-only traces)."""
    st.out["cpu_ops"] = top_cpu_ops(st.trace, st.steps)


PASSES: tuple[Callable[[State], None], ...] = (
    pass_steps,
    pass_metrics,
    pass_buckets,
    pass_ops,
    pass_findings,
    pass_floor,
    pass_roofline,
    pass_timeline,
    pass_cpu_ops,
)


def analyze_trace(
    trace: Trace,
    config: Optional[dict] = None,
    *,
    rank: Optional[int] = None,
    stage: Optional[str] = None,
    capture=None,
) -> RankAnalysis:
    st = State(trace=trace, config=dict(config or {}), file=trace.meta.path, rank=rank, stage=stage, capture=capture)
    trace.memo.clear()  # what the passes memoise (perfscope.analysis.kernel_table, the step model) is this analysis'
    try:
        for p in PASSES:
            p(st)
    finally:
        # and goes with it: the step model's replays refer back to the trace, a cycle that would keep
        # the whole trace alive until the garbage collector finds it (a worker's next rank on top)
        trace.memo.clear()
        st.trace.memo.clear()
    kern = trace.kernels  # the same sums, the durations and kinds read in C
    kernel_total = (
        sum(compress(map(KERNEL_DUR, kern), map(operator.eq, map(KERNEL_KIND, kern), repeat("kernel")))) / 1e3
    )
    gpu_total = sum(map(KERNEL_DUR, kern)) / 1e3
    idle = st.summary.idle_median_ms or 0.0
    return RankAnalysis(
        file=st.file,
        rank=rank if rank is not None else trace.meta.rank,
        stage=stage,
        meta=trace.meta.to_dict(),
        steps=st.summary,
        phases=st.out["phases"],
        buckets=st.out["buckets"],
        sub_buckets=st.out["sub_buckets"],
        kernel_ms_total=round(kernel_total, 4),
        gpu_ms_total=round(gpu_total, 4),
        kernel_ms_per_step=round(st.kernel_ms_per_step, 4),
        idle_ms_per_step=round(idle, 4),
        ops=list(st.ops),
        findings=[f.settled() for f in st.findings],
        per_step=[m.to_dict() for m in st.metrics],
        timeline=st.out["timeline"],
        cpu_ops=st.out["cpu_ops"],
        notes=st.notes,
        floor=st.out.get("floor", {}),
        roofline=st.out.get("roofline", {}),
    )
