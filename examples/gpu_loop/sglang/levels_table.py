"""What levels_run.py measured, on any machine: per process start and phase (scheduler unpinned or pinned
to one CPU), the batch-1 TPOT (median, p10-p90), and beside each request what the sampler saw while it
decoded: the CPU steal time of the whole machine, the scheduler's involuntary context switches, the CPU it
ran on and that CPU's interrupt time (irq + softirq), and the fixed busy loop's time on a CPU of its own (the machine's speed there); then how well that
loop time follows the TPOT (Pearson r over the requests).

    python3 examples/gpu_loop/sglang/levels_table.py [RESULTS_DIR] [--json]"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent / "results" / "h200-2026-12-02-levels"


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def start_rows(folder: Path) -> dict:
    """One process start: its phases, each with its requests' TPOT and what the sampler saw."""
    S = json.loads((folder / "summary.json").read_text())
    with gzip.open(folder / "samples.jsonl.gz", "rt") as f:
        samples = [json.loads(line) for line in f]
    ts = [s["t"] for s in samples]
    sched = S["scheduler_pid"]
    phases, loops, tpots = [], [], []
    for P in S["phases"]:
        reqs = []
        for q in P["requests"]:
            if not q["tpot_ms"]:
                continue
            t0 = q["start"] + q["ttft_s"]
            t1 = t0 + sum(q["itl_s"])
            win = samples[max(bisect.bisect_left(ts, t0) - 1, 0):bisect.bisect_right(ts, t1) + 1]
            cpus: dict[int, int] = {}
            nv = 0
            for s in win:
                for pid, _tid, cpu, jif, n in s["threads"]:
                    if pid == sched:
                        cpus[cpu] = cpus.get(cpu, 0) + jif
                        nv += n
            cpu = max(cpus, key=cpus.get) if cpus else None
            reqs.append({"tpot_ms": q["tpot_ms"], "loop_us": statistics.median(s["loop_us"] for s in win),
                         "steal_jiffies": sum(v[1] for s in win for v in s["cpus"].values()), "nvcsw": nv,
                         "cpu": cpu, "irq_jiffies": sum(s["cpus"].get(str(cpu), [0, 0, 0])[2] for s in win)})
        t = [r["tpot_ms"] for r in reqs]
        phases.append({
            "phase": P["name"], "pinned_to": P["cpus"], "requests": len(reqs),
            "tpot_median_ms": round(statistics.median(t), 3), "tpot_p10_ms": round(_pct(t, 0.1), 3),
            "tpot_p90_ms": round(_pct(t, 0.9), 3),
            "steal_jiffies_per_request": round(statistics.mean(r["steal_jiffies"] for r in reqs), 3),
            "nvcsw_per_request": round(statistics.mean(r["nvcsw"] for r in reqs), 1),
            "irq_jiffies_per_request": round(statistics.mean(r["irq_jiffies"] for r in reqs), 3),
            "scheduler_cpus": sorted({r["cpu"] for r in reqs if r["cpu"] is not None}),
            "loop_tpot_r": round(statistics.correlation([r["loop_us"] for r in reqs], t), 2),
        })
        loops += [r["loop_us"] for r in reqs]
        tpots += t
    return {"start": folder.name, "phases": phases, "loop_tpot_r": round(statistics.correlation(loops, tpots), 2),
            "reverted_byte_identical": S.get("reverted_byte_identical"), "cpus": S.get("cpus")}


def rows(results: Path = DEFAULT) -> list[dict]:
    return [start_rows(p) for p in sorted(results.iterdir()) if (p / "samples.jsonl.gz").is_file()]


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rs = rows(Path(args[0]) if args else DEFAULT)
    if "--json" in sys.argv:
        print(json.dumps(rs, indent=1))
        return 0
    print("| start | phase | requests | TPOT median (p10-p90) | steal jiffies / request | involuntary switches / request | "
          "scheduler on CPU | its irq+softirq jiffies / request | r(loop, TPOT) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in rs:
        for p in s["phases"]:
            print(f"| {s['start']} | {p['phase']} | {p['requests']} | {p['tpot_median_ms']:.2f} ms "
                  f"({p['tpot_p10_ms']:.2f}-{p['tpot_p90_ms']:.2f}) | {p['steal_jiffies_per_request']:g} | "
                  f"{p['nvcsw_per_request']:g} | {','.join(map(str, p['scheduler_cpus']))} | "
                  f"{p['irq_jiffies_per_request']:g} | {p['loop_tpot_r']:+.2f} |")
    print()
    print("r(loop, TPOT) over each start's requests: " + ", ".join(f"{s['start']} {s['loop_tpot_r']:+.2f}" for s in rs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
