"""Predicted vs measured TPOT for the runs of ``predict_run.py``: for each case folder (a bug run
folder with its bench and GPU-only host-timing profile, and the fixed server's run folder with its
fresh bench), ``perfscope diagnose`` of the bug predicts the step after ``fp8-kv-cast`` is fixed;
the fixed server's bench, taken before any trace of that process, is what it did. No GPU needed.

    python3 examples/gpu_loop/sglang/predict_table.py [RESULTS_DIR] [--json] [--no-host-timing]

``--no-host-timing`` predicts from the full trace alone (the host scaled from it, not from the GPU-only
profile). Prints a Markdown table; ``--json`` the rows."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parent / "results" / "h200-2026-12-01-predict"


def rows(results: Path, host_timing: bool = True) -> list[dict]:
    sys.path.insert(0, str(HERE.parents[2]))
    from perfscope.analysis.diagnose import diagnose

    out = []
    for case in sorted(p for p in results.iterdir() if (p / "bug" / "run.json").is_file()):
        model, pool, conc = case.name.split("-")
        cfg = None if host_timing else {"host_timing": None}
        d = diagnose([case / "bug"], config=cfg, workers=1).to_dict()
        f = next((x for x in d["findings"] if x["id"] == "fp8-kv-cast"), None)
        fixed = json.loads((case / "fixed" / "bench.json").read_text())
        bug = json.loads((case / "bug" / "bench.json").read_text())
        per = [r["tpot_ms"] for r in fixed.get("per_request") or [] if r.get("tpot_ms")]
        pred = (f or {}).get("predicted_step_ms_after_fix")
        p = ((f or {}).get("evidence") or {}).get("prediction") or {}
        meas = fixed["tpot_ms"]
        out.append({
            "case": case.name, "model": model, "pool": int(pool), "concurrency": int(conc[1:]),
            "bug_tpot_ms": round(bug["tpot_ms"], 3), "predicted_ms": pred, "range_ms": p.get("range_ms"),
            "bound": p.get("bound"), "host_source": (p.get("host") or {}).get("source"),
            "measured_ms": round(meas, 3),
            "measured_spread_ms": [round(min(per), 3), round(max(per), 3)] if per else None,
            "error_pct": round((pred - meas) / meas * 100, 1) if pred else None,
            "within_range": bool(p.get("range_ms") and p["range_ms"][0] <= meas <= p["range_ms"][1]),
        })
    return out


def table(rs: list[dict]) -> str:
    lines = ["| case | TPOT bug | predicted after fix (range) | bound | TPOT after fix --apply (per-request spread) | error |",
             "|---|---|---|---|---|---|"]
    for r in rs:
        rng = r["range_ms"]
        lines.append(f"| {r['case']} | {r['bug_tpot_ms']:.2f} ms | {r['predicted_ms']:.2f} ms ({rng[0]:.2f}-{rng[1]:.2f}) | "
                     f"{r['bound']} ({r['host_source']}) | {r['measured_ms']:.2f} ms "
                     f"({r['measured_spread_ms'][0]:.2f}-{r['measured_spread_ms'][1]:.2f}) | {r['error_pct']:+.1f}% |")
    errs = [abs(r["error_pct"]) for r in rs if r["error_pct"] is not None]
    if errs:
        lines.append(f"\nmedian |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}%, "
                     f"{sum(r['within_range'] for r in rs)}/{len(rs)} measured inside the predicted range")
    return "\n".join(lines)


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rs = rows(Path(args[0]) if args else DEFAULT, host_timing="--no-host-timing" not in sys.argv)
    print(json.dumps(rs, indent=1) if "--json" in sys.argv else table(rs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
