"""What a rule is, what it sees, and what it reports.

A rule is one unit with a stable id and a fixed doc (what it finds, why it is slow, the evidence it
reads, the fix, known false positives), and one method, ``check(ctx) -> Finding | None``. Rules are
pure: they read the :class:`RuleContext` and return a finding or nothing. docs/rules.md is generated
from these docs (``perfscope rules --markdown``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Optional

from perfscope.analysis.finding import Finding

if TYPE_CHECKING:
    from perfscope.analysis.attribution import Attributor
    from perfscope.analysis.metrics import StepMetrics
    from perfscope.analysis.ops import Op
    from perfscope.analysis.steps import Step, StepSet
    from perfscope.load.model import Trace

CONFIDENCE = ("low", "medium", "high")


@dataclass
class RuleContext:
    trace: "Trace"
    stepset: "StepSet"
    steps: list["Step"]  # the analysed (primary-phase) steps
    metrics: list["StepMetrics"]
    phase: str
    step_ms: float  # median GPU time of the analysed steps
    kernel_ms_per_step: float
    buckets_ms: dict[str, float]  # per step
    ops: list["Op"]
    attributor: "Attributor"
    config: dict = field(default_factory=dict)  # the server's config (server_info) when known
    gpu_timeline: bool = True  # False when a CPU-only trace is analysed on its CPU ops
    # False when the trace is of model forwards outside a serving engine (Hugging Face transformers):
    # a server's launch flags fix nothing there, and only the rules with ``forwards`` set run
    server: bool = True

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def kernels(self):
        """Every kernel of the analysed steps."""
        kern = self.trace.kernels
        for s in self.steps:
            for i in s.kernels:
                yield kern[i]

    def _verdicts(self, match) -> tuple[list, list]:
        """``match(k)`` per distinct (name, kind) of the trace's kernels (asked of its first kernel), and
        each kernel's distinct (name, kind) by index (perfscope.analysis.kernel_table)."""
        from perfscope.analysis.kernel_table import kernel_table

        table = kernel_table(self.trace)
        kern = self.trace.kernels
        return [bool(match(kern[i])) for i in table.first], table.key

    def by_name(self, match) -> Callable[[int], bool]:
        """Whether ``match(k)`` holds for the kernel at an index of ``trace.kernels``. ``match`` reads the
        kernel's name and kind only: it is asked once per distinct (name, kind), not per kernel."""
        verdict, key = self._verdicts(match)
        return lambda i: verdict[key[i]]

    def time_of(self, match) -> tuple[float, float]:
        """(ms per step, calls per step) of the analysed steps' kernels for which ``match(k)`` holds.
        ``match`` reads the kernel's name and kind only: it is asked once per distinct (name, kind)."""
        verdict, key = self._verdicts(match)
        kern = self.trace.kernels
        us = 0.0
        calls = 0
        for s in self.steps:
            for i in s.kernels:
                if verdict[key[i]]:
                    us += kern[i].dur
                    calls += 1
        n = max(self.n_steps, 1)
        return us / n / 1e3, calls / n

    @functools.cached_property
    def cpu_host(self) -> Optional[dict]:
        """A CPU server's profiler cost against its bench (``perfscope.analysis.cpuhost.profiler_cost``),
        computed once per analysis for every finding's prediction; None on a GPU timeline, on another
        device or without a bench."""
        from perfscope.analysis import cpuhost

        if self.gpu_timeline or not cpuhost.on_cpu(self.config):
            return None
        return cpuhost.profiler_cost(self.trace, self.stepset.steps, self.config.get("bench"))

    def config_value(self, *keys: str, default=None):
        for k in keys:
            if k in self.config and self.config[k] is not None:
                return self.config[k]
        return default


class Rule:
    id: ClassVar[str]
    title: ClassVar[str]
    fix: ClassVar[Optional[str]] = None
    what: ClassVar[str]
    why: ClassVar[str]
    evidence: ClassVar[str]
    remedy: ClassVar[str]
    false_positives: ClassVar[str]
    # rules that read GPU idle time: meaningless on a CPU-only trace analysed on its CPU ops
    needs_gpu_timeline: ClassVar[bool] = False
    share_of: ClassVar[str] = "kernel time"  # idle-time rules: "the step" or "the step cycle"
    # rules that also hold for model forwards outside a serving engine (phase `inference`, RuleContext.server False)
    forwards: ClassVar[bool] = False

    @classmethod
    def applies(cls, ctx: RuleContext) -> bool:
        """Whether this rule's cause is present in ``ctx`` (the registry's YIELDS_TO: a rule that yields
        to this one is not checked where it applies); a rule no other yields to keeps this default."""
        return False

    def check(self, ctx: RuleContext) -> Optional[Finding]:  # pragma: no cover - interface
        raise NotImplementedError

    def finding(self, **kw) -> Finding:
        """This rule's finding; ``summary_at`` (a summary for a predicted step) writes the summary with
        the rule's own prediction until the step model replaces it."""
        if kw.get("summary_at") is not None and "summary" not in kw:
            kw["summary"] = kw["summary_at"](kw["predicted_step_ms_after_fix"])
        kw.setdefault("fix", self.fix)
        kw.setdefault("remedy", self.remedy)
        kw.setdefault("share_of", self.share_of)
        return Finding(id=self.id, title=self.title, **kw)

    @classmethod
    def doc(cls) -> dict:
        return {
            "id": cls.id,
            "title": cls.title,
            "fix": cls.fix,
            "what": cls.what,
            "why": cls.why,
            "evidence": cls.evidence,
            "remedy": cls.remedy,
            "false_positives": cls.false_positives,
        }
