"""Find the decode (and prefill) steps of a trace and the GPU work each one launched.

How steps are found, first that applies:
  1. SGLang's annotations ``step[DECODE bs=32]`` / ``step[EXTEND bs=15 toks=15360]``, vLLM's
     ``execute_context_N(tokens)_generation_M(tokens)`` and the ``execute_N_context_C(..)_generation_G(..)``
     markers TraceLens-instrumented servers write;
  2. vLLM's model-runner calls in the Python frames (``with_stack``): each outermost
     ``vllm/.../gpu_model_runner.py(N): execute_model`` is one step. Under piecewise CUDA graphs (vLLM
     V1's default) a step replays one graph piece per layer with eager attention between them: the
     step holds all of them. The frames do not say the phase: where some steps replay graphs and
     others do not, the eager ones are prefills (batches beyond the captured sizes) and the rest
     decode; where every step replays graphs, decode; otherwise (a lone step, all eager) unknown;
  3. torch.profiler's ``ProfilerStep#N`` (a decode loop driven under the profiler's schedule);
     without them, a training loop's ``Optimizer.step#`` ranges: an iteration ends with its optimizer
     step and begins where the previous one ended (the first, at the thread's first recorded op);
  4. CUDA/HIP graph launches: where consecutive launches replay the same kernels (piecewise graphs:
     one piece per layer, the first and last pieces differ), a run of pieces from a first piece to a
     last one is one step (every run the same number of pieces, the runs the profiler cut aside), with the eager launches between and just after them (attention, the
     logits and the sampler, up to TAIL_US after the last piece or the next step's first), its phase
     read as for the frames (a lone step: unknown); else (full-graph decode) one launch is one step;
  5. the whole trace as one window.
A CPU annotation covers the launches, not the GPU work: SGLang does not wait for the GPU, so a
step's kernels run on after the annotation closes. SGLang's annotation also closes before the sampler
runs: launches just after it (before the next step's) are the step's sampling and join it. A step is therefore timed by the GPU work it
launched (runtime calls inside the window -> kernels with the same correlation id), from its first
kernel's start to its last kernel's end.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import groupby, repeat
from operator import add

from perfscope.analysis.cpu_ops import is_collective_standin, thread_stream
from perfscope.analysis.step_windows import (
    GRAPH_FULL,
    TAIL_US,
    Step,
    is_graph_launch,
    is_kernel_launch,
    whole_trace,
    windows,
)
from perfscope.load.model import KERNEL_CORR, KERNEL_DUR, KERNEL_KIND, KERNEL_TS, Trace

__all__ = ["Step", "StepSet", "find_steps", "is_graph_launch", "is_kernel_launch"]


@dataclass
class StepSet:
    method: str  # "sglang-annotation" | "execute-annotation" | "model-runner-frames" | "ProfilerStep" | "graph-replay" | "whole-trace"
    steps: list[Step]
    note: str = ""  # how the steps were found
    # what the ranges are taken as when the trace does not name their phase ("taken as decode steps",
    # "training iterations"): said after the note, in brackets
    taken_as: str = ""

    @property
    def how(self) -> str:
        """How the steps were found, in words: the note, and what its ranges are taken as."""
        return f"{self.note} ({self.taken_as})" if self.taken_as else self.note

    def phase(self, name: str) -> list[Step]:
        return [s for s in self.steps if s.phase == name]

    @property
    def primary_phase(self) -> str:
        counts: dict[str, int] = {}
        for s in self.steps:
            if s.kernels or s.cpu_us > 0:
                counts[s.phase] = counts.get(s.phase, 0) + 1
        if counts.get("decode"):
            return "decode"
        return max(counts, key=lambda p: counts[p]) if counts else "unknown"


def find_steps(trace: Trace, whole: bool = False) -> StepSet:
    """``whole``: the whole trace as one window, whatever markers it has."""
    method, steps, note = whole_trace(trace) if whole else windows(trace)
    steps.sort(key=lambda s: s.cpu_start)
    # drop windows nested in an earlier one (e.g. a step annotation re-entered)
    flat: list[Step] = []
    for s in steps:
        if flat and s.cpu_start < flat[-1].cpu_end and s.cpu_end <= flat[-1].cpu_end and method != "whole-trace":
            continue
        flat.append(s)
    steps = flat
    for i, s in enumerate(steps):
        s.index = i
    taken_as = "taken as decode steps" if method == "ProfilerStep" else ""
    if not steps:
        return StepSet(method, steps, note, taken_as)

    starts = [s.cpu_start for s in steps]

    # SGLang's `step[...]` annotation covers the forward pass; the sampler's launches (softmax, argmax
    # or sampling kernels) come right after it closes, before the next step's: they belong to the step
    # they sample for. A launch after a step's annotation and before the next one joins it when it comes
    # within TAIL_US (or the step's own CPU length, if longer) of its end.
    tail_ok = method == "sglang-annotation"

    def window_of(ts: float, tail: bool = True) -> int:
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= steps[i].cpu_end:
            return i
        if tail and tail_ok and i >= 0 and ts - steps[i].cpu_end <= max(TAIL_US, steps[i].cpu_end - steps[i].cpu_start):
            return i
        return -1

    corr_step: dict[int, int] = {}
    has_corr = False
    kinds: dict = {}  # launch name -> (a kernel launch, a graph launch, a copy or set); once per name
    for l in trace.launches:
        kind = kinds.get(l.name)
        if kind is None:
            kind = kinds[l.name] = (
                is_kernel_launch(l.name),
                is_graph_launch(l.name),
                "Memcpy" in l.name or "Memset" in l.name,
            )
        if not kind[0] and not kind[2]:
            continue
        i = window_of(l.ts)
        if i < 0:
            continue
        st = steps[i]
        if st.pid is not None and l.pid != st.pid and method != "whole-trace":
            continue
        if l.corr is not None:
            corr_step[l.corr] = i
            has_corr = True
        if kind[0]:
            st.launches += 1
            if kind[1]:
                st.graph_launches += 1

    kern = trace.kernels
    if has_corr and method != "whole-trace" and "cpu" not in set(map(KERNEL_KIND, kern)):
        # GPU work only, found by correlation id: each kernel's step looked up in C, a step's kernels (in
        # index order) taken a run of neighbours at a time
        step_of = list(map(corr_step.get, map(KERNEL_CORR, kern), repeat(-1)))
        for i, run in groupby(range(len(kern)), step_of.__getitem__):
            if i >= 0:
                steps[i].kernels.extend(run)
    else:
        _place_kernels(trace, steps, method, has_corr, corr_step, window_of)

    for s in steps:
        if s.kernels:
            ks = list(map(kern.__getitem__, s.kernels))
            ts = list(map(KERNEL_TS, ks))
            s.gpu_start = min(ts)
            s.gpu_end = max(map(add, ts, map(KERNEL_DUR, ks)))
    if method in ("model-runner-frames", "graph-pieces"):
        note = _runner_phases(steps, note)
    return StepSet(method, steps, note, taken_as)


def _place_kernels(trace: Trace, steps: list[Step], method: str, has_corr: bool, corr_step: dict, window_of) -> None:
    """Each kernel into the step that launched it (by correlation id, else by time: a CPU-only trace's ops)."""
    for ki, k in enumerate(trace.kernels):
        if has_corr:
            i = corr_step.get(k.corr, -1)
        else:
            # a CPU op (CPU-only trace) runs on the step's own thread, inside its annotation: no tail,
            # so a step's op time never exceeds the step (the scheduler's work between steps is not it)
            i = window_of(k.ts, tail=k.kind != "cpu")
        if method == "whole-trace" and i < 0:
            i = 0
        if (
            i >= 0
            and k.kind == "cpu"
            and steps[i].tid is not None
            and k.stream != thread_stream(steps[i].tid)
            and not is_collective_standin(k.name)
        ):
            continue  # a CPU op of another thread: not this step's work (threads overlap in time)
        if i >= 0:
            steps[i].kernels.append(ki)


def _runner_phases(steps: list[Step], note: str) -> str:
    """Phases of steps found from vLLM's execute_model frames or graph pieces, which do not record them
    (see the module doc): graph replays against eager steps. Returns the step set's note, saying how."""
    work = [s for s in steps if s.kernels]
    full = [s for s in work if s.label == GRAPH_FULL]
    if full and len(full) < len(work):
        for s in work:
            s.phase = "decode" if s.label == GRAPH_FULL else "prefill"
        return note + (
            "; full-graph replays taken as decode, piecewise ones as prefill (engines capture decode "
            "whole and replay prefill or mixed batches piecewise)"
        )
    graphed = [s for s in work if s.graph_launches]
    if graphed and len(graphed) < len(work):
        for s in work:
            s.phase = "decode" if s.graph_launches else "prefill"
        return note + "; eager steps taken as prefill (beyond the captured graph sizes), graph replays as decode"
    if len(graphed) >= 2:
        for s in graphed:
            s.phase = "decode"
        return note + "; every step replays CUDA graphs: taken as decode"
    return note + "; the phase of a step is not recorded"
