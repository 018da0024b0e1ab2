"""The step after a fix, replayed on the CPU launch timeline: a step cannot finish before its last launch.

Subtracting a kernel's time from the step is right only when the GPU was the bottleneck all
along. Long kernels hide the CPU: while a 0.8 ms cast runs, the CPU launches the next kernels
ahead, and once the cast is gone the GPU waits on those launches again (eager decode on the H200
trace: "step minus casts" said 7.0 ms, 9.8 ms was measured). So every kernel-level prediction is
replayed here:

- each kernel starts at ``max(its launch + launch latency, the end of the previous kernel on its
  stream)`` and runs for its new duration (0 when the fix removes it); kernels of one CUDA-graph
  launch keep their original spacing inside the graph;
- launches keep their recorded CPU times (the lower bound: the CPU still issues them), except
  that a host wait (a synchronize, or a copy to the host that waited for the GPU) ends earlier
  when the GPU work it waited for ends earlier, and every later launch of that thread moves with it;
- the predicted step is the measured step minus what the replay saves (model with the new
  durations vs the model with the recorded ones), so the model's own error cancels;
- the host: from one step's start to the next, the launching thread's time not spent blocked on the
  GPU (synchronizes, copies to the host that waited for their data) is the scheduler, input
  preparation, launches and result processing, which a GPU-side fix does not remove (less the CPU
  time of torch ops whose kernels all go): ``host_floor_ms`` (median), ``host_busy_quick_ms`` (the
  quickest tenth of the steps). Both are the profiled host's; ``perfscope.analysis.hosttime`` turns
  them into the unprofiled host's time, and the prediction is the larger of the GPU side and that
  (``rules.model_prediction``). With CUDA graphs and the overlap scheduler the CPU runs ahead of a
  slow GPU, so the replay alone sees no host cost.

Cross-stream waits (cudaStreamWaitEvent) are followed: a kernel that started later than its launch
and its stream allow waits in the replay for the kernel its event marked, paired on the CPU (the
cudaEventRecord before the wait, the thread's last launch on another stream before that), else read
off the GPU timeline (a kernel on another stream ended just before it started), else for another
stream's kernel whose SMs it waited for (StepReplay._cross_stream_waits). NCCL on its own stream
waiting for the compute that filled its buffer, the compute waiting for the collective: a faster
collective or a shorter producer moves the other stream. Any other delay neither explains is kept.
SM sharing between concurrent kernels on two streams (their durations inflate together) is not.
"""

from __future__ import annotations

import bisect
import operator
import statistics
from collections import Counter
from typing import Callable, Optional

from perfscope.analysis.kernel_table import launches_by_corr
from perfscope.analysis.steps import Step, is_graph_launch, is_kernel_launch
from perfscope.load.model import Trace, by_start_longest_first

_TS = operator.attrgetter("ts")
_WAIT_MIN_US = 5.0  # a runtime call this long that returns when the GPU work before it ends: a host wait


def _is_wait_candidate(name: str) -> bool:
    return "Synchronize" in name or name.startswith(("cudaMemcpy", "hipMemcpy", "cuMemcpy")) or \
        name in ("cudaStreamWaitEvent",)


class TraceIndex:
    """Runtime calls and torch ops of a trace sorted by start, for per-step windows by bisection."""

    def __init__(self, trace: Trace):
        self.launches = sorted(trace.launches, key=_TS)
        self.l_ts = [l.ts for l in self.launches]
        # by start, the longer first at one start: each thread's ops in the order StepReplay reads them
        self.ops = by_start_longest_first([o for o in trace.cpu_ops if o.name.startswith("aten::")])
        self.o_ts = [o.ts for o in self.ops]
        self._waits: Optional[dict] = None

    def launches_between(self, lo: float, hi: float):
        return self.launches[bisect.bisect_left(self.l_ts, lo):bisect.bisect_right(self.l_ts, hi)]

    def aten_ops_between(self, lo: float, hi: float):
        return self.ops[bisect.bisect_left(self.o_ts, lo):bisect.bisect_right(self.o_ts, hi)]

    def last_wait(self, thread, lo: float, hi: float):
        """The last cudaStreamWaitEvent call of ``thread`` (pid, tid) that started in [lo, hi], or None."""
        if self._waits is None:
            waits: dict = {}
            for l in self.launches:
                if l.name == "cudaStreamWaitEvent":
                    w = waits.setdefault((l.pid, l.tid), ([], []))
                    w[0].append(l)
                    w[1].append(l.ts)
            self._waits = waits
        w = self._waits.get(thread)
        if w is None:
            return None
        j = bisect.bisect_right(w[1], hi) - 1
        return w[0][j] if j >= 0 and w[1][j] >= lo else None


class StepReplay:
    """One step's kernels and the runtime calls around them, ready to be replayed with new durations."""

    def __init__(self, trace: Trace, step: Step, by_corr: Optional[dict] = None, index: Optional["TraceIndex"] = None):
        import bisect

        index = index or TraceIndex(trace)
        self.trace = trace
        self.step = step
        kern = trace.kernels
        by_corr = by_corr if by_corr is not None else {l.corr: l for l in trace.launches if l.corr is not None}
        self.orphans = []  # kernels with no launch record: kept where they ran
        launched: dict = {}  # id(launch) -> (launch, [kernel indices])
        # the step's kernels by start: (index, kernel, its launch or None, whether that is a graph launch);
        # the launches' kernels, and the launch-to-start of kernels that started on an idle stream
        graph_of: dict = {}  # launch name -> is_graph_launch
        lk = []
        lat: list = []
        prev_end: dict = {}
        eager = False  # a kernel of the step has a launch of its own (not a graph replay)
        corr = cached = None  # the previous kernel's correlation id and (launch, graph?, its kernels)
        for i in sorted(step.kernels, key=lambda j: kern[j].ts):
            k = kern[i]
            if cached is None or k.corr != corr:  # a graph launch's kernels share one id: looked up once
                corr = k.corr
                l = by_corr.get(corr)
                if l is None:
                    cached = (None, False, None)
                else:
                    g = graph_of.get(l.name)
                    if g is None:
                        g = graph_of[l.name] = is_graph_launch(l.name)
                    e = launched.get(id(l))
                    if e is None:
                        e = launched[id(l)] = (l, [])
                    cached = (l, g, e[1])
            l, g, ks = cached
            lk.append((i, k, l, g))
            if l is None:
                self.orphans.append(i)
                continue
            if not g:
                eager = True
                pe = prev_end.get(k.stream)
                if (pe is None or k.ts > pe + 1.0) and k.ts >= l.ts:
                    lat.append(k.ts - l.ts)  # started on an idle stream: pure launch latency
            prev_end[k.stream] = k.ts + k.dur
            ks.append(i)
        # the launch latency: the quickest launch-to-start on an idle stream, capped (a GPU running behind
        # its CPU makes every launch-to-start long: that is queueing, kept by the anchors below)
        lat.sort()
        self.latency_us = min(max(lat[len(lat) // 10], 1.0), 20.0) if lat else 5.0
        # delays the launch and the stream do not explain (work queued before the step, a wait on
        # another stream, CPU/GPU clock offset): kept in the replay; the first kernel of each stream
        # also never starts before it did (the GPU was busy before the step)
        self.delay: dict = {}
        self.first_on_stream: dict = {}
        self._lk = lk
        if eager:
            prev_end = {}
            for i, k, l, g in lk:
                pe = prev_end.get(k.stream)
                if pe is None:
                    self.first_on_stream[i] = k.ts
                elif l is not None and not g:  # graph kernels keep their spacing instead
                    expl = max(l.ts + self.latency_us, pe)
                    d = k.ts - expl
                    if d > 3 * self.latency_us:
                        self.delay[i] = d
                prev_end[k.stream] = k.ts + k.dur
            self.dep = self._cross_stream_waits(kern, by_corr, step, index, launched)
        else:  # graph replays only: no delay to keep and no wait to follow, each stream's first start kept
            seen: set = set()
            for i, k, _, _ in lk:
                if k.stream not in seen:
                    seen.add(k.stream)
                    self.first_on_stream[i] = k.ts
            self.dep = {}
        self.graph_dep = self._graph_stream_joins(kern, launched)
        for i in list(self.dep) + list(self.graph_dep):
            self.delay.pop(i, None)
            self.first_on_stream.pop(i, None)
        threads = {(l.pid, l.tid) for l, _ in launched.values()}
        lo = min([step.cpu_start] + [l.ts for l, _ in launched.values()])
        hi = max([step.cpu_end] + [l.ts for l, _ in launched.values()])
        # every runtime call of the launching threads in the step, in CPU order, with its kernels
        self.events = []
        for l in index.launches_between(lo, hi):
            if (l.pid, l.tid) in threads:
                ks = launched.get(id(l), (None, []))[1]
                # a host wait: a synchronize, or a copy to the host that returned when the GPU got
                # there (it carries its own memcpy "kernel")
                wait = (l.dur >= _WAIT_MIN_US and _is_wait_candidate(l.name) and not is_kernel_launch(l.name)
                        and (not ks or all(kern[i].kind == "memcpy" for i in ks)))
                if ks or wait or is_kernel_launch(l.name):
                    self.events.append((l, ks, wait))
        self.events.sort(key=lambda e: e[0].ts)
        # the outermost torch op around each eager launch: a fix that removes all its kernels removes
        # its CPU time too (later launches of that thread move up by it)
        by_thread: dict = {}
        for o in index.aten_ops_between(lo - 1e4, hi):
            if (o.pid, o.tid) in threads:
                by_thread.setdefault((o.pid, o.tid), []).append(o)
        for th, ops in by_thread.items():  # by (start, -duration): TraceIndex.ops' order
            outer, end = [], float("-inf")
            for o in ops:
                if o.ts >= end:
                    outer.append(o)
                    end = o.ts + o.dur
            by_thread[th] = (outer, [o.ts for o in outer])
        self.op_of_event = []
        for l, ks, _ in self.events:
            op = None
            entry = by_thread.get((l.pid, l.tid))
            if entry and ks and not is_graph_launch(l.name):
                outer, starts = entry
                j = bisect.bisect_right(starts, l.ts) - 1
                if j >= 0 and outer[j].ts <= l.ts <= outer[j].ts + outer[j].dur:
                    op = outer[j]
            self.op_of_event.append(op)
        # per event, read by every run: (a graph launch, a kernel launch)
        self.kinds = [(is_graph_launch(l.name), is_kernel_launch(l.name)) for l, _, _ in self.events]

    @staticmethod
    def _graph_stream_joins(kern, launched) -> dict:
        """Inside one CUDA-graph launch, kernels on a second stream (SGLang's shared experts and MoE
        routing on an alternate stream) are ordered by the graph's event edges, which Kineto does not
        record: a kernel waits in the replay for the kernel of the same launch, on another stream, that
        ended last before it started (when that is later than its own stream's previous kernel ended),
        with the recorded gap. Without this the second stream's kernels kept their recorded times, and
        a fix that shortens the first stream's kernels saved nothing (a 10-layer MoE decode step: 10 ms
        of casts removed, 0.04 ms saved). Returns {kernel index: (the kernel it follows, gap µs)}."""
        import bisect

        out: dict = {}
        for l, ks in launched.values():
            if not is_graph_launch(l.name) or len({kern[i].stream for i in ks}) < 2:
                continue
            order = sorted(ks, key=lambda i: kern[i].ts)
            ends: list = []  # (end, index), sorted by end: the launch's kernels seen so far
            prev_on: dict = {}
            for i in order:
                k = kern[i]
                n = bisect.bisect_right(ends, (k.ts + 1.0, float("inf")))
                own = prev_on.get(k.stream)
                for m in range(n - 1, -1, -1):
                    e, j = ends[m]
                    if kern[j].stream != k.stream:
                        if own is None or e > kern[own].end:
                            out[i] = (j, max(0.0, k.ts - e))
                        break
                bisect.insort(ends, (k.end, i))
                prev_on[k.stream] = i
        return out

    def _cross_stream_waits(self, kern, by_corr, step, index, launched) -> dict:
        """Kernels that waited on another stream (cudaStreamWaitEvent on an event recorded there: an
        NCCL stream waiting for the compute that produced its buffer, compute waiting for the
        collective's result). Kineto does not say which stream an event was recorded on (its
        cuda_sync events, where enabled, carry ``wait_on_stream`` = -1 in torch 2.11), so a kernel
        that started later than its launch and its own stream allow is matched, first that applies:

        1. on the CPU: its thread called cudaStreamWaitEvent after that stream's previous launch, and
           before that cudaEventRecord: the event marks the last kernel the thread had launched on
           another stream before the record (``e.record(); s.wait_event(e)``, torch's pattern);
        2. on the GPU timeline: a kernel on another stream ended a few microseconds before it started
           (the wait was issued by another thread, or not recorded);
        3. held back by the SMs of another stream's kernel that was running all along and ended just
           after it started (two GEMMs on two streams run one after the other).

        Returns {kernel index: (the kernel it waited for, its start minus that kernel's end)}."""
        import bisect

        kernels_of = {id(l): ks for l, ks in launched.values()}
        prev_launch: dict = {}  # stream -> CPU time of the previous launch on it
        paired: dict = {}
        for i, k, l, g in self._lk:
            if l is None:
                continue
            lo = prev_launch.get(k.stream, l.ts - 2e4)
            prev_launch[k.stream] = l.ts
            if g:
                continue
            w = index.last_wait((l.pid, l.tid), lo, l.ts)
            if w is None:
                continue
            before = [c for c in index.launches_between(w.ts - 2e4, w.ts) if (c.pid, c.tid) == (l.pid, l.tid)]
            rec = next((c for c in reversed(before) if c.name.startswith("cudaEventRecord")), None)
            if rec is None:
                continue
            for c in reversed([c for c in before if c.ts < rec.ts]):
                ks = [j for j in kernels_of.get(id(c), ()) if kern[j].stream != k.stream]
                if ks:
                    j = max(ks, key=lambda x: kern[x].end)
                    if kern[j].end <= k.ts + 1.0:
                        paired[i] = (j, max(0.0, k.ts - kern[j].end))
                    break
                if kernels_of.get(id(c)):
                    break  # the last launch before the record was on its own stream: not this pattern

        ends = end_ts = None  # the step's kernel ends, sorted: built when a kernel needs them
        tol = 3 * self.latency_us + 5.0
        # a kernel can also wait for the SMs another stream's kernel holds: it starts as that kernel's
        # last wave drains, before its end (two GEMMs on two streams run one after the other)
        tail = 0.25
        dep: dict = {}
        prev_end: dict = {}
        for i, k, l, g in self._lk:
            pe = prev_end.get(k.stream)
            prev_end[k.stream] = k.ts + k.dur
            if l is None or g:
                continue
            expl = max(l.ts + self.latency_us, pe if pe is not None else float("-inf"))
            if k.ts - expl <= 3 * self.latency_us:
                continue  # its launch or its stream explains its start
            if i in paired:
                dep[i] = paired[i]
                continue
            if ends is None:
                ends = sorted((kern[j].end, j) for j in step.kernels)
                end_ts = [e for e, _ in ends]
            n = bisect.bisect_right(end_ts, k.ts + 1.0)
            for m in range(n - 1, -1, -1):  # the latest end on another stream before it started
                e, j = ends[m]
                if k.ts - e > tol:
                    break
                if kern[j].stream != k.stream and e > expl:
                    dep[i] = (j, max(0.0, k.ts - e))
                    break
            if i in dep:
                continue
            # held back by a kernel of another stream that was running all along and ended just after
            best = None
            for m in range(n, min(n + 64, len(ends))):
                e, j = ends[m]
                kj = kern[j]
                if e - k.ts > tail * kj.dur:
                    break
                if kj.stream != k.stream and kj.ts <= expl and kj.dur > 0:
                    best = (j, k.ts - e)
            if best is not None:
                dep[i] = best
        return dep

    def _plan(self) -> tuple:
        """What every :meth:`run` reads, flattened once per replay. Each kernel of the step has a slot (its
        position in ``step.kernels``); the replay keeps every kernel's new end in a list by slot, seeded
        with the recorded ends (a kernel waited for before the replay reaches it counts as recorded).
        A kernel's start is the latest of: its launch plus the launch latency, the new end of the kernel
        before it on its stream (plus its unexplained delay), of the kernel before it in its CUDA graph
        on its stream (plus the recorded gap), of the kernel another stream's it waits for (plus the
        gap), and its recorded start when it was the first on its stream. Which kernel precedes which
        is fixed by the replay's order, so each of those is a slot found here once; a missing one is
        the last slot, which holds -inf."""
        plan = self.__dict__.get("_plan_cache")
        if plan is not None:
            return plan
        kern = self.trace.kernels
        ninf = float("-inf")
        delay, first_on_stream, dep, graph_dep = self.delay, self.first_on_stream, self.dep, self.graph_dep
        kidx = self.step.kernels
        slot = {i: n for n, i in enumerate(kidx)}
        none = len(kidx)  # the -inf slot
        ks_ = [kern[i] for i in kidx]
        rec_end = [k.ts + k.dur for k in ks_] + [ninf]
        durs = [k.dur for k in ks_]
        # kernels with more than their stream and graph order to keep: a wait, a delay, a first start
        special = set(graph_dep) | set(dep) | set(first_on_stream) | set(delay)
        prev_on: dict = {}  # stream -> (slot, recorded end, event) of the kernel the replay last ran on it
        events = []
        orig_done = ninf
        for n, (l, ks, wait) in enumerate(self.events):
            graph, launch = self.kinds[n]
            o = self.op_of_event[n]
            kplan = []
            ss = []  # the event's kernels' slots
            for i in ks:
                k = kern[i]
                st, kts, kdur = k.stream, k.ts, k.dur
                kend = kts + kdur
                p = slot[i]
                ss.append(p)
                # the anchor: the kernel before it on its stream (plus its delay); in a graph launch, the
                # one before it in the launch on its stream, with the recorded gap (never less than the
                # stream's own order, as the gap is not negative and graph kernels have no delay)
                prev = prev_on.get(st)
                a = none if prev is None else prev[0]
                add = 0.0
                extra = None
                gd = None
                if i in special:
                    gd = graph_dep.get(i)
                    dp = dep.get(i)
                    fos = first_on_stream.get(i, ninf)
                    add = delay.get(i, 0.0)
                    if gd is not None or dp is not None or fos > ninf:
                        extra = (none if gd is None else slot[gd[0]], 0.0 if gd is None else gd[1],
                                 none if dp is None else slot[dp[0]], 0.0 if dp is None else dp[1], fos)
                if graph and gd is None and prev is not None and prev[2] == n:
                    gap = kts - prev[1]
                    add = gap if gap > 0.0 else 0.0
                kplan.append((p, a, add, extra, kdur == 0))
                prev_on[st] = (p, kend, n)
                if kend > orig_done:
                    orig_done = kend
            # a host wait ends when the GPU work before it (its own copy included) is done in the new timeline:
            # how long after that it returned (as recorded), or None when it is no such wait
            wait_extra = None
            if wait and orig_done > ninf and l.ts + l.dur >= orig_done - 2.0:
                extra = l.ts + l.dur - orig_done
                wait_extra = extra if extra > 0.0 else 0.0
            events.append(((l.pid, l.tid), l.ts, l.dur, l.ts + l.dur, o, None if o is None else id(o), graph,
                           bool(ks) and launch, wait_extra, ss, kplan))
        ops = list({id(o): o for o in self.op_of_event if o is not None}.values())
        orphans = [(slot[i], kern[i].ts) for i in self.orphans]
        plan = self._plan_cache = (events, ops, orphans, rec_end, durs, [e[9] for e in events])
        return plan

    def durations(self, duration: Callable[[int], float]) -> list:
        """``duration(kernel index)`` of each kernel of the step, by slot (``step.kernels`` order)."""
        return [duration(i) for i in self.step.kernels]

    def run(self, duration: Callable[[int], float], timeline: str = "recorded") -> dict:
        """Replay with ``duration(kernel index) -> µs``.

        ``timeline="recorded"``: launches keep their recorded CPU times (less the CPU time of torch ops
        the fix removes, and host waits that end earlier). ``"launch-api"``: each thread only spends
        its runtime calls' own time (back to back, no Python or torch time between them): a lower
        bound on any run's CPU, the profiled one included. Returns {span_us, last_end_us, last_launch_us}."""
        return self.run_slots(self.durations(duration), timeline)

    def prepare(self, nd: list) -> tuple:
        """What every replay of the new durations ``nd`` (by slot) reads, whichever its timeline: the
        durations clamped at 0, which launches the fix removes (all their kernels go), and which torch
        ops it keeps (one of their launches stays)."""
        events, _, _, _, durs, ev_slots = self._plan()
        new_d = [v if v > 0.0 else 0.0 for v in map(float, nd)]
        # the kernels the fix removes (0 µs now, not before): a launch all of whose kernels go costs no CPU
        # time on the launch-api timeline, and a torch op all of whose launches go is removed
        removed = [n for n, v in enumerate(new_d) if v == 0.0 and durs[n] > 0]
        if removed:
            rset = set(removed)
            gone = [bool(ss) and rset.issuperset(ss) for ss in ev_slots]
        else:
            gone = [False] * len(events)
        keep_op: dict = {}
        for n, e in enumerate(events):
            if e[4] is not None:
                keep_op[e[5]] = keep_op.get(e[5], False) or not gone[n]
        return new_d, gone, keep_op

    def run_slots(self, nd: list, timeline: str = "recorded", prepared: Optional[tuple] = None) -> dict:
        """:meth:`run` with the new durations by slot (``nd[n]``: µs of ``step.kernels[n]``);
        ``prepared``: :meth:`prepare` of ``nd``, when the caller has it."""
        events, ops, orphans, rec_end, durs, ev_slots = self._plan()
        ninf, inf = float("-inf"), float("inf")
        new_d, gone, keep_op = prepared if prepared is not None else self.prepare(nd)
        removed_op_done: set = set()
        clock: dict = {}  # thread -> its CPU time in the new timeline (launch-api) / shift (recorded)
        shift: dict = {}
        ne = list(rec_end)  # each kernel's end: as replayed once the replay reached it, as recorded before
        new_done = last_end = last_launch = ninf
        first = inf
        latency = self.latency_us
        api = timeline == "launch-api"
        for n, (th, lts, ldur, lend, o, oid, _graph, launched, wait_extra, _, kplan) in enumerate(events):
            if api:
                t = clock.get(th, lts)
                lo = lts - 1e12
                if lo > t:
                    t = lo
                cost = 0.0 if gone[n] else ldur
            else:
                t = lts + shift.get(th, 0.0)
                cost = ldur
                if o is not None and not keep_op[oid] and oid not in removed_op_done:
                    removed_op_done.add(oid)
                    shift[th] = shift.get(th, 0.0) - o.dur  # the op's whole CPU time goes
                    t = lts + shift[th]
            end = t + cost
            if launched and t > last_launch:
                last_launch = t
            ready = t + latency
            for p, a, add, extra, zero in kplan:
                start = ne[a] + add
                if ready > start:
                    start = ready
                if extra is not None:
                    gs, gg, ds, dg, fos = extra
                    if fos > start:
                        start = fos
                    x = ne[gs] + gg  # ordered after another stream's kernel of the same graph
                    if x > start:
                        start = x
                    x = ne[ds] + dg  # it waits for another stream's kernel (gap < 0: it held the SMs)
                    if x > start:
                        start = x
                d = new_d[p]
                e_new = start + d
                ne[p] = e_new
                if d > 0 or zero:  # a kernel the fix removes neither starts nor ends the step
                    if start < first:
                        first = start
                    if e_new > last_end:
                        last_end = e_new
                if e_new > new_done:
                    new_done = e_new
            if wait_extra is not None:
                a = t + (ldur if _WAIT_MIN_US > ldur else _WAIT_MIN_US)
                b = new_done + wait_extra
                end = b if b > a else a
            if api:
                clock[th] = end
            else:
                shift[th] = end - lend
        for p, kts in orphans:
            if kts < first:
                first = kts
            x = kts + new_d[p]
            if x > last_end:
                last_end = x
        # CPU time of the torch ops the fix removes (all their kernels gone): the host saves it too
        removed_cpu = sum(o.dur for o in ops if not keep_op[id(o)])
        if first == inf:
            return {"span_us": 0.0, "last_end_us": 0.0, "last_launch_us": 0.0, "removed_cpu_us": removed_cpu}
        return {"span_us": last_end - first, "last_end_us": last_end, "last_launch_us": last_launch,
                "removed_cpu_us": removed_cpu}


def _back_to_back_us(kern, idx, duration) -> float:
    """The GPU work of kernels ``idx`` with ``duration(i)`` µs each, back to back: each stream's kernels
    one after another, streams side by side (the busiest stream's total)."""
    per: dict = {}
    for i in idx:
        per[kern[i].stream] = per.get(kern[i].stream, 0.0) + max(0.0, float(duration(i)))
    return max(per.values(), default=0.0)


def host_wait_us(l, copies) -> float:
    """How long runtime call ``l`` blocked the host on the GPU: a synchronize, or a copy to the host
    that returned only when its copy (``copies``: its memcpy activities) was done."""
    if l.dur < _WAIT_MIN_US:
        return 0.0
    if "Synchronize" in l.name:
        return l.dur
    if l.name.startswith(("cudaMemcpy", "hipMemcpy", "cuMemcpy")) and copies:
        end = max(k.end for k in copies)
        if l.ts + l.dur >= end - 2.0:  # it returned when its copy ended: it waited for the GPU
            return max(0.0, l.dur - _WAIT_MIN_US)
    return 0.0


def host_busy(trace: Trace, steps: list[Step], by_corr: Optional[dict] = None,
              index: Optional[TraceIndex] = None) -> dict:
    """The host's own time per step: from a step's start to the next step's start on the thread that
    launches the steps' GPU work, less the time it blocked on the GPU (synchronizes, copies to the host
    that waited for their data). With the GPU work gone, a step cannot take less than this: the
    scheduler, input preparation, the graph or kernel launches and the result processing still run.

    Returns {id(step): busy µs} for each step that has a next one (the last step's end is unknown)."""
    index = index or TraceIndex(trace)
    by_corr = by_corr if by_corr is not None else {l.corr: l for l in trace.launches if l.corr is not None}
    kern = trace.kernels
    count: dict = {}
    copies: dict = {}  # corr -> the memcpy activities of that call
    # kernels per launching thread (counted per correlation id first: one launch, one thread)
    per_corr = Counter(kern[i].corr for s in steps for i in s.kernels)
    for corr, n in per_corr.items():
        l = by_corr.get(corr)
        if l is not None:
            count[(l.pid, l.tid)] = count.get((l.pid, l.tid), 0) + n
    if not count:
        return {}
    thread = max(count, key=count.get)
    for k in kern:
        if k.kind == "memcpy" and k.corr is not None:
            copies.setdefault(k.corr, []).append(k)
    ordered = sorted((s for s in steps if s.kernels), key=lambda s: s.cpu_start)
    out = {}
    for a, b in zip(ordered, ordered[1:]):
        lo, hi = a.cpu_start, b.cpu_start
        if hi <= lo:
            continue
        wait = 0.0
        for l in index.launches_between(lo, hi):
            if l.dur >= _WAIT_MIN_US and (l.pid, l.tid) == thread:  # a shorter call waited for nothing
                wait += host_wait_us(l, copies.get(l.corr))
        out[id(a)] = max(0.0, (hi - lo) - wait)
    return out


def _indexes(trace: Trace) -> tuple[dict, TraceIndex]:
    """The trace's launches by correlation id and its :class:`TraceIndex`, built once per trace (every
    finding and alternative of one analysis replays the same steps)."""
    m = trace.memo.get("stepmodel")
    if m is None:
        m = trace.memo["stepmodel"] = {"by_corr": launches_by_corr(trace), "index": TraceIndex(trace),
                                       "replay": {}, "busy": {}}
    return m["by_corr"], m["index"]


def _host_busy_once(trace: Trace, steps: list[Step], by_corr: dict, index: TraceIndex) -> dict:
    """:func:`host_busy` of these steps, computed once per trace (read only)."""
    memo = trace.memo["stepmodel"]["busy"]
    key = tuple(map(id, steps))
    hit = memo.get(key)
    if hit is None or any(a is not b for a, b in zip(hit[0], steps)):
        hit = memo[key] = (list(steps), host_busy(trace, steps, by_corr, index))  # the steps held: ids stay theirs
    return hit[1]


def host_busy_of(trace: Trace, steps: list[Step]) -> dict:
    """:func:`host_busy` of these steps with the analysis' shared indexes, once per trace (read only):
    the idle rules and the predictions read the same numbers."""
    by_corr, index = _indexes(trace)
    return _host_busy_once(trace, steps, by_corr, index)


def _replay_once(trace: Trace, step: Step, by_corr: dict, index: TraceIndex) -> tuple[StepReplay, dict]:
    """The step's :class:`StepReplay` and its replay with the recorded durations, built once per trace."""
    memo = trace.memo["stepmodel"]["replay"]
    hit = memo.get(id(step))
    if hit is None or hit[0] is not step:
        r = StepReplay(trace, step, by_corr, index)
        hit = memo[id(step)] = (step, r, r.run_slots(r._plan()[4]))
    return hit[1], hit[2]


def _mostly_graph(r: StepReplay, kern, s: Step, by_corr: dict) -> bool:
    """Whether graph launches ran at least half the step's GPU time (once per replay)."""
    hit = r.__dict__.get("_mostly_graph")
    if hit is None:
        graph = {i: g for i, _, _, g in r._lk}
        durs = r._plan()[4]
        graph_k = sum([d for i, d in zip(s.kernels, durs) if graph[i]])
        hit = r._mostly_graph = graph_k >= 0.5 * sum(durs)
    return hit


def _streams(r: StepReplay) -> list:
    """Each kernel's stream by slot (``step.kernels`` order), once per replay."""
    hit = r.__dict__.get("_streams")
    if hit is None:
        kern = r.trace.kernels
        hit = r._streams = [kern[i].stream for i in r.step.kernels]
    return hit


def _back_to_back_slots(streams: list, nd: list) -> float:
    """:func:`_back_to_back_us` with the durations by slot, each at least 0."""
    per: dict = {}
    for st, v in zip(streams, nd):  # nd: clamped at 0 already (StepReplay.prepare)
        per[st] = per.get(st, 0.0) + v
    return max(per.values(), default=0.0)


def predict_after(trace: Trace, steps: list[Step], step_ms: float, new_duration: Callable[[int], Optional[float]],
                  added_us_per_step: float = 0.0) -> dict:
    """The step after a fix that changes kernel durations (``new_duration(i)``: µs, or None = unchanged).

    ``added_us_per_step``: GPU time of kernels the fix adds (e.g. one fused sampling kernel), put
    at the step's end. Returns the prediction and how it was bound."""
    kern = trace.kernels
    by_corr, index = _indexes(trace)
    saved, low_after, kernel_saved, launch_bound = [], [], [], 0
    busy = _host_busy_once(trace, steps, by_corr, index)
    host_left = []  # per step with a next one: the host's own time, less the CPU time of ops the fix removes
    host_before, removed = [], []  # the same before the fix, and the CPU time of the ops it removes
    busy_after, graph_steps = [], 0  # the GPU's busy time per step after the fix; steps mostly graph-replayed
    for s in steps:
        if not s.kernels:
            continue
        r, base = _replay_once(trace, s, by_corr, index)
        durs = r._plan()[4]
        # the step's new durations by slot (step.kernels order), asked once per kernel
        nd = []
        for i, d in zip(s.kernels, durs):
            v = new_duration(i)
            nd.append(d if v is None else v)
        prep = r.prepare(nd)
        after = r.run_slots(nd, prepared=prep)
        if id(s) in busy:
            host_left.append(max(0.0, busy[id(s)] - after["removed_cpu_us"]))
            host_before.append(busy[id(s)])
            removed.append(after["removed_cpu_us"])
        ks = sum(map(operator.sub, durs, nd)) - added_us_per_step
        saved.append(base["span_us"] - after["span_us"] - added_us_per_step)
        kernel_saved.append(ks)
        # the lower bound: the GPU work left, and the runtime calls alone back to back
        low = r.run_slots(nd, timeline="launch-api", prepared=prep)
        busy_after.append(_back_to_back_slots(_streams(r), prep[0]) + added_us_per_step)
        graph_steps += _mostly_graph(r, kern, s, by_corr)
        gpu_left = s.gpu_us - ks
        low_after.append(max(low["span_us"] + added_us_per_step, gpu_left, 0.0))
        # launch-bound: the replayed step ends within a few launch latencies of its last launch
        if after["last_launch_us"] + 3 * r.latency_us >= after["last_end_us"]:
            launch_bound += 1
    if not saved:
        return {}
    sv = statistics.median(saved) / 1e3
    ks = statistics.median(kernel_saved) / 1e3
    gpu_pred = max(step_ms - sv, 0.0)
    host = statistics.median(host_left) / 1e3 if host_left else None
    lower = min(statistics.median(low_after) / 1e3, gpu_pred)
    return {
        # the GPU side only: perfscope.analysis.hosttime adds the host's unprofiled time (rules.model_prediction)
        "predicted_step_ms": round(gpu_pred, 4),
        "bound": "gpu",
        "gpu_prediction_ms": round(gpu_pred, 4),
        "host_floor_ms": round(host, 4) if host is not None else None,  # profiled: the host's busy time left
        "lower_bound_ms": round(lower, 4),
        "gpu_busy_after_ms": round(statistics.median(busy_after) / 1e3, 4),
        "graph_steps": graph_steps >= len(saved) / 2,
        "host_busy_ms": round(statistics.median(host_before) / 1e3, 4) if host_before else None,
        # the quickest tenth of the steps: the host least disturbed by the profiler (its buffer flushes)
        # and by waking from long waits on a slow GPU; perfscope.analysis.hosttime scales this one
        "host_busy_quick_ms": round(sorted(host_before)[len(host_before) // 10] / 1e3, 4) if host_before else None,
        "removed_cpu_ms": round(statistics.median(removed) / 1e3, 4) if removed else 0.0,
        "kernel_time_saved_ms": round(ks, 4),
        "step_time_saved_ms": round(sv, 4),
        "kernel_only_prediction_ms": round(max(step_ms - ks, 0.0), 4),
        "launch_bound_steps": f"{launch_bound}/{len(saved)}",
        "model": "CPU launch timeline replay (perfscope.analysis.stepmodel): the GPU work on this trace's "
                 "recorded launch times; host_floor_ms the profiled host's busy time per step left after the "
                 "fix; lower_bound_ms with only the runtime calls' own CPU time",
    }


def predict_after_serial(trace: Trace, steps: list[Step], new_duration: Callable[[int], Optional[float]],
                         added_us_per_step: float = 0.0) -> dict:
    """The step after a fix on a CPU-only trace (ops as kernels, perfscope.analysis.cpu_ops).

    A thread runs its ops one after another, so a step shortens by exactly the self time the fix
    removes from it. Each step is paired with its own saving (median over steps of step - saving):
    subtracting a mean saving from the median step mixes two statistics, and one slow step (a busy
    host) makes the mean saving exceed the median step, predicting 0 ms."""
    kern = trace.kernels
    after, saved = [], []
    for s in steps:
        if not s.kernels:
            continue
        sv = 0.0
        for i in s.kernels:
            v = new_duration(i)
            if v is not None:
                sv += kern[i].dur - max(0.0, float(v))
        sv -= added_us_per_step
        saved.append(sv)
        after.append(max(s.gpu_us - sv, 0.0))
    if not after:
        return {}
    pred = statistics.median(after) / 1e3
    sv = statistics.median(saved) / 1e3
    return {
        "predicted_step_ms": round(pred, 4),
        "kernel_time_saved_ms": round(sv, 4),
        "step_time_saved_ms": round(sv, 4),
        "model": "CPU-only trace: the step's thread runs its ops serially, so each step shortens by the "
                 "op self time the fix removes from it (median over steps of the step minus its own saving)",
    }
