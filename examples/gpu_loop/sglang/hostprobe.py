"""The host's timeline beside a server (levels_run.py): every ``--period`` s one JSON line to ``--out``
(gzip): ``t`` (time.perf_counter, CLOCK_MONOTONIC: the same clock as the client's token times), ``loop_us``
(a fixed busy loop's time on ``--cpu``, where this sampler is pinned: the machine's speed there), ``cpus``
(per CPU, jiffies since the last line: [busy, steal, irq+softirq]) and ``threads`` ([pid, tid, cpu it is
on, jiffies of CPU time since the last line, involuntary switches since the last line] for each thread of
``--pids`` that ran). Stops on SIGTERM, closing the file whole."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import time
from pathlib import Path


def cpu_stat() -> dict[int, tuple[int, int, int]]:
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            f = line.split()
            v = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
            out[int(f[0][3:])] = (v[0] + v[1] + v[2], v[7], v[5] + v[6])
    return out


def thread_stat(pid: int) -> dict[int, tuple[int, int, int]]:
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            f = Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()
            st = Path(f"/proc/{pid}/task/{t}/status").read_text()
            nv = int(st.rsplit("nonvoluntary_ctxt_switches:", 1)[1].split()[0])
            out[int(t)] = (int(f[36]), int(f[11]) + int(f[12]), nv)  # processor, utime+stime, nvcsw
        except (OSError, IndexError, ValueError):
            continue
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pids", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--period", type=float, default=0.02)
    a = ap.parse_args()
    os.sched_setaffinity(0, {a.cpu})
    pids = [int(p) for p in a.pids.split(",") if p]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    prev_c = cpu_stat()
    prev_t = {p: thread_stat(p) for p in pids}
    with gzip.open(a.out, "wt") as f:
        while not stop:
            t = time.perf_counter()
            s = 0
            for i in range(20000):
                s += i
            loop_us = (time.perf_counter() - t) * 1e6
            c = cpu_stat()
            cpus = {k: [v[0] - prev_c[k][0], v[1] - prev_c[k][1], v[2] - prev_c[k][2]] for k, v in c.items()
                    if k in prev_c}
            prev_c = c
            threads = []
            for p in pids:
                cur = thread_stat(p)
                old = prev_t.get(p, {})
                for tid, (cpu, jif, nv) in cur.items():
                    o = old.get(tid)
                    if o is not None and (jif > o[1] or nv > o[2]):
                        threads.append([p, tid, cpu, jif - o[1], nv - o[2]])
                prev_t[p] = cur
            f.write(json.dumps({"t": round(time.perf_counter(), 6), "loop_us": round(loop_us, 1), "cpus": cpus,
                                "threads": threads}) + "\n")
            left = a.period - (time.perf_counter() - t)
            if left > 0:
                time.sleep(left)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
