"""eager-decode's fix measured: the reproduction server eager vs under CUDA graphs, and the whole
launch-flag loop on its launch script.

    python3 examples/gpu_loop/eager_fix.py --out OUT [--device cuda] [--deadline 200]

1. ``stepbench``: the same small dense-MLP MLA model (no MoE; fixed ``fp8`` KV variant: no cast), one
   request, decode steps timed with CUDA events, eager and replayed from a CUDA graph;
2. the loop a user runs: a launch script starts the server eagerly (no ``--cuda-graph``);
   ``perfscope trace`` + ``diagnose`` (the eager-decode finding and its predicted step);
   ``perfscope fix eager-decode --launch-file launch.sh --trace RUN`` (diff), ``--apply
   --restart-cmd 'sh restart.sh'`` (backup, edit, restart, health, bench before/after), a trace of
   the fixed server, ``--revert`` (byte-identical, checked).

Everything goes to OUT (summary.json, logs.txt, runs.tar.gz); every phase is bounded by the deadline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = ["--num-layers", "32", "--hidden-size", "1024", "--num-heads", "8", "--vocab-size", "32000",
         "--max-total-tokens", "65536"]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Loop:
    def __init__(self, out: Path, deadline: float, device: str):
        self.out, self.device = out, device
        self.t_end = time.monotonic() + deadline
        self.log = open(out / "logs.txt", "w")
        self.summary: dict = {"device": device, "model": MODEL, "phases": {}}

    def left(self) -> float:
        return self.t_end - time.monotonic()

    def say(self, m: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {m}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run(self, name: str, argv: list[str], timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
        t = max(5.0, min(timeout, self.left()))
        self.say(f"$ {' '.join(argv)}  (limit {t:.0f}s)")
        t0 = time.monotonic()
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=t, cwd=cwd or REPO)
        except subprocess.TimeoutExpired as e:
            def text(b):
                return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")
            r = subprocess.CompletedProcess(argv, 124, text(e.stdout), text(e.stderr) + "\n(timed out)")
        self.log.write(f"--- {name}: rc {r.returncode} in {time.monotonic() - t0:.1f}s\n{r.stdout[-20000:]}\n"
                       f"--- stderr\n{r.stderr[-8000:]}\n")
        self.log.flush()
        self.summary["phases"][name] = {"rc": r.returncode, "s": round(time.monotonic() - t0, 1)}
        return r

    def perfscope(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run(name, [sys.executable, "-m", "perfscope", *args], timeout=timeout)


def wait_health(url: str, timeout: float) -> bool:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=200.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip-stepbench", action="store_true")
    ap.add_argument("--small", action="store_true", help="a CPU-sized model, for a dry run without a GPU")
    a = ap.parse_args()
    global MODEL
    if a.small:
        MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "2", "--vocab-size", "256",
                 "--max-total-tokens", "16384", "--threads", "1"]
    a.out.mkdir(parents=True, exist_ok=True)
    L = Loop(a.out, a.deadline, a.device)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"perfscope-eager-{os.getpid()}"
    work.mkdir(parents=True)
    if a.device.startswith("cuda"):
        r = L.run("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
        L.summary["gpu"] = r.stdout.strip()
    import torch

    L.summary["torch"] = torch.__version__

    # 1. in-process: eager vs CUDA graph step of the same model (CUDA events)
    if not a.skip_stepbench:
        modes = "eager,graph" if a.device.startswith("cuda") else "eager"
        r = L.run("stepbench", [sys.executable, "-m", "examples.repro_server.stepbench", "--device", a.device,
                                "--no-flashinfer", "--strategies", "fp8", "--modes", modes, "--batch", "1",
                                "--context", "512", "--steps", str(a.steps), "--warmup", "5", *MODEL, "--json",
                                "--out", str(a.out / "stepbench.json")], timeout=120)
        if (a.out / "stepbench.json").is_file():
            L.summary["stepbench"] = json.loads((a.out / "stepbench.json").read_text())

    # 2. the loop on a launch script
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launch = work / "launch.sh"
    launch.write_text(
        "#!/bin/sh\n"
        "# the decode server (perfscope's reproduction server), started eagerly\n"
        f"cd {REPO}\n"
        "export PYTHONUNBUFFERED=1\n"
        f"exec {sys.executable} -m examples.repro_server --device {a.device} --no-flashinfer --kv-strategy fp8 \\\n"
        f"  --port {port} --max-running-requests 8 --cuda-graph-max-bs 8 \\\n"
        f"  {' '.join(MODEL)} >> {work}/server.log 2>&1\n")
    restart = work / "restart.sh"
    restart.write_text(
        "#!/bin/sh\n"
        f"P={work}/pid\n"
        'if [ -f "$P" ]; then kill "$(cat "$P")" 2>/dev/null; '
        'i=0; while kill -0 "$(cat "$P")" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done; fi\n'
        f'setsid sh {launch} </dev/null >/dev/null 2>&1 &\n'
        'echo $! > "$P"\n')
    original = launch.read_bytes()
    L.summary["launch_sha256_before"] = hashlib.sha256(original).hexdigest()
    try:
        L.run("start", ["sh", str(restart)], timeout=20)
        ok = wait_health(url, min(90, L.left()))
        L.say(f"server healthy: {ok}")
        if not ok:
            return finish(L, work, 1)
        run_eager = work / "eager"
        L.perfscope("trace-eager", "trace", "--url", url, "--steps", "10", "--input-len", "256", "--output-len", "64",
                    "--bench", "4", "--out", str(run_eager), timeout=90)
        r = L.perfscope("diagnose-eager", "diagnose", str(run_eager), "--json", timeout=60)
        try:
            d = json.loads(r.stdout)
            L.summary["diagnose_eager"] = {"steps": d.get("steps"), "findings": d.get("findings"),
                                           "buckets": d.get("buckets")}
        except ValueError:
            pass
        fix = ["fix", "eager-decode", "--launch-file", str(launch), "--url", url, "--port", str(port),
               "--trace", str(run_eager), "--state-dir", str(work / "state")]
        r = L.perfscope("fix-check", *fix, timeout=60)
        L.summary["fix_check_stdout"] = r.stdout[-4000:]
        r = L.perfscope("fix-apply", *fix, "--apply", "--restart-cmd", f"sh {restart}", "--health-timeout", "120",
                        "--out", str(work / "fix"), "--bench-input-len", "256", "--bench-output-len", "64",
                        "--bench-requests", "4", "--json", timeout=200)
        try:
            rep = json.loads(r.stdout)
            L.summary["fix_apply"] = {k: rep.get(k) for k in ("outcome", "reason", "diff", "notes", "restart",
                                                              "strategy_reason")}
        except ValueError:
            pass
        L.summary["launch_after_apply"] = launch.read_text()
        if r.returncode == 0 and L.left() > 25:
            run_graph = work / "graph"
            L.perfscope("trace-graph", "trace", "--url", url, "--steps", "10", "--input-len", "256", "--output-len",
                        "64", "--out", str(run_graph), timeout=60)
            r2 = L.perfscope("diagnose-graph", "diagnose", str(run_graph), "--json", timeout=60)
            try:
                d2 = json.loads(r2.stdout)
                L.summary["diagnose_graph"] = {"steps": d2.get("steps"), "findings": d2.get("findings")}
            except ValueError:
                pass
        r = L.perfscope("fix-revert", *fix[:-2], "--state-dir", str(work / "state"), "--revert", timeout=60)
        L.summary["revert_byte_identical"] = launch.read_bytes() == original
        L.say(f"revert byte-identical: {L.summary['revert_byte_identical']}")
    finally:
        pidf = work / "pid"
        if pidf.is_file():
            subprocess.run(["sh", "-c", f'kill "$(cat {pidf})" 2>/dev/null; sleep 1; kill -9 "$(cat {pidf})" 2>/dev/null'],
                           timeout=10)
    return finish(L, work, 0)


def finish(L: Loop, work: Path, rc: int) -> int:
    for f in ("server.log",):
        if (work / f).is_file():
            L.log.write(f"--- {f}\n{(work / f).read_text()[-20000:]}\n")
    L.log.close()
    with tarfile.open(L.out / "runs.tar.gz", "w:gz") as t:
        for name in ("eager", "graph", "fix", "launch.sh", "restart.sh", "state"):
            if (work / name).exists():
                t.add(work / name, arcname=name)
    (L.out / "summary.json").write_text(json.dumps(L.summary, indent=2, default=str) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
