"""The dominant GPU ops of the analysed steps, with who launched them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from perfscope.analysis.attribution import Attribution, Attributor
from perfscope.analysis.buckets import classify
from perfscope.analysis.names import short_name
from perfscope.analysis.steps import Step
from perfscope.load.model import Trace


@dataclass
class Op:
    name: str  # the kernel's full name
    short: str
    bucket: str
    sub: str
    ms_per_step: float
    count_per_step: float
    share: float  # of kernel time in the analysed steps
    avg_us: float
    grid: Optional[tuple] = None
    block: Optional[tuple] = None
    attribution: Attribution = field(default_factory=Attribution)
    sample: int = -1  # index of one instance in trace.kernels

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("attribution", "sample")}
        d["grid"] = list(self.grid) if self.grid else None
        d["block"] = list(self.block) if self.block else None
        d.update(self.attribution.to_dict())
        return d


def top_ops(trace: Trace, steps: list[Step], attributor: Attributor, limit: int = 25) -> list[Op]:
    """Kernels of ``steps`` grouped by name, largest first; the first ``limit`` get attributed."""
    if not steps:
        return []
    kern = trace.kernels
    total: dict[str, float] = {}
    count: Counter = Counter()
    sample: dict[str, int] = {}
    geo: dict[str, Counter] = {}
    for s in steps:
        for i in s.kernels:
            k = kern[i]
            total[k.name] = total.get(k.name, 0.0) + k.dur
            count[k.name] += 1
            if k.name not in sample:
                sample[k.name] = i
            geo.setdefault(k.name, Counter())[(k.grid, k.block)] += 1
    n = len(steps)
    all_us = sum(total.values()) or 1.0
    ops = []
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:limit]:
        k = kern[sample[name]]
        bucket, sub = classify(name, k.kind)
        (grid, block), _ = geo[name].most_common(1)[0]
        ops.append(Op(
            name=name, short=short_name(name), bucket=bucket, sub=sub, ms_per_step=us / n / 1e3,
            count_per_step=count[name] / n, share=us / all_us, avg_us=us / count[name],
            grid=grid, block=block, attribution=attributor.attribute(k), sample=sample[name],
        ))
    return ops
