#!/usr/bin/env python
"""Speed and memory of `perfscope diagnose`, against a baseline measured in the same run.

    python benchmarks/diagnose_speed.py [TRACE] [--rounds 2] [--check]

Each measurement runs in a fresh child process (so peak RSS is its own) and the children alternate
(baseline, perfscope, baseline, perfscope, ...) so machine noise hits both. Printed:
  - time ratio  perfscope diagnose / orjson.loads(gzip.open(f).read())   (target <= 1.0)
  - peak RSS of perfscope diagnose / the trace's JSON size                 (target < 3.0)
  - two rank files in parallel / one rank file                             (target ~1.0 on >= 2 cores)
  - events per second of the whole diagnose, and peak RSS bytes per event (the README's stated
    rate: >= 10,000 events/s and < 1,000 bytes/event, so that a trace at PERFSCOPE_MAX_EVENTS'
    default of 5,000,000 events takes minutes and a few GB, not hours)
Default TRACE: ../shared/traces/h200-mla-fp8-kv/mla_pool_eager_120steps.json.gz (210 MB of JSON).
--check exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO.parent / "shared" / "traces" / "h200-mla-fp8-kv" / "mla_pool_eager_120steps.json.gz"


def child(kind: str, paths: list[str]) -> None:
    """Run one measurement in this (fresh) process and print its wall time and peak RSS."""
    if kind == "orjson":
        import orjson

        for p in paths:
            with gzip.open(p) as f:
                orjson.loads(f.read())
    else:
        from perfscope.cli import main

        sys.stdout = open(os.devnull, "w")
        try:
            main(["diagnose", *paths, "--json"])
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        finally:
            sys.stdout = sys.__stdout__
    peak_kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"s": time.perf_counter() - T0, "rss_mb": peak_kb / 1024}))


def measure(kind: str, paths: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, *paths], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", default=str(DEFAULT))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1:])
        return 0
    trace = Path(a.trace)
    with gzip.open(trace) as f:
        raw = f.read()
    json_mb = len(raw) / 2**20
    from perfscope.load.schema import TOP

    events = len(TOP.decode(raw).traceEvents or [])
    del raw
    base, ours = [], []
    for _ in range(a.rounds):
        base.append(measure("orjson", [str(trace)]))
        ours.append(measure("perfscope", [str(trace)]))
    tb = statistics.median(x["s"] for x in base)
    to = statistics.median(x["s"] for x in ours)
    rss = max(x["rss_mb"] for x in ours)
    with tempfile.TemporaryDirectory() as d:
        one = Path(d) / "one"
        two = Path(d) / "two"
        one.mkdir()
        two.mkdir()
        os.symlink(trace.resolve(), one / "1-TP-0.trace.json.gz")
        os.symlink(trace.resolve(), two / "1-TP-0.trace.json.gz")
        os.symlink(trace.resolve(), two / "1-TP-1.trace.json.gz")
        t1, t2 = [], []
        for _ in range(a.rounds):
            t1.append(measure("perfscope", [str(one)])["s"])
            t2.append(measure("perfscope", [str(two)])["s"])
    r_time = to / tb
    r_rss = rss / json_mb
    r_par = statistics.median(t2) / statistics.median(t1)
    print(f"trace: {trace.name}  ({json_mb:.0f} MB of JSON, {trace.stat().st_size / 2**20:.1f} MB gzipped)  "
          f"cores: {os.cpu_count()}")
    print(f"orjson.loads(gzip) baseline : {tb:6.2f} s")
    print(f"perfscope diagnose --json   : {to:6.2f} s   ratio {r_time:.2f}x the baseline (target <= 1.0)")
    print(f"peak RSS perfscope diagnose : {rss:6.0f} MB  ratio {r_rss:.2f}x the JSON size (target < 3.0)")
    print(f"two ranks in parallel       : {statistics.median(t2):6.2f} s vs one rank {statistics.median(t1):.2f} s"
          f"  ratio {r_par:.2f}x (target ~1.0 with >= 2 cores)")
    rate, per_event = events / to, rss * 2**20 / max(events, 1)
    print(f"events per second           : {rate:8,.0f}  ({events:,} events; target >= 10,000)")
    print(f"peak RSS per event          : {per_event:8,.0f} bytes (target < 1,000)")
    ok = r_time <= 1.0 and r_rss < 3.0 and rate >= 10_000 and per_event < 1_000
    if a.check and not ok:
        print("FAILED: a target was missed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
