"""One step replayed on the CPU launch timeline with new kernel durations (:class:`StepReplay`)."""

from __future__ import annotations

import bisect
import operator
from typing import Callable, Optional

from perfscope.analysis.stepmodel import chain
from perfscope.analysis.stepmodel.chain import Flat4, run_chain, slots
from perfscope.analysis.stepmodel.index import WAIT_MIN_US, TraceIndex, is_wait_candidate
from perfscope.analysis.stepmodel.waits import cross_stream_waits, graph_stream_joins
from perfscope.analysis.steps import Step, is_graph_launch, is_kernel_launch
from perfscope.load.model import KERNEL_DUR, KERNEL_TS, Launch, Trace


class StepReplay:
    """One step's kernels and the runtime calls around them, ready to be replayed with new durations."""

    def __init__(self, trace: Trace, step: Step, by_corr: Optional[dict] = None, index: Optional["TraceIndex"] = None):
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
        corr: Optional[int] = None  # the previous kernel's correlation id
        cached: Optional[tuple[Optional[Launch], bool, list[int]]] = None  # and (launch, graph?, its kernels)
        for i in sorted(step.kernels, key=lambda j: kern[j].ts):
            k = kern[i]
            if cached is None or k.corr != corr:  # a graph launch's kernels share one id: looked up once
                corr = k.corr
                l = by_corr.get(corr)
                if l is None:
                    cached = (None, False, [])
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
        # whether each kernel (by slot: ``step.kernels`` order) ran in a graph launch, a byte each
        if not eager and not self.orphans:  # every kernel in a graph launch (a CUDA-graph decode step)
            self.graph_slots = b"\x01" * len(step.kernels)
        else:
            graph_of_kernel = {i: g for i, _, _, g in lk}
            self.graph_slots = bytes([graph_of_kernel[i] for i in step.kernels])
            del graph_of_kernel
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
            self.dep = cross_stream_waits(lk, self.latency_us, kern, by_corr, step, index, launched)
        else:  # graph replays only: no delay to keep and no wait to follow, each stream's first start kept
            seen: set = set()
            for i, k, _, _ in lk:
                if k.stream not in seen:
                    seen.add(k.stream)
                    self.first_on_stream[i] = k.ts
            self.dep = {}
        self.graph_dep = graph_stream_joins(kern, launched)
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
                wait = (
                    l.dur >= WAIT_MIN_US
                    and is_wait_candidate(l.name)
                    and not is_kernel_launch(l.name)
                    and (not ks or all(kern[i].kind == "memcpy" for i in ks))
                )
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
        # caches filled on first use: the flattened plan (:meth:`_plan`) and, for stepmodel.predict, whether
        # graph launches ran most of the step and each slot's stream
        self._plan_cache: Optional[tuple] = None
        self._mostly_graph: Optional[bool] = None
        self._streams: Optional[list] = None
        self._rec_clamped: Optional[list] = None  # the recorded durations clamped at 0 (prepare)

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
        plan = self._plan_cache
        if plan is not None:
            return plan
        kern = self.trace.kernels
        ninf = float("-inf")
        delay, first_on_stream, dep, graph_dep = self.delay, self.first_on_stream, self.dep, self.graph_dep
        kidx = self.step.kernels
        slot = dict(zip(kidx, slots(len(kidx))))
        none = len(kidx)  # the -inf slot
        ks_ = list(map(kern.__getitem__, kidx))
        durs = list(map(KERNEL_DUR, ks_))
        rec_end = list(map(operator.add, map(KERNEL_TS, ks_), durs)) + [ninf]
        # kernels with more than their stream and graph order to keep: a wait, a delay, a first start
        special = set(graph_dep) | set(dep) | set(first_on_stream) | set(delay)
        prev_on: dict = {}  # stream -> (slot, recorded end, event) of the kernel the replay last ran on it
        events = []
        orig_done = ninf
        for n, (l, ks, wait) in enumerate(self.events):
            graph, launch = self.kinds[n]
            o = self.op_of_event[n]
            ss = list(map(slot.__getitem__, ks))  # the event's kernels' slots
            # a graph launch's kernels on one stream, one after another (perfscope.analysis.stepmodel.chain):
            # its first kernel planned as any other, the rest replayed in C
            gaps = chain.chain_gaps(kern, ks, ss, rec_end) if graph and special.isdisjoint(ks[1:]) else None
            # per kernel: its slot, its anchor's slot, the gap after it, its extra anchors (a launch of many
            # kernels: the four flat, one after another)
            kplan: list = []
            flat = gaps is None and len(ks) >= chain.FLAT_FROM
            put = kplan.extend if flat else kplan.append
            for i, p in zip(ks[:1] if gaps is not None else ks, ss):
                k = kern[i]
                st, kts, kend = k[3], k[1], rec_end[p]  # Kernel: its stream and start by position (read once each)
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
                        extra = (
                            none if gd is None else slot[gd[0]],
                            0.0 if gd is None else gd[1],
                            none if dp is None else slot[dp[0]],
                            0.0 if dp is None else dp[1],
                            fos,
                        )
                if graph and gd is None and prev is not None and prev[2] == n:
                    gap = kts - prev[1]
                    add = gap if gap > 0.0 else 0.0
                put((p, a, add, extra))
                prev_on[st] = (p, kend, n)
                if kend > orig_done:
                    orig_done = kend
            if gaps is not None:  # the chain's last kernel is the last its stream ran; the latest recorded end
                last = ss[-1]
                prev_on[kern[ks[0]][3]] = (last, rec_end[last], n)
                orig_done = max(orig_done, max(rec_end[ss[0] : last + 1]))
            # a host wait ends when the GPU work before it (its own copy included) is done in the new timeline:
            # how long after that it returned (as recorded), or None when it is no such wait
            wait_extra = None
            if wait and orig_done > ninf and l.ts + l.dur >= orig_done - 2.0:
                extra = l.ts + l.dur - orig_done
                wait_extra = extra if extra > 0.0 else 0.0
            events.append(
                (
                    (l.pid, l.tid),
                    l.ts,
                    l.dur,
                    l.ts + l.dur,
                    o,
                    None if o is None else id(o),
                    graph,
                    bool(ks) and launch,
                    wait_extra,
                    ss,
                    Flat4(kplan) if flat else kplan,
                    None if gaps is None else (ss[0], gaps),
                )
            )
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

    def prepare(self, nd: list, changed: Optional[list] = None) -> tuple:
        """What every replay of the new durations ``nd`` (by slot) reads, whichever its timeline: the
        durations clamped at 0, which launches the fix removes (all their kernels go), and which torch
        ops it keeps (one of their launches stays). ``changed``: the slots, in order, where ``nd`` is
        not the recorded duration, when the caller knows them (the others are the recorded ones)."""
        events, _, _, _, durs, ev_slots = self._plan()
        if changed is None:
            new_d = [v if v > 0.0 else 0.0 for v in map(float, nd)]
            # the kernels the fix removes (0 µs now, not before): a launch all of whose kernels go costs no
            # CPU time on the launch-api timeline, and a torch op all of whose launches go is removed
            removed = [n for n, v in enumerate(new_d) if v == 0.0 and durs[n] > 0]
        else:
            # the recorded durations clamped (once per replay), the changed slots' own; a slot that keeps
            # its recorded duration is never removed (0 after the clamp only when it was not above 0)
            rec = self._rec_clamped
            if rec is None:
                rec = self._rec_clamped = [v if v > 0.0 else 0.0 for v in map(float, durs)]
            new_d = list(rec)
            for p in changed:
                v = float(nd[p])
                new_d[p] = v if v > 0.0 else 0.0
            removed = [p for p in changed if new_d[p] == 0.0 and durs[p] > 0]
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
        for n, (th, lts, ldur, lend, o, oid, _graph, launched, wait_extra, _, kplan, chained) in enumerate(events):
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
            for p, a, add, extra in kplan:
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
                if d > 0 or durs[p] == 0:  # a kernel the fix removes neither starts nor ends the step
                    if start < first:
                        first = start
                    if e_new > last_end:
                        last_end = e_new
                if e_new > new_done:
                    new_done = e_new
            if chained is not None:
                s0, gaps = chained
                first, last_end, new_done = run_chain(ne, new_d, durs, s0, gaps, first, last_end, new_done)
            if wait_extra is not None:
                a = t + (ldur if WAIT_MIN_US > ldur else WAIT_MIN_US)
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
        return {
            "span_us": last_end - first,
            "last_end_us": last_end,
            "last_launch_us": last_launch,
            "removed_cpu_us": removed_cpu,
        }
