"""The dominant GPU ops of the analysed steps, with who launched them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Optional

from perfscope.analysis.attribution import Attribution, Attributor
from perfscope.analysis.buckets import classify
from perfscope.analysis.names import short_name
from perfscope.analysis.sampling_path import step_overrides
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

    @classmethod
    def from_dict(cls, d: dict) -> "Op":
        """The op of ``to_dict``'s JSON (no ``sample``: the trace is not at hand)."""
        own = {f.name for f in fields(cls)} - {"attribution", "sample"}
        kw = {k: d[k] for k in own if k in d}
        for k in ("grid", "block"):
            kw[k] = tuple(d[k]) if d.get(k) else None
        attr = Attribution(**{f.name: d[f.name] for f in fields(Attribution) if f.name in d})
        return cls(**kw, attribution=attr)


def top_ops(trace: Trace, steps: list[Step], attributor: Attributor, limit: int = 25) -> list[Op]:
    """Kernels of ``steps`` grouped by name, largest first; the first ``limit`` get attributed."""
    if not steps:
        return []
    kern = trace.kernels
    total: dict = {}
    count: dict = {}
    sample: dict = {}
    geo: dict = {}
    seen: set = set()  # a CPU op's self time comes in pieces (one per gap between its children)
    sig = attributor.signature
    over: dict = {}  # torch top-k / sort kernels a GEMM follows: not sampling (sampling_path.step_overrides)
    for s in steps:
        over.update(step_overrides(trace, s, serving=False))
        for i in s.kernels:
            k = kern[i]
            cpu = k.kind == "cpu"
            key = sig(k) if cpu else k.name  # the signature of a GPU kernel is its name
            total[key] = total.get(key, 0.0) + k.dur
            if cpu and k.corr >= 0:
                if (key, k.corr) in seen:
                    continue
                seen.add((key, k.corr))
            count[key] = count.get(key, 0) + 1
            g = geo.get(key)
            if g is None:
                sample[key] = i
                g = geo[key] = {}
            shape = (k.grid, k.block)
            g[shape] = g.get(shape, 0) + 1
    n = len(steps)
    all_us = sum(total.values()) or 1.0
    ops = []
    for key, us in sorted(total.items(), key=lambda kv: -kv[1])[:limit]:
        k = kern[sample[key]]
        bucket, sub = over.get(sample[key]) or classify(k.name, k.kind)
        (grid, block), _ = Counter(geo[key]).most_common(1)[0]
        ops.append(
            Op(
                name=k.name,
                short=short_name(k.name),
                bucket=bucket,
                sub=sub,
                ms_per_step=us / n / 1e3,
                count_per_step=count[key] / n,
                share=us / all_us,
                avg_us=us / count[key],
                grid=grid,
                block=block,
                attribution=attributor.attribute(k),
                sample=sample[key],
            )
        )
    return ops
