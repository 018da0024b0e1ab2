"""The ops of two diagnoses side by side (:func:`perfscope.analysis.compare.compare`): matched by
(short name, bucket), and whether the ops a fix was not expected to change moved together (the
machine changed between the runs)."""

from __future__ import annotations

from typing import Optional

from perfscope.analysis.ops import Op


def rounded(x: Optional[float], nd: int = 4) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def ratio(before: Optional[float], after: Optional[float]) -> Optional[float]:
    if not before or after is None:
        return None
    return round(after / before, 4)


def ops_by_key(ops: list[Op]) -> dict:
    """Ops summed by (short name, bucket): what a reader sees as "the same op" on both sides."""
    out: dict[tuple, dict] = {}
    for o in ops:
        key = (o.short or o.name, o.bucket)
        cur = out.get(key)
        if cur is None:
            out[key] = {
                "short": key[0],
                "bucket": key[1],
                "sub": o.sub,
                "ms": o.ms_per_step or 0.0,
                "count": o.count_per_step or 0.0,
                "grid": list(o.grid) if o.grid else None,
            }
        else:
            cur["ms"] += o.ms_per_step or 0.0
            cur["count"] += o.count_per_step or 0.0
    return out


def ops_diff(ob: list[Op], oa: list[Op], limit: int) -> list[dict]:
    kb, ka = ops_by_key(ob), ops_by_key(oa)
    rows = []
    for key in list(dict.fromkeys(list(kb) + list(ka))):
        b, a = kb.get(key), ka.get(key)
        bms, ams = (b or {}).get("ms", 0.0), (a or {}).get("ms", 0.0)
        status = "gone" if a is None else "new" if b is None else "changed"
        rows.append(
            {
                "short": key[0],
                "bucket": key[1],
                "sub": (a or b or {}).get("sub"),
                "status": status,
                "before_ms": rounded(bms) if b else None,
                "after_ms": rounded(ams) if a else None,
                "delta_ms": rounded(ams - bms),
                "ratio": ratio(bms, ams) if a and b else None,
                "before_count": rounded((b or {}).get("count"), 2) if b else None,
                "after_count": rounded((a or {}).get("count"), 2) if a else None,
                "before_grid": (b or {}).get("grid"),
                "after_grid": (a or {}).get("grid"),
            }
        )
    rows.sort(key=lambda r: -abs(r["delta_ms"] or 0.0))
    return rows[:limit]


MOVED = 1.2  # an op "moved" when its time per launch changed by this factor or more
MOVED_SHARE = 0.6  # ... and ops that moved one way hold this share of the unexpected ops' time


def step_samples(r) -> list[float]:
    """The per-step times the step median is taken over (GPU work of steps that launched
    kernels; else each step's CPU range), as the analysis computes it."""
    gpu = [m["gpu_ms"] for m in r.per_step if m.get("kernels")]
    return gpu or [m["cpu_ms"] for m in r.per_step]


def moved_together(ob: list[Op], oa: list[Op], expected: set, step_before: Optional[float]) -> Optional[dict]:
    """Ops the fix was not expected to change (not in ``expected``, by kernel name) that moved
    together: one direction, by MOVED or more per launch, MOVED_SHARE of those ops' time, at least
    two ops and a tenth of the step. A fix changes its own kernels; when the others all move, the
    machine did."""
    kb = ops_by_key([o for o in ob if o.name not in expected])
    ka = ops_by_key([o for o in oa if o.name not in expected])
    rows = []
    for k in kb:
        if k not in ka:
            continue
        b, a = kb[k], ka[k]
        if b["ms"] <= 0 or a["ms"] <= 0 or not b["count"] or not a["count"]:
            continue
        rows.append((b["ms"], (a["ms"] / a["count"]) / (b["ms"] / b["count"]), k))
    total = sum(w for w, _, _ in rows)
    if len(rows) < 2 or not total or (step_before and total < 0.1 * step_before):
        return None
    for way, test in (("faster", lambda r: r <= 1 / MOVED), ("slower", lambda r: r >= MOVED)):
        moved = [(w, r, k) for w, r, k in rows if test(r)]
        share = sum(w for w, _, _ in moved) / total
        if len(moved) >= 2 and share >= MOVED_SHARE:
            ratios = sorted(r for _, r, _ in moved)
            med = ratios[len(ratios) // 2]
            return {
                "direction": way,
                "ops": len(moved),
                "of_ops": len(rows),
                "share_of_time": round(share, 3),
                "median_factor": round(1 / med if way == "faster" else med, 2),
                "examples": [k[0] for _, _, k in sorted(moved, key=lambda x: -x[0])[:3]],
            }
    return None
