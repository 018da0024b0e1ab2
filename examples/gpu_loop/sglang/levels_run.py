"""Why does a host-bound SGLang's TPOT switch between two levels (~1.25 and ~1.85 ms per step on the
H200 VM, starts_run.py)? One device call: the pages patch applied before the server starts (the fixed
server is host-bound), one dense server (495k pool), a sampler process beside it
(``hostprobe.py``: every 20 ms the CPU each busy server thread is on, its CPU time and involuntary
context switches, the steal/irq time of every CPU from /proc/stat, and the time of a fixed busy loop on
a CPU of its own, and the GPU's SM clock, power and clock-event reasons from a read-only
``nvidia-smi -lms`` loop), and sequential batch-1 requests (2000 in / 64 out) timed per token, in phases:
unpinned, the scheduler process pinned to one CPU, to another CPU (its hyperthread sibling when the
machine has them), unpinned again. ``--revert`` restores the file byte for byte.

    python3 examples/gpu_loop/sglang/levels_run.py --payload /tmp/site.tar.xz --out $OUT --deadline 420

Writes OUT/summary.json (phases, per-request TPOT, per-token times), OUT/samples.jsonl.gz (the
sampler's timeline; same clock: CLOCK_MONOTONIC) and OUT/logs.tar.gz. ``levels_table.py OUT`` reads
them on any machine."""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
from harness import Harness, healthy, install, parse_json as _json, restart_script  # noqa: E402


def siblings(cpu: int) -> list[int]:
    """The CPUs sharing ``cpu``'s core (itself included), from sysfs."""
    p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    if not p.is_file():
        return [cpu]
    out: list[int] = []
    for part in p.read_text().strip().split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def cpu_time(pid: int) -> float:
    try:
        f = (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/lw")
    ap.add_argument("--pool", type=int, default=495000)
    ap.add_argument("--mem-fraction", default="0.30")
    ap.add_argument("--requests", type=int, default=30, help="requests per phase")
    ap.add_argument("--deadline", type=float, default=420)
    a = ap.parse_args()
    t0 = time.monotonic()
    out, work = Path(a.out), Path(a.work)
    ncpu = os.cpu_count() or 16
    S: dict = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": ncpu,
               "siblings_of_2": siblings(2), "phases": []}
    h = Harness(out, work, a.deadline, t0, S, steps=True)
    py = sys.executable
    env = dict(os.environ)
    target, original, S["install"] = install(a.payload, Path("/tmp/site"), env, REPO, False)
    sys.path[:0] = [str(Path("/tmp/site")), str(REPO)]
    config = HERE / "config.json"
    fix = [py, "-m", "perfscope", "fix", "fp8-kv-cast", "--strategy", "pages", "--sglang-root", "/tmp/site/sglang",
           "--python", py, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
           "--state-dir", work / "state", "--json"]
    probe_cpu = ncpu - 1
    sib = [c for c in siblings(2) if c != 2]
    pins = [("unpinned", None), ("scheduler-on-cpu2", "2"),
            (f"scheduler-on-cpu{sib[0] if sib else 3}", str(sib[0] if sib else 3)), ("unpinned-again", None)]
    port = 30300
    sampler = None
    try:
        warm = subprocess.Popen([py, str(HERE / "warm_flashinfer.py"), str(config)], env=env,
                                stdout=open(h.logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        model = work / "model"
        h.run("make-checkpoint", [py, HERE / "make_checkpoint.py", config, model, "--seed", "0"], timeout=300, env=env)
        rc, so, se = h.run("fix-apply", fix + ["--apply"], env=env)
        S["apply"] = {"rc": rc, "out": _json(so, se[-400:])}
        try:
            warm.wait(max(5, min(150, h.left() - 200)))
        except subprocess.TimeoutExpired:
            pass
        argv = [py, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "safetensors",
                "--skip-tokenizer-init", "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
                "--mem-fraction-static", a.mem_fraction, "--cuda-graph-bs", "1", "2", "4",
                "--chunked-prefill-size", "2048", "--max-running-requests", "8", "--host", "127.0.0.1",
                "--port", str(port), "--random-seed", "0", "--max-total-tokens", str(a.pool)]
        pidf = work / "server.pid"
        f = restart_script(work / "srv.sh", argv, env, pidf, h.logs / "server.log")
        subprocess.run(["sh", str(f)], check=True)
        while h.left() > 60 and not healthy(port):
            time.sleep(0.5)
        S["healthy_s"] = h.now()
        h.log(f"server healthy: {healthy(port)}")
        root = int(pidf.read_text().strip())
        from perfscope.bench.workload import make_prompts, stream_one
        from perfscope.remote.sglang_api import SGLangClient

        client = SGLangClient(f"http://127.0.0.1:{port}", timeout=60)
        prompts = make_prompts(a.requests * len(pins) + 4, 2000, seed=0)
        before = {p: cpu_time(p) for p in tree(root)}
        for i in range(3):  # warm-up; the busiest process is the scheduler
            stream_one(client, prompts[i], 64)
        busy = sorted(((cpu_time(p) - before.get(p, 0.0), p) for p in tree(root)), reverse=True)
        sched = busy[0][1]
        S["scheduler_pid"] = sched
        S["process_cpu_s_warmup"] = [(round(c, 3), p) for c, p in busy[:5]]
        sampler = subprocess.Popen([py, str(HERE / "hostprobe.py"), "--pids", ",".join(map(str, tree(root))),
                                    "--out", str(out / "samples.jsonl.gz"), "--cpu", str(probe_cpu),
                                    "--period", "0.02"], env=env, stderr=open(h.logs / "hostprobe.err", "wb"))
        time.sleep(0.5)
        k = 4
        for name, cpu in pins:
            if h.left() < 30:
                break
            r = subprocess.run(["taskset", "-a", "-p", "-c", cpu or f"0-{ncpu - 1}", str(sched)],
                               capture_output=True, text=True)
            P: dict = {"name": name, "cpus": cpu, "taskset_rc": r.returncode, "t_start": time.perf_counter(),
                       "requests": []}
            S["phases"].append(P)
            for _ in range(a.requests):
                if h.left() < 25:
                    break
                rt = stream_one(client, prompts[k], 64)
                k += 1
                P["requests"].append({"start": rt.start, "ttft_s": rt.ttft_s, "itl_s": [round(x, 6) for x in rt.itl_s],
                                      "tpot_ms": None if rt.tpot_s is None else round(rt.tpot_s * 1e3, 4),
                                      "ok": rt.ok, "error": rt.error or None})
            P["t_end"] = time.perf_counter()
            tp = sorted(q["tpot_ms"] for q in P["requests"] if q["tpot_ms"])
            P["tpot_median_ms"] = tp[len(tp) // 2] if tp else None
            h.log(f"{name}: median TPOT {P['tpot_median_ms']} ms over {len(tp)}")
            h.save()
    except Exception as e:  # noqa: BLE001 - recorded, then the file is reverted and everything packed
        S["error"] = f"{type(e).__name__}: {e}"[-2000:]
        h.log(f"FAILED: {S['error'][:800]}")
    finally:
        if sampler is not None:
            sampler.terminate()
            try:
                sampler.wait(10)
            except subprocess.TimeoutExpired:
                sampler.kill()
        pidf = work / "server.pid"
        if pidf.is_file():
            subprocess.run(["sh", "-c", f"kill -KILL -{shlex.quote(pidf.read_text().strip())} 2>/dev/null"])
        if target.read_bytes() != original:
            rc, so, se = h.run("fix-revert", fix + ["--revert"], timeout=60, env=env, margin=0)
            S["revert"] = _json(so, {"rc": rc, "stderr": se[-400:]})
        S["reverted_byte_identical"] = target.read_bytes() == original
        S["file_sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
        S["total_s"] = h.now()
        h.save()
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tf:
            tf.add(h.logs, arcname="logs")
        shutil.rmtree(work / "model", ignore_errors=True)
    return 0 if not S.get("error") else 1


if __name__ == "__main__":
    raise SystemExit(main())
