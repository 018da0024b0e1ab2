"""The view of a diagnosis that every renderer draws (terminal, Markdown, HTML, ``--json``): per
finding, the command that fixes it and the step predicted once fixed, with its range and what it
rests on; the verdict is the first. ``--json`` writes each finding from its view
(:meth:`FindingView.to_dict`, :func:`diagnosis_json`): the command and the prediction the others draw."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from perfscope.analysis.finding import Finding, FixCommand
from perfscope.analysis.result import Diagnosis
from perfscope.report import wording


@dataclass(frozen=True)
class Prediction:
    """The step predicted after a finding's fix."""

    step_ms: float
    low: float  # its range (low == high: a point)
    high: float
    from_ms: Optional[float]  # the measured step it is predicted from
    bound: Optional[str]  # what bounds the fixed step: "gpu" or "host" (the step model's), else None
    basis: Optional[str]  # what the point is made of: GPU work and the host's own time (wording.prediction_basis)
    saving: Optional[str]  # why the saving is not the finding's cost, when it is not (wording.saving_note)

    @property
    def ranged(self) -> bool:
        return self.low < self.high

    @property
    def speedup(self) -> Optional[float]:
        """How many times faster the fixed step is than the measured one."""
        return self.from_ms / self.step_ms if self.from_ms else None


@dataclass(frozen=True)
class FindingView:
    finding: Finding
    fix: Optional[FixCommand]  # None: no fix module answers it (its remedy says what to do)
    prediction: Optional[Prediction]  # None: no predicted step (or one of nothing: the finding is the whole step)

    def to_dict(self) -> dict[str, Any]:
        """The finding's JSON with this view's fix command (``fix_command``; ``fix_trace``, the one input it
        reads; ``fix_where``, where it runs) and predicted step with its range (``predicted_range_ms``:
        [low, high], equal for a point; None without a prediction)."""
        d = self.finding.to_dict()
        fc, pr = self.fix, self.prediction
        d["fix_command"] = fc.check if fc else None
        if fc is not None:
            if fc.trace:
                d["fix_trace"] = fc.trace
            d["fix_where"] = fc.where
        if pr is not None:
            d["predicted_step_ms_after_fix"] = pr.step_ms
        d["predicted_range_ms"] = [pr.low, pr.high] if pr is not None else None
        return d


@dataclass(frozen=True)
class View:
    findings: tuple[FindingView, ...]

    @property
    def top(self) -> Optional[FindingView]:
        """The verdict: the finding that costs most."""
        return self.findings[0] if self.findings else None


def prediction(f: Finding, step_ms: Optional[float]) -> Optional[Prediction]:
    rng = f.predicted_range()
    if rng is None or f.predicted_step_ms_after_fix is None:
        return None
    model = (f.evidence or {}).get("prediction") or {}
    bound = model.get("bound")
    return Prediction(
        step_ms=f.predicted_step_ms_after_fix,
        low=rng[0],
        high=rng[1],
        from_ms=step_ms or None,
        bound=bound if bound in ("gpu", "host") else None,
        basis=wording.prediction_basis(f),
        saving=wording.saving_note(f, step_ms),
    )


def view(d: Diagnosis) -> View:
    p = d.primary
    step_ms = p.steps.median_ms
    return View(tuple(FindingView(f, d.fix_command(f), prediction(f, step_ms)) for f in p.findings))


def diagnosis_json(d: Diagnosis) -> dict[str, Any]:
    """``--json``: the diagnosis' JSON (:meth:`perfscope.analysis.result.Diagnosis.to_dict`) with its findings
    written from the view every renderer draws."""
    out = d.to_dict()
    out["findings"] = [fv.to_dict() for fv in view(d).findings]
    return out
