#!/usr/bin/env python
"""Benchmark (not a test): ``perfscope trace``'s peak RSS as a ratio against ``perfscope bench``'s,
against the same server in the same run.

    python benchmarks/trace_memory.py [--url URL] [--num-layers 48] [--steps 20] [--runs 2]

Without ``--url`` it starts the reproduction server (``python -m examples.repro_server --port 0``,
hidden 64, 2 heads, vocab 256, one thread) with ``--num-layers`` layers, whose DECODE trace is
~0.15 MB gzipped (~2.2 MB of JSON) per layer at 20 steps. Each command runs in a fresh process
(``python -m perfscope``, as a user runs it); its peak RSS is the kernel's (``wait4``: the process
and any child it waited for). ``bench`` is the floor: the same process, HTTP client and CLI, no
profile and no file. Printed: each command's peak RSS (the median of --runs), the trace files'
sizes (gzipped and inflated), and trace / bench. Before trace's gzip check was bounded on the
inflated side, trace peaked at ~1.6x bench (97 MB against 59 MB, real SGLang 0.5.23 on CPU).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def peak_rss_mb(cmd: list[str]) -> float:
    """Run ``cmd`` to its end (output discarded; a failure raises) and return its peak RSS in MB."""
    p = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}: {err.decode(errors='replace')[-500:]}")
    return ru.ru_maxrss / 1024


def start_repro(layers: int) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-m", "examples.repro_server", "--port", "0", "--num-layers", str(layers),
                          "--hidden-size", "64", "--num-heads", "2", "--vocab-size", "256", "--max-total-tokens",
                          "16384", "--threads", "1"], cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line and p.poll() is not None:
            break
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return p, m.group(1)
    os.killpg(p.pid, signal.SIGKILL)
    raise SystemExit("the reproduction server did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running SGLang-API server (default: start the reproduction server)")
    ap.add_argument("--num-layers", type=int, default=48)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    srv = None
    url = a.url
    if url is None:
        srv, url = start_repro(a.num_layers)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            perfscope = [sys.executable, "-m", "perfscope"]
            traced, benched = [], []
            for i in range(a.runs):
                out = Path(tmp) / f"run{i}"
                traced.append(peak_rss_mb(perfscope + ["trace", "--url", url, "--steps", str(a.steps),
                                                       "--out", str(out)]))
                benched.append(peak_rss_mb(perfscope + ["bench", "--url", url, "--num-requests", "2"]))
            files = sorted((Path(tmp) / "run0" / "traces").iterdir())
            sizes = []
            for f in files:
                inflated = 0
                with gzip.open(f) if f.name.endswith(".gz") else open(f, "rb") as g:
                    while b := g.read(1 << 20):
                        inflated += len(b)
                sizes.append(f"{f.name.split('-', 1)[-1]} {f.stat().st_size / 1e6:.1f} MB ({inflated / 1e6:.0f} MB of JSON)")
    finally:
        if srv is not None:
            os.killpg(srv.pid, signal.SIGTERM)
            srv.wait(30)
    t, b = statistics.median(traced), statistics.median(benched)
    print(f"trace files: {', '.join(sizes)}")
    print(f"peak RSS: trace {t:.0f} MB, bench {b:.0f} MB (median of {a.runs} each)")
    print(f"ratio {t / b:.2f}x bench's peak RSS (trace holds the CLI, the load and one file's working set)")


if __name__ == "__main__":
    main()
