"""The host's timeline beside a server (levels_run.py): every ``--period`` s one JSON line to ``--out``
(gzip): ``t`` (time.perf_counter, CLOCK_MONOTONIC: the same clock as the client's token times), ``loop_us``
(a fixed busy loop's time on ``--cpu``, where this sampler is pinned: the machine's speed there), ``cpus``
(per CPU, jiffies since the last line: [busy, steal, irq+softirq]) and ``threads`` ([pid, tid, cpu it is
on, jiffies of CPU time since the last line, involuntary switches since the last line] for each thread of
``--pids`` that ran), and ``gpu``: the GPU's state as ``nvidia-smi`` last reported it (one read-only
``nvidia-smi --query-gpu ... -lms`` process beside the sampler; ``null`` where the machine has none):
``sm_mhz``, ``mem_mhz``, ``power_w``, ``pstate``, ``util_pct`` and ``throttle`` (the active clock-event
reasons, a hex mask: 0 = none, 0x1 = GPU idle, 0x4 = power cap, ...), with ``age_ms`` since that report.
A host-bound server whose TPOT switches between two levels while its CPUs look alike may be a GPU that
clocks down between short steps: the table (levels_table.py) sets the SM clock beside each request's
TPOT. Stops on SIGTERM, closing the file whole."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import threading
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


GPU_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "pstate", "utilization.gpu", "clocks_event_reasons.active")
GPU_KEYS = ("sm_mhz", "mem_mhz", "power_w", "pstate", "util_pct", "throttle")


def parse_gpu_line(line: str) -> dict | None:
    """One ``nvidia-smi --format=csv,noheader,nounits`` line of GPU_FIELDS as a dict (numbers where the
    field is one; ``None`` for a line that does not have them all)."""
    f = [x.strip() for x in line.split(",")]
    if len(f) != len(GPU_FIELDS):
        return None
    out: dict = {}
    for k, v in zip(GPU_KEYS, f):
        if k in ("pstate", "throttle"):
            out[k] = v
            continue
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = None
    return out


class GpuWatch:
    """The latest line of a read-only ``nvidia-smi -lms PERIOD`` beside the sampler, stamped with
    time.perf_counter when it arrived. Without nvidia-smi on PATH, ``latest()`` is always ``None``."""

    def __init__(self, period_ms: int) -> None:
        self.last: tuple[float, dict] | None = None
        self.proc: subprocess.Popen | None = None
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        self.proc = subprocess.Popen([exe, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits",
                                      "-lms", str(period_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            g = parse_gpu_line(line)
            if g is not None:
                self.last = (time.perf_counter(), g)

    def latest(self) -> dict | None:
        if self.last is None:
            return None
        t, g = self.last
        return {**g, "age_ms": round((time.perf_counter() - t) * 1e3, 1)}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


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
    gpu = GpuWatch(max(int(a.period * 1000), 10))
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
                                "threads": threads, "gpu": gpu.latest()}) + "\n")
            left = a.period - (time.perf_counter() - t)
            if left > 0:
                time.sleep(left)
    gpu.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
