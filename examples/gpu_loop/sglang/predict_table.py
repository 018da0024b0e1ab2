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
        benches = fresh_benches(results, model, int(pool), int(conc[1:]), fixed)
        per = [t for b in benches for t in b]
        pred = (f or {}).get("predicted_step_ms_after_fix")
        p = ((f or {}).get("evidence") or {}).get("prediction") or {}
        meas = statistics.median(per) if per else fixed["tpot_ms"]
        lo_b, hi_b = (min(map(statistics.median, benches)), max(map(statistics.median, benches))) if benches else (meas, meas)
        out.append({
            "case": case.name, "model": model, "pool": int(pool), "concurrency": int(conc[1:]),
            "bug_tpot_ms": round(bug["tpot_ms"], 3), "predicted_ms": pred, "range_ms": p.get("range_ms"),
            "bound": p.get("bound"), "host_source": (p.get("host") or {}).get("source"),
            "measured_ms": round(meas, 3), "benches": len(benches), "requests": len(per),
            "measured_spread_ms": [round(min(per), 3), round(max(per), 3)] if per else None,
            "bench_medians_ms": [round(lo_b, 3), round(hi_b, 3)],
            "error_pct": round((pred - meas) / meas * 100, 1) if pred else None,
            "within_range": bool(p.get("range_ms") and p["range_ms"][0] <= meas <= p["range_ms"][1]),
            "within_bench_noise": bool(pred and lo_b <= pred <= hi_b),
        })
    return out


def fresh_benches(results: Path, model: str, pool: int, conc: int, fixed: dict) -> list[list[float]]:
    """Per-request TPOTs of every bench the run summary holds of the fixed server(s) at ``conc`` taken
    before any trace of the process: the fresh bench (``fixed/bench.json``), at concurrency 1 the three
    that followed it, and each further process start's (``predict_run.py --starts``). The summary is the
    one whose fresh bench is this case's."""
    fresh = [round(r["tpot_ms"], 4) for r in fixed.get("per_request") or [] if r.get("tpot_ms")]
    for sp in sorted(results.glob(f"summary-{model}-*.json")):
        S = json.loads(sp.read_text())
        R = (S.get("fixed") or {}).get(str(pool)) or {}
        first = R.get(f"bench_c{conc}") or {}
        if first.get("tpot_per_request") != fresh:
            continue
        out = [first["tpot_per_request"]]
        if conc == 1:
            out += [b["tpot_per_request"] for b in R.get("before_trace_c1") or [] if b.get("tpot_per_request")]
        out += [b["tpot_per_request"] for k, b in sorted(R.items())
                if k.startswith("start") and k.endswith(f"_bench_c{conc}") and b.get("tpot_per_request")]
        return out
    return [fresh] if fresh else []


def table(rs: list[dict]) -> str:
    lines = ["| case | TPOT bug | predicted after fix (range) | bound | TPOT after fix --apply: median of the requests "
             "(their spread; bench medians) | error |", "|---|---|---|---|---|---|"]
    for r in rs:
        rng, sp, bm = r["range_ms"], r["measured_spread_ms"], r["bench_medians_ms"]
        lines.append(f"| {r['case']} | {r['bug_tpot_ms']:.2f} ms | {r['predicted_ms']:.2f} ms ({rng[0]:.2f}-{rng[1]:.2f}) | "
                     f"{r['bound']} ({r['host_source']}) | {r['measured_ms']:.2f} ms ({sp[0]:.2f}-{sp[1]:.2f}; "
                     f"{r['benches']} bench{'es' if r['benches'] != 1 else ''}: {bm[0]:.2f}-{bm[1]:.2f}) | "
                     f"{r['error_pct']:+.1f}% |")
    errs = [abs(r["error_pct"]) for r in rs if r["error_pct"] is not None]
    if errs:
        lines.append(f"\nmedian |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}%, "
                     f"{sum(r['within_range'] for r in rs)}/{len(rs)} measured inside the predicted range, "
                     f"{sum(r['within_bench_noise'] for r in rs)}/{len(rs)} predictions inside the span of the "
                     f"fixed server's own bench medians")
    return "\n".join(lines)


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rs = rows(Path(args[0]) if args else DEFAULT, host_timing="--no-host-timing" not in sys.argv)
    print(json.dumps(rs, indent=1) if "--json" in sys.argv else table(rs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
