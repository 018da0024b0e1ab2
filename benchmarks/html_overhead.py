"""Benchmark (not a test): what an HTML report adds over the diagnosis itself, on the 120-step eager trace.

    python benchmarks/html_overhead.py [TRACE] [--runs N]

Runs ``perfscope diagnose TRACE --json`` and ``perfscope diagnose TRACE --json --html OUT`` alternately
N times each (fresh processes, as a user runs them), and prints the medians, their ratio, the
in-process render time and the report's size.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diagnose_speed import EAGER_COPIES, EAGER_MB, EAGER_SOURCE, build_repeated_trace  # noqa: E402


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", help="default: the 120-step eager trace diagnose_speed.py builds")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not a.trace:
            a.trace = str(Path(tmp) / "mla_pool_eager_x120steps.json.gz")
            build_repeated_trace(EAGER_SOURCE, EAGER_MB, Path(a.trace), EAGER_COPIES)
        measure(a, Path(tmp))


def measure(a, tmp: Path) -> None:
    out = tmp / "report.html"
    base = [sys.executable, "-m", "perfscope", "diagnose", a.trace, "--json"]
    plain, html = [], []
    for _ in range(a.runs):
        plain.append(timed(base))
        html.append(timed(base + ["--html", str(out)]))
    size = out.stat().st_size

    from perfscope.analysis.diagnose import diagnose
    from perfscope.report.html import render_diagnosis

    t = time.perf_counter()
    d = diagnose([a.trace])
    t_diag = time.perf_counter() - t
    t = time.perf_counter()
    render_diagnosis(d)
    first = time.perf_counter() - t
    mp, mh = statistics.median(plain), statistics.median(html)
    print(f"trace: {a.trace} ({Path(a.trace).stat().st_size / 1e6:.1f} MB gz)")
    print(f"diagnose            median {mp:.2f} s  ({', '.join(f'{x:.2f}' for x in plain)})")
    print(f"diagnose --html     median {mh:.2f} s  ({', '.join(f'{x:.2f}' for x in html)})")
    print(f"ratio (html/plain)  {mh / mp:.3f}   added {mh - mp:+.2f} s")
    print(f"in-process          diagnose {t_diag:.2f} s, first render {first * 1e3:.0f} ms "
          f"(template compile + plotly.js read): ratio {(t_diag + first) / t_diag:.3f}")
    print(f"report size         {size / 1e6:.2f} MB (limit 10 MB)")


if __name__ == "__main__":
    main()
