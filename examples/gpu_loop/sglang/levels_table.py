"""What levels_run.py measured, on any machine: per process start and phase (scheduler unpinned or pinned
to one CPU), the batch-1 TPOT (median, p10-p90), and beside each request what the sampler saw while it
decoded: the CPU steal time of the whole machine, the scheduler's involuntary context switches, the CPU it
ran on and that CPU's interrupt time (irq + softirq), and the fixed busy loop's time on a CPU of its own (the machine's speed there); then how well that
loop time follows the TPOT (Pearson r over the requests). Where the sampler also read the GPU (hostprobe.py's
``gpu``; the 2026-12-02 results predate it), each phase adds the SM clock's median while its requests
decoded and its lowest reading, the clock-event reasons seen, and r(SM clock, TPOT): a GPU that clocks down between the short steps
of a host-bound server would show as a negative r.

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


def _r(xs: list[float], ys: list[float]) -> float | None:
    """Pearson r, or None where either side is constant or there are fewer than three points."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return round(statistics.correlation(xs, ys), 2)


def _gpu_columns(reqs: list[dict]) -> dict:
    """The GPU's side of a phase: SM clock median over its requests, clock-event reasons, r(SM clock, TPOT);
    empty where the sampler had no GPU readings."""
    seen = [r for r in reqs if r["sm_mhz"] is not None]
    if not seen:
        return {}
    return {"sm_mhz_median": statistics.median(r["sm_mhz"] for r in seen),
            "sm_mhz_min": min(r["sm_mhz_min"] for r in seen),
            "throttle_reasons": sorted({x for r in seen for x in r["throttle"]}),
            "sm_tpot_r": _r([r["sm_mhz"] for r in seen], [r["tpot_ms"] for r in seen])}


def start_rows(folder: Path) -> dict:
    """One process start: its phases, each with its requests' TPOT and what the sampler saw."""
    plain = folder / "summary.json"
    S = json.loads(plain.read_text() if plain.is_file() else gzip.decompress((folder / "summary.json.gz").read_bytes()))
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
            gpu = [s["gpu"] for s in win if s.get("gpu") and s["gpu"].get("sm_mhz") is not None]
            reqs.append({"tpot_ms": q["tpot_ms"], "loop_us": statistics.median(s["loop_us"] for s in win),
                         "sm_mhz": statistics.median(g["sm_mhz"] for g in gpu) if gpu else None,
                         "sm_mhz_min": min(g["sm_mhz"] for g in gpu) if gpu else None,
                         "throttle": sorted({g["throttle"] for g in gpu}),
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
            **_gpu_columns(reqs),
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
    gpu = [(s["start"], p) for s in rs for p in s["phases"] if "sm_mhz_median" in p]
    if gpu:
        print()
        print("| start | phase | SM clock median (MHz) | SM clock lowest (MHz) | clock-event reasons | r(SM clock, TPOT) |")
        print("|---|---|---|---|---|---|")
        for start, p in gpu:
            r = "-" if p["sm_tpot_r"] is None else f"{p['sm_tpot_r']:+.2f}"
            print(f"| {start} | {p['phase']} | {p['sm_mhz_median']:g} | {p['sm_mhz_min']:g} | {' '.join(p['throttle_reasons']) or '-'} | {r} |")
    print()
    print("r(loop, TPOT) over each start's requests: " + ", ".join(f"{s['start']} {s['loop_tpot_r']:+.2f}" for s in rs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
