"""`perfscope diagnose` of a run folder, and the brief of a diagnosis kept in the summary."""

from __future__ import annotations

import json

from gpuloop.base import REPO, _json_or


class DiagnoseMixin:
    def diagnose(self, tag: str) -> dict:
        a = self.a
        run = self.runs / tag
        dargs = ["diagnose", str(run), "--json", "--batch", "1", "--context", str(a.input_len + a.trace_output_len // 2)]
        cfg = REPO / "examples" / "h200_mla_repro.config.json"
        if cfg.is_file() and not a.small:
            dargs += ["--model-config", str(cfg)]
        if tag == "bug":
            dargs += ["--html", str(self.work / "report-bug.html")]
        r = self.perfscope(f"diagnose-{tag}", *dargs, timeout=240)
        diag = _json_or(r.stdout, None)
        if diag is None:
            return {"diagnose_error": r.stderr[-1500:]}
        (self.work / f"diagnose-{tag}.json").write_text(json.dumps(diag, indent=1))
        return {"diagnosis": _brief_diag(diag)}

def _brief_diag(d: dict) -> dict:
    steps = d.get("steps") or {}
    fl = d.get("floor") or {}
    return {
        "step_median_ms": steps.get("median_ms"), "steps": steps.get("count"), "step_method": steps.get("method"),
        "idle_ms_per_step": d.get("idle_ms_per_step"), "kernel_ms_per_step": d.get("kernel_ms_per_step"),
        "buckets": d.get("buckets"),
        "findings": [{k: f.get(k) for k in ("id", "title", "summary", "ms_per_step", "share", "confidence",
                                            "predicted_step_ms_after_fix")} for f in d.get("findings", [])],
        "floor": {k: fl.get(k) for k in ("available", "floor_ms", "measured_ms", "gap_ms", "ratio", "worst_bucket",
                                         "worst_gap_ms", "memory_bandwidth_utilisation", "buckets", "missing",
                                         "reason")},
        "top_ops": [{k: o.get(k) for k in ("short", "bucket", "ms_per_step", "count_per_step", "share", "grid")}
                    for o in (d.get("ops") or [])[:6]],
        "device": d.get("device"), "notes": d.get("notes"),
    }
