"""Predictions held to account (:func:`perfscope.analysis.compare.compare`): what BEFORE said the step
would take once each of its findings was fixed, against what AFTER measured."""

from __future__ import annotations

from typing import Any, Optional

from perfscope.analysis.compare_ops import ops_by_key, rounded as _r
from perfscope.analysis.finding import Finding
from perfscope.analysis.ops import Op


def _unchanged_check(ob: list[Op], oa: list[Op], changed: list[str]) -> Optional[dict]:
    """What a kernel-level prediction assumes and AFTER can check: the ops on both sides that the fix
    does not change (``changed``: the kernel names it does) keep their time. Their summed change per
    step, and the largest."""
    skip = set(changed)
    kb = ops_by_key([o for o in ob if o.name not in skip])
    ka = ops_by_key([o for o in oa if o.name not in skip])
    both = [k for k in kb if k in ka]
    if not both:
        return None
    deltas = sorted(((ka[k]["ms"] - kb[k]["ms"], k) for k in both), key=lambda x: -abs(x[0]))
    return {
        "delta_ms": sum(d for d, _ in deltas),
        "largest": [
            {
                "short": k[0],
                "bucket": k[1],
                "before_ms": _r(kb[k]["ms"]),
                "after_ms": _r(ka[k]["ms"]),
                "delta_ms": _r(d),
            }
            for d, k in deltas[:3]
        ],
    }


def held_to_account(
    fb: list[Finding],
    fa: list[Finding],
    step_before: Optional[float],
    step_after: Optional[float],
    tpot_before: Optional[float],
    tpot_after: Optional[float],
    ops: Optional[tuple] = None,
    host: Optional[tuple] = None,
    after_unprofiled: bool = False,
    gpu_after: Optional[float] = None,
) -> list[dict]:
    """Predictions held to account: what BEFORE said the step would take once each of its findings
    was fixed, against what AFTER measured (for the findings AFTER no longer has). A prediction with
    the host's unprofiled time in it (``prediction.host``, perfscope.analysis.hosttime) is of the TPOT
    without the profiler: it is held to AFTER's bench when AFTER has one (``error_pct``), else to the
    profiled step, said as such (``measured_under_profiler``), with its GPU work held to AFTER's."""
    after_ids = {f.id for f in fa}
    out = []
    for f in fb:
        pred = f.predicted_step_ms_after_fix
        if f.id in after_ids or pred is None or pred <= 0 or not step_after:
            continue  # (a predicted step of 0 ms: the finding's time was the whole step, no prediction)
        if step_before and pred >= 0.99 * step_before:
            continue  # it predicted no faster step (host-side bubbles lie between steps): nothing to hold it to
        if step_before and step_after > 1.05 * step_before and f.share_of == "the step cycle":
            # an idle-time finding (a share of the step cycle) that left because the step grew around the same
            # idle (e.g. a slower kernel mix), not because its cause was fixed: nothing to hold it to
            continue
        row: dict[str, Any] = {
            "finding": f.id,
            "predicted_step_ms": _r(pred),
            "measured_step_ms": _r(step_after),
            "error_pct": round((pred - step_after) / step_after * 100, 1),
        }
        model = (f.evidence or {}).get("prediction") or {}  # the step model's parts (stepmodel.py)
        if model.get("bound"):
            row["bound"] = model["bound"]
        if "host" in model:  # a prediction of the unprofiled TPOT
            if model.get("gpu_work_ms") and gpu_after:
                row.update(
                    {
                        "predicted_gpu_work_ms": _r(model["gpu_work_ms"]),
                        "measured_gpu_work_ms": _r(gpu_after),
                        "gpu_work_error_pct": round((model["gpu_work_ms"] - gpu_after) / gpu_after * 100, 1),
                    }
                )
            lo, hi = model.get("range_ms") or (pred, pred)
            if tpot_after and after_unprofiled:
                row.update(
                    {
                        "predicted_tpot_ms": _r(pred),
                        "measured_tpot_ms": _r(tpot_after),
                        "error_pct": round((pred - tpot_after) / tpot_after * 100, 1),
                        "tpot_error_pct": round((pred - tpot_after) / tpot_after * 100, 1),
                        "predicted_tpot_range_ms": [_r(lo), _r(hi)],
                        "tpot_within_range": lo <= tpot_after <= hi,
                    }
                )
            else:
                row["measured_under_profiler"] = True
        elif tpot_before and tpot_after and step_before:
            ptpot = tpot_before * pred / step_before  # the step's saving, carried to the client's TPOT
            row.update(
                {
                    "predicted_tpot_ms": _r(ptpot),
                    "measured_tpot_ms": _r(tpot_after),
                    "tpot_error_pct": round((ptpot - tpot_after) / tpot_after * 100, 1),
                }
            )
        meas = tpot_after if ("host" in model and tpot_after and after_unprofiled) else step_after
        if model.get("kernel_only_prediction_ms") is not None:  # the kernel-only answer it replaced
            ko = model["kernel_only_prediction_ms"]
            row.update({"kernel_only_ms": _r(ko), "kernel_only_error_pct": round((ko - meas) / meas * 100, 1)})
        if model.get("lower_bound_ms") is not None:
            row["lower_bound_ms"] = _r(model["lower_bound_ms"])
        if model.get("range_ms"):
            lo, hi = model["range_ms"]
            row.update(
                {
                    "predicted_range_ms": [_r(lo), _r(hi)],
                    "within_range": lo * 0.95 <= meas <= hi * 1.05,
                    "alternatives": {
                        k: _r(v["predicted_step_ms"]) for k, v in (model.get("alternatives") or {}).items()
                    },
                }
            )
        if model.get("assumes"):
            row["assumes"] = model["assumes"]
        unchanged = (
            _unchanged_check(ops[0], ops[1], model["changed_kernels"])
            if ops is not None and "changed_kernels" in model
            else None
        )
        if unchanged is not None:
            # the kernels the prediction held constant, as AFTER measured them: the part of the error
            # that is a broken assumption (another kernel got slower), not the step model
            d = unchanged["delta_ms"]
            row.update({"unchanged_kernels_delta_ms": _r(d), "unchanged_kernels_largest": unchanged["largest"]})
            if model.get("bound") == "gpu" and str(model.get("launch_bound_steps", "")).startswith("0/"):
                # a GPU-bound step moves with its kernels (a launch- or host-bound one does not)
                row["error_with_measured_kernels_pct"] = round((pred + d - meas) / meas * 100, 1)
        if host and host[0] and host[1]:
            # the other half of the assumption: the host's own time per step (its CPU step range),
            # which a GPU-side fix leaves alone; a fix that adds host work (Python, launches) breaks it
            row["host_step_ms"] = [_r(host[0]), _r(host[1])]
            row["host_work_added"] = host[1] > 1.2 * host[0] and host[1] - host[0] > 0.1 * step_after
        out.append(row)
    return out
