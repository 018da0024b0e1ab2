"""Before/after with its noise: a bootstrap interval for the change of the median and a verdict,
as Criterion.rs states its results.

``median_change(before, after)`` resamples each side with replacement (``resamples`` times, a fixed
seed: the same samples give the same interval), takes the ratio of the two medians each time, and
reports the relative change of the median (``after / before - 1``) with its ``confidence``
interval. The verdict follows Criterion's rule:

    no change   the interval includes 0 (no change detected), or it excludes 0 but the change of
                the median is within the noise threshold (+-``noise``)
    improved    the interval excludes 0 and the median fell by more than the threshold
    regressed   the interval excludes 0 and the median rose by more than the threshold

Lower is better (times). Each side also has its spread (min, p10, median, p90, max, n), so a
reader sees how much one measurement moves on its own. Pure Python: a few thousand resamples of
up to a few hundred samples take milliseconds.
"""

from __future__ import annotations

import random
from typing import Optional, Sequence

NOISE = 0.05  # +-5%: a serving TPOT moves this much between identical rounds on a quiet server
CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_SAMPLES = 3  # fewer on a side: no interval (and no verdict), only the numbers


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted ``xs``, ``q`` in 0..1 (numpy's default)."""
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def spread(values: Sequence[float]) -> dict:
    """n, min, p10, median, p90, max of ``values`` (empty: n 0, the rest None)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return {"n": 0, "min": None, "p10": None, "median": None, "p90": None, "max": None}
    return {
        "n": len(xs),
        "min": xs[0],
        "p10": _quantile(xs, 0.1),
        "median": _quantile(xs, 0.5),
        "p90": _quantile(xs, 0.9),
        "max": xs[-1],
    }


def median_change(
    before: Sequence[float],
    after: Sequence[float],
    *,
    noise: float = NOISE,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict:
    """The change of the median from ``before`` to ``after`` with its bootstrap interval and verdict
    (see the module docstring). ``verdict`` is None when a side has fewer than MIN_SAMPLES values."""
    b = [float(x) for x in before if x is not None]
    a = [float(x) for x in after if x is not None]
    out: dict = {
        "before": spread(b),
        "after": spread(a),
        "noise": noise,
        "confidence": confidence,
        "change": None,
        "interval": None,
        "verdict": None,
        "why": None,
    }
    mb, ma = out["before"]["median"], out["after"]["median"]
    if mb and ma is not None:
        out["change"] = ma / mb - 1
    if len(b) < MIN_SAMPLES or len(a) < MIN_SAMPLES or not mb or min(b) <= 0:
        out["why"] = f"too few samples for an interval ({len(b)} before, {len(a)} after; {MIN_SAMPLES} needed)"
        return out
    rng = random.Random(seed)
    nb, na = len(b), len(a)
    ratios = []
    for _ in range(resamples):
        sb = _median([b[rng.randrange(nb)] for _ in range(nb)])
        sa = _median([a[rng.randrange(na)] for _ in range(na)])
        ratios.append(sa / sb - 1)
    ratios.sort()
    tail = (1 - confidence) / 2
    lo, hi = _quantile(ratios, tail), _quantile(ratios, 1 - tail)
    out["interval"] = [lo, hi]
    ch = out["change"]
    if lo <= 0 <= hi:
        out["verdict"], out["why"] = "no change", "no change detected: the interval includes 0"
    elif abs(ch) <= noise:
        out["verdict"], out["why"] = "no change", f"change within the noise threshold (+-{noise:.0%})"
    elif ch < 0:
        out["verdict"], out["why"] = "improved", f"faster by more than the noise threshold (+-{noise:.0%})"
    else:
        out["verdict"], out["why"] = "regressed", f"slower by more than the noise threshold (+-{noise:.0%})"
    return out


def median_interval(
    values: Sequence[float], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0
) -> Optional[tuple[float, float]]:
    """The bootstrap interval of the median of ``values``, relative to it (``(-0.04, +0.06)``: the
    median is known to -4%..+6%); None with fewer than MIN_SAMPLES values."""
    xs = [float(x) for x in values if x is not None]
    if len(xs) < MIN_SAMPLES:
        return None
    m = _median(xs)
    if m <= 0:
        return None
    rng = random.Random(seed)
    n = len(xs)
    meds = sorted(_median([xs[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return _quantile(meds, tail) / m - 1, _quantile(meds, 1 - tail) / m - 1


def _ms(x: Optional[float]) -> str:
    if x is None:
        return "?"
    return f"{x:.3f}" if abs(x) < 1 else f"{x:.2f}" if abs(x) < 100 else f"{x:.1f}"


def describe_side(s: dict, unit: str = "ms") -> str:
    """``5.05 ms (n 8, 3.60-12.20)``: the median with its range."""
    if not s.get("n"):
        return "?"
    if s["n"] == 1:
        return f"{_ms(s['median'])} {unit} (n 1)"
    return f"{_ms(s['median'])} {unit} (n {s['n']}, {_ms(s['min'])}-{_ms(s['max'])})"


def describe(c: dict, what: str = "TPOT median") -> str:
    """One line: ``TPOT median 5.05 ms (n 4, 3.60-12.20) -> 4.17 ms (n 4, 3.9-5.0): -17.4% [95% CI
    -52.1%, +31.0%]: no change (no change detected: the interval includes 0)``."""
    line = f"{what} {describe_side(c['before'])} -> {describe_side(c['after'])}"
    if c.get("change") is not None:
        line += f": {c['change']:+.1%}"
    if c.get("interval"):
        lo, hi = c["interval"]
        line += f" [{c['confidence']:.0%} CI {lo:+.1%}, {hi:+.1%}]"
    if c.get("verdict"):
        line += f": {c['verdict']} ({c['why']})"
    elif c.get("why"):
        line += f" ({c['why']})"
    return line
