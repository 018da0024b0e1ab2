"""eager-decode: decode runs eagerly, one launch per kernel, and the GPU waits on the CPU."""

from __future__ import annotations

import bisect
import re
import statistics
from collections import Counter, defaultdict
from typing import NamedTuple, Optional

from perfscope.analysis import hosttime
from perfscope.analysis.rules.base import Finding, Rule, RuleContext
from perfscope.analysis.steps import is_graph_launch, is_kernel_launch

_BS = re.compile(r"\bbs=(\d+)")


class EagerDecode(Rule):
    needs_gpu_timeline = True
    share_of = "the step"
    id = "eager-decode"
    title = "Eager (launch-bound) decode: no CUDA graph"
    fix = "eager-decode"
    what = (
        "Decode steps launch hundreds of kernels one by one (no `cudaGraphLaunch`) and the GPU sits "
        "idle between them while the CPU issues the next launch."
    )
    why = (
        "At decode batch sizes most kernels run for a few microseconds, less than the CPU needs to "
        "launch one; the step is bound by Python and launch overhead, not by the GPU."
    )
    evidence = (
        "Kernel launches per step, graph launches per step, GPU idle time inside the step (fires at 20% of "
        "the step) and per launch, median kernel time. When the run has a bench (`trace --bench`, "
        "`perfscope bench`), the idle is the unprofiled one: the bench's decode step (median "
        "inter-token latency, else TPOT) less the step's GPU kernel time. The predicted step is the "
        "larger of the GPU kernel time and the host's work a graph replay keeps: per step cycle, the "
        "launching thread's time outside the deepest Python frame that holds 80% of the cycle's "
        "kernel launches (the model's forward, which the graph replaces; the Python frames of a trace "
        "recorded with stacks), scaled by the profiler's measured slow-down of the host "
        "(`perfscope.analysis.hosttime`: 0.38, range 0.25-0.47), no more than the bench's step. "
        "The bench's TPOT beyond its step (prefill chunks, the eager steps' spread) is added scaled as the "
        "step is. Measured on the real SGLang on the H200 (`examples/gpu_loop/results/h200-2026-12-03-eager"
        "*`), predicted against the fixed server's benches: dense model 1.49 ms (0.90-1.81) vs 1.69 ms (1.36-1.91) "
        "at one request, 1.86 (1.20-2.29) vs 1.83 / 2.22 at 16; MoE model 1.57 (1.41-1.88) vs 1.60 at one, "
        "2.45 (1.46-2.98) vs 1.66 at 16 (its host work under the profiler scales less well)."
    )
    remedy = (
        "Run decode under CUDA graphs: drop `--disable-cuda-graph`, raise `--cuda-graph-max-bs` above "
        "the running batch size (SGLang falls back to eager above it)."
    )
    false_positives = (
        "Profiling inflates eager steps (the profiler's own per-launch overhead): without a bench the "
        "thresholds read the profiled idle. Idle of more than 100 us per kernel launch is host "
        "work between the launches (Python, pre/post-processing, a profiler recording stacks, "
        "shapes and memory), not launch cost: no finding, unless the bench shows the unprofiled "
        "idle per launch under it (the real SGLang on the H200: 110 us per launch profiled, 43 us "
        "without the profiler; CUDA graphs made it 4x faster). The graphs deliver only if the "
        "batch fits the captured sizes. Without Python frames in the trace the prediction is the "
        "kernel time alone (the host's share unknown; said in the finding). On model forwards "
        "outside a serving engine (Hugging Face transformers) the finding names no fix command: "
        "the launch flags are a server's."
    )
    forwards = True  # a launch-bound forward pass is the same case as a launch-bound decode step

    # the one threshold: the GPU idles this share of the step while the launches trickle in
    MIN_IDLE_SHARE = 0.20
    # what launch cost is: idle per kernel launch up to this (launch-bound eager steps under torch.profiler
    # with stacks and shapes idle 19-62 us per launch; more is host work between the launches)
    LAUNCH_IDLE_MAX_US = 100.0

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        forward = not ctx.server and ctx.phase == "inference"
        if not ctx.metrics or (ctx.phase != "decode" and not forward):
            return None
        m = _launch_idle(ctx)
        if m is None or m.share < self.MIN_IDLE_SHARE or m.per_launch_us > self.LAUNCH_IDLE_MAX_US:
            return None
        kern = ctx.trace.kernels
        durs = sorted(kern[i].dur for s in ctx.steps for i in s.kernels)
        med_us = durs[len(durs) // 2] if durs else 0.0
        busy = max(ctx.step_ms - m.idle, 0.0)  # the step's GPU kernel time: what a graph replay runs
        pred = _prediction(ctx, busy) if ctx.server else None
        predicted = pred["predicted_step_ms"] if pred else busy
        # SGLang's step[DECODE bs=N] labels: the batch sizes the graphs must cover (--cuda-graph-max-bs)
        sizes = sorted({int(g.group(1)) for s in ctx.steps for g in [_BS.search(s.label or "")] if g})
        what = "The forward pass runs eagerly" if forward else "Decode runs eagerly"
        summary = (
            f"{what}: {m.launches:.0f} kernel launches per step and no CUDA graph; the GPU "
            f"idles {m.idle:.1f} of {ctx.step_ms:.1f} ms per step ({m.idle / ctx.step_ms:.0%}) waiting for launches"
        )
        if m.bench_step_ms is not None:
            summary += (
                f" (without the profiler {m.unprofiled_idle_ms:.2f} of {m.bench_step_ms:.2f} ms, {m.share:.0%}, "
                f"{m.per_launch_us:.0f} us per launch: the bench's step)"
            )
        summary += "."
        if pred and pred.get("host"):
            h = pred["host"]
            summary += (
                f" Under CUDA graphs: ~{predicted:.2f} ms per step, the larger of {busy:.2f} ms of kernels and "
                f"~{h['point']:.2f} ms of host work the graph keeps; expect {pred['range_ms'][0]:.2f}-"
                f"{pred['range_ms'][1]:.2f} ms."
            )
        elif ctx.server:
            summary += (
                f" Under CUDA graphs: at least {predicted:.2f} ms per step (its kernels; the host's share is "
                "unknown: the trace has no Python frames)."
            )
        extra = {}
        if not ctx.server:  # a serving engine's launch flags fix nothing in a script's forward
            extra = {
                "fix": None,
                "remedy": (
                    "Capture the forward in a CUDA graph (`torch.compile(model, "
                    'mode="reduce-overhead")` or `torch.cuda.graphs`), or give each '
                    "launch more work (a larger batch)."
                ),
            }
        ms = m.unprofiled_idle_ms if m.bench_step_ms is not None else m.idle
        evidence = {
            "launches_per_step": m.launches,
            "graph_launches_per_step": m.graphs,
            "idle_ms_per_step": round(m.idle, 3),
            "idle_share": round(m.idle / ctx.step_ms, 3),
            "idle_per_launch_us": round(m.idle * 1e3 / m.launches, 1),
            "server": ctx.server,
            "median_kernel_us": round(med_us, 2),
            "decode_batch_sizes": sizes,
            "disable_cuda_graph": ctx.config_value("disable_cuda_graph"),
            "cuda_graph_max_bs": ctx.config_value("cuda_graph_max_bs"),
        }
        if m.bench_step_ms is not None:
            evidence.update(
                bench_step_ms=round(m.bench_step_ms, 4),
                unprofiled_idle_ms=round(m.unprofiled_idle_ms, 4),
                unprofiled_idle_per_launch_us=round(m.per_launch_us, 1),
            )
        if pred:
            evidence["prediction"] = pred
        return self.finding(
            summary=summary,
            ms_per_step=ms,
            share=m.share,  # idle: a share of the step, not of kernel time
            confidence="high" if m.share > 0.4 else "medium",
            predicted_step_ms_after_fix=predicted,
            evidence=evidence,
            **extra,
        )

    @classmethod
    def host_work_note(cls, ctx: RuleContext) -> Optional[str]:
        """What the idle is when it is too much per launch to be launch cost (no finding then)."""
        m = _launch_idle(ctx) if ctx.metrics else None
        if m is None or m.share < cls.MIN_IDLE_SHARE or m.per_launch_us <= cls.LAUNCH_IDLE_MAX_US:
            return None
        where = " without the profiler (the bench's step)" if m.bench_step_ms is not None else ""
        return (
            f"the GPU idles {m.idle:.1f} of {ctx.step_ms:.1f} ms per step ({m.idle / ctx.step_ms:.0%}), "
            f"{m.per_launch_us:.0f} us per kernel launch{where}: host work between the launches (Python, pre- and "
            "post-processing, a profiler recording stacks, shapes or memory), not launch cost; CUDA graphs "
            f"would not remove it (eager-decode fires up to {cls.LAUNCH_IDLE_MAX_US:.0f} us per launch)"
        )


class LaunchIdle(NamedTuple):
    """Per step, medians: launches, graph launches, the profiled GPU idle (ms); the idle's share of the
    step and per launch (us), unprofiled when the run has a bench (``bench_step_ms``, with
    ``unprofiled_idle_ms``), else the profiled ones."""

    launches: float
    graphs: float
    idle: float
    share: float
    per_launch_us: float
    bench_step_ms: Optional[float]
    unprofiled_idle_ms: float


def _launch_idle(ctx: RuleContext) -> Optional[LaunchIdle]:
    """None for graph-replay steps or steps without launches."""
    launches = statistics.median(m.launches for m in ctx.metrics)
    graphs = statistics.median(m.graph_launches for m in ctx.metrics)
    idle = statistics.median(m.idle_ms for m in ctx.metrics)
    if graphs > 0 or launches < 1 or ctx.step_ms <= 0:
        return None
    got = hosttime.bench_step_ms(ctx.config.get("bench")) if ctx.server else None
    if got is not None:
        # the profiler stretches every launch: the bench's step less the kernels is the idle the server has
        meas = got[0]
        u = max(meas - max(ctx.step_ms - idle, 0.0), 0.0)
        return LaunchIdle(launches, graphs, idle, u / meas, u * 1e3 / launches, meas, u)
    return LaunchIdle(launches, graphs, idle, idle / ctx.step_ms, idle * 1e3 / launches, None, idle)


FORWARD_SHARE = 0.8  # the frame a graph replaces holds this share of a step cycle's kernel launches


def graph_kept_host(trace, steps) -> Optional[dict]:
    """The host work per step that a CUDA-graph replay keeps, as profiled: for each pair of consecutive
    steps, the cycle (one step's start to the next's) less the deepest Python frame on the launching
    thread that holds FORWARD_SHARE of the cycle's kernel launches (the model's forward: what the graph
    replaces; the scheduler, input preparation, sampling and output processing stay). Returns {kept_ms
    (median), cycles, frame (the frame name most often chosen)} or None without Python frames or cycles."""
    dec = sorted((s for s in steps if s.kernels), key=lambda s: s.cpu_start)
    if len(dec) < 2 or not trace.frames:
        return None
    by_tid: dict = defaultdict(list)
    for la in trace.launches:
        if is_kernel_launch(la.name) and not is_graph_launch(la.name):
            by_tid[la.tid].append(la.ts)
    if not by_tid:
        return None
    for v in by_tid.values():
        v.sort()
    frames: dict = defaultdict(list)
    for fr in trace.frames:
        if fr.tid in by_tid:
            frames[fr.tid].append(fr)
    fts = {}
    for tid, v in frames.items():
        v.sort(key=lambda f: f.ts)
        fts[tid] = [f.ts for f in v]
    kept: list = []
    names: Counter = Counter()
    for a, b in zip(dec, dec[1:]):
        if b.index != a.index + 1:
            continue
        # the launching thread: the one with the most kernel launches in the cycle
        counts = {
            tid: bisect.bisect_left(ts, b.cpu_start) - bisect.bisect_left(ts, a.cpu_start) for tid, ts in by_tid.items()
        }
        tid = max(counts, key=lambda t: counts[t])
        n = counts[tid]
        if n < 2 or tid not in frames:
            continue
        ts = by_tid[tid]
        i0 = bisect.bisect_left(ts, a.cpu_start)
        need = max(int(FORWARD_SHARE * n + 0.999), 1)
        # no frame shorter than the tightest window of `need` launches can hold them
        window = min(ts[i0 + k + need - 1] - ts[i0 + k] for k in range(n - need + 1))
        best = None
        fl, ft = frames[tid], fts[tid]
        for fr in fl[bisect.bisect_left(ft, a.cpu_start) : bisect.bisect_left(ft, b.cpu_start)]:
            if fr.dur < window or (best is not None and fr.dur >= best.dur):
                continue
            if bisect.bisect_left(ts, fr.ts + fr.dur) - bisect.bisect_left(ts, fr.ts) >= need:
                best = fr
        if best is None:
            continue
        kept.append(max(b.cpu_start - a.cpu_start - best.dur, 0.0))
        names[best.name] += 1
    if not kept:
        return None
    return {
        "kept_ms": round(statistics.median(kept) / 1e3, 4),
        "cycles": len(kept),
        "frame": names.most_common(1)[0][0],
    }


def _prediction(ctx: RuleContext, busy_ms: float) -> Optional[dict]:
    """The step under CUDA graphs: the larger of the GPU kernel time and the host work the graph keeps
    (``graph_kept_host``, scaled as ``hosttime.estimate`` scales a full trace's host time; no more than
    the bench's eager step, which held all of it), plus the bench's decode tail scaled as the step is. Kernel time alone,
    said so, without Python frames."""
    kept = graph_kept_host(ctx.trace, ctx.steps)
    bench = ctx.config.get("bench")
    # the TPOT beyond the bench's step (other requests' prefill chunks, the eager steps' own spread) shrinks
    # with the step under graphs: on the H200 7.48 - 6.90 ms -> 1.77 - 1.76 ms (dense, one request),
    # 28.37 - 25.62 ms -> 1.66 - 1.44 ms (MoE, 16 requests): it is scaled by the step's own ratio
    tail = hosttime.decode_tail_ms(bench)
    got = hosttime.bench_step_ms(bench)
    if kept is None:
        tail = tail * busy_ms / got[0] if got else 0.0
        return {
            "predicted_step_ms": round(busy_ms + tail, 4),
            "bound": "gpu",
            "gpu_work_ms": round(busy_ms, 4),
            "range_ms": [
                round(busy_ms * (1 - hosttime.GPU_WORK_ERROR), 4),
                round(busy_ms * (1 + hosttime.GPU_WORK_ERROR) + tail, 4),
            ],
            "kernel_only_prediction_ms": round(busy_ms, 4),
            "model": "the step's kernel time (the trace has no Python frames: the host's work under "
            "CUDA graphs is not known)",
        }
    host = hosttime.estimate(kept["kept_ms"], "full")
    if host is None:
        return None
    if got is not None and host.hi > got[0]:
        cap = got[0]
        host = hosttime.HostEstimate(
            min(host.point, cap),
            min(host.lo, cap),
            cap,
            host.source,
            host.profiled_ms,
            host.how + f"; at most the bench's eager step, {cap:.2f} ms",
        )
    pt, lo, hi, bound = hosttime.cycle(busy_ms, host)
    if got and tail > 0:
        tail *= min(pt / got[0], 1.0)
        pt, hi = pt + tail, hi + tail
    out = {
        "predicted_step_ms": round(pt, 4),
        "bound": bound,
        "range_ms": [round(lo, 4), round(hi, 4)],
        "gpu_work_ms": round(busy_ms, 4),
        "host": host.to_dict(),
        "graph_kept_host": kept,
        "kernel_only_prediction_ms": round(busy_ms, 4),
        "model": (
            f"the larger of the step's kernel time and the host work a graph replay keeps: the step cycle "
            f"less `{kept['frame']}` (the frame holding {FORWARD_SHARE:.0%} of its launches), "
            f"{kept['kept_ms']:.2f} ms profiled, scaled to the unprofiled host"
        ),
    }
    if tail > 0.005:
        out["decode_tail_ms"] = round(tail, 4)
    return out
