"""How a replay's plan lays out a launch's kernels: slot numbers, a flat plan for a launch of many, and a
chain: the kernels of a CUDA-graph launch on one stream, one after another, planned and replayed in C.

In a chain each kernel after the first starts at the previous one's new end plus the recorded gap (not
negative), or when its launch is ready if that is later. The first kernel starts no earlier than that,
and starts and ends only grow along a chain (gaps and durations are not negative): the launch never
holds a later kernel back. So a kernel's end is ``(previous end + gap) + duration``, the running sum of
[first end, gap, duration, gap, duration, ...] that ``itertools.accumulate`` adds in the same order, one
float addition after another, as the replay's loop adds them; and the first kernel the fix keeps and
the last one are the chain's earliest start and latest end."""

from __future__ import annotations

import operator
from itertools import accumulate
from typing import Optional

from perfscope.load.model import KERNEL_STREAM, KERNEL_TS

_SLOTS: list[int] = []  # the slot numbers 0, 1, ...: one int object each, shared by every replay's plan


def slots(n: int) -> list[int]:
    """The slot numbers 0 .. n-1 (ints above 256 are objects of their own: made once, not per step)."""
    if len(_SLOTS) < n:
        _SLOTS.extend(range(len(_SLOTS), n))
    return _SLOTS[:n]


class Flat4:
    """A launch's kernel plan as one flat list (slot, anchor, gap, extra, slot, ...), iterated as 4-tuples:
    a CUDA graph launch plans hundreds of kernels, and a tuple each would take twice the memory."""

    __slots__ = ("flat",)

    def __init__(self, flat: list):
        self.flat = flat

    def __iter__(self):
        it = iter(self.flat)
        return zip(it, it, it, it)


FLAT_FROM = 16  # kernels in one launch from which its plan is kept flat (fewer: a tuple per kernel)
CHAIN_FROM = 16  # kernels in one CUDA-graph launch from which it is replayed as a chain when it is one


def chain_gaps(kern, ks: list, ss: list, rec_end: list) -> Optional[list]:
    """The recorded gap before each kernel of a graph launch after its first (``ks``: its kernels in replay
    order, ``ss`` their slots), not below 0, when they are a chain: all on one stream, in consecutive
    slots (the caller checks that no kernel after the first has a wait, delay or first start to keep).
    None otherwise."""
    n = len(ks)
    if n < CHAIN_FROM:
        return None
    s0 = ss[0]
    if ss != list(range(s0, s0 + n)):
        return None
    kk = list(map(kern.__getitem__, ks))
    streams = list(map(KERNEL_STREAM, kk))
    if streams.count(streams[0]) != n:
        return None
    # start - the previous kernel's recorded end; one below 0 (kernels of one stream that overlap) is 0
    gaps = list(map(operator.sub, map(KERNEL_TS, kk[1:]), rec_end[s0 : s0 + n - 1]))
    if min(gaps) < 0.0:
        gaps = [g if g > 0.0 else 0.0 for g in gaps]
    return gaps


def run_chain(
    ne: list, new_d: list, durs: list, s0: int, gaps: list, first: float, last_end: float, done: float
) -> tuple[float, float, float]:
    """Replay the chain after its first kernel (slot ``s0``, replayed already: its new end in ``ne``): each
    kernel's new end into ``ne``; returns (first, last_end, done) updated as the replay's loop updates them
    (the earliest start and latest end of the kernels the fix keeps, the latest end of all)."""
    m = len(gaps)
    lo = s0 + 1
    seq = [ne[s0]] * (2 * m + 1)
    seq[1::2] = gaps
    seq[2::2] = new_d[lo : lo + m]
    acc = list(accumulate(seq))  # end, start, end, start, end, ... (accumulate's own addition: a + b, in C)
    ne[lo : lo + m] = acc[2::2]
    for j in range(m):  # the first kernel the fix keeps: the chain's earliest start
        p = lo + j
        if new_d[p] > 0 or durs[p] == 0:
            if acc[2 * j + 1] < first:
                first = acc[2 * j + 1]
            break
    for j in range(m - 1, -1, -1):  # the last one: its latest end
        p = lo + j
        if new_d[p] > 0 or durs[p] == 0:
            if acc[2 * j + 2] > last_end:
                last_end = acc[2 * j + 2]
            break
    if acc[-1] > done:
        done = acc[-1]
    return first, last_end, done
