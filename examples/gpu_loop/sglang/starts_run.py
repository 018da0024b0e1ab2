"""How much does a host-bound SGLang's TPOT vary between process starts, and does pinning its CPUs
change it? One device call: install the carried set, write the dense seeded checkpoint, ``perfscope
fix fp8-kv-cast --strategy pages --apply`` before any server starts (the fixed server is host-bound:
~1 ms of GPU work per step), then rounds of ``--servers`` servers started side by side on the one GPU
(495k-token pool each), half of them pinned (``taskset``) to a disjoint block of CPUs, each benched in
turn while the others sit idle (concurrency 1: 2000 in / 64 out, twice; concurrency 16: 256 / 256),
then stopped; until the deadline. Also records the machine's CPU model and each server's CPU list.
``--revert`` restores the file byte for byte.

    python3 examples/gpu_loop/sglang/starts_run.py --payload /tmp/site.tar.xz --out $OUT --deadline 540

Writes OUT/summary.json (every start and bench) and OUT/logs.tar.gz."""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
from harness import Harness, healthy, install, parse_json as _json, restart_script  # noqa: E402


def cpu_model() -> dict:
    info = Path("/proc/cpuinfo").read_text(errors="replace")
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), None)
    gov = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {"model": model, "cpus": os.cpu_count(), "governor": gov.read_text().strip() if gov.is_file() else None,
            "numa": subprocess.run(["sh", "-c", "lscpu | grep -i numa"], capture_output=True, text=True).stdout}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/sw")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--pool", type=int, default=495000)
    ap.add_argument("--mem-fraction", default="0.18")
    ap.add_argument("--deadline", type=float, default=540)
    a = ap.parse_args()
    t0 = time.monotonic()
    out, work = Path(a.out), Path(a.work)
    S: dict = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu_model(),
               "servers": a.servers, "pool": a.pool, "rounds": []}
    h = Harness(out, work, a.deadline, t0, S, steps=True)
    py = sys.executable
    env = dict(os.environ)
    target, original, S["install"] = install(a.payload, Path("/tmp/site"), env, REPO, False)
    config = HERE / "config.json"
    fix = [py, "-m", "perfscope", "fix", "fp8-kv-cast", "--strategy", "pages", "--sglang-root", "/tmp/site/sglang",
           "--python", py, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
           "--state-dir", work / "state", "--json"]
    ncpu = os.cpu_count() or 16
    block = max(1, ncpu // a.servers)
    try:
        warm = subprocess.Popen([py, str(HERE / "warm_flashinfer.py"), str(config)], env=env,
                                stdout=open(h.logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        model = work / "model"
        h.run("make-checkpoint", [py, HERE / "make_checkpoint.py", config, model, "--seed", "0"], timeout=300, env=env)
        rc, so, se = h.run("fix-apply", fix + ["--apply"], env=env)
        S["apply"] = {"rc": rc, "out": _json(so, se[-400:])}
        try:
            warm.wait(max(5, min(150, h.left() - 300)))
        except subprocess.TimeoutExpired:
            pass
        rnd = 0
        while h.left() > 140:
            rnd += 1
            R: dict = {"round": rnd, "servers": {}}
            S["rounds"].append(R)
            scripts = []
            for i in range(a.servers):
                port = 30200 + i
                pinned = i % 2 == 1
                cpus = f"{i * block}-{i * block + block - 1}"
                argv = (["taskset", "-c", cpus] if pinned else []) + [
                    py, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "safetensors",
                    "--skip-tokenizer-init", "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
                    "--mem-fraction-static", a.mem_fraction, "--cuda-graph-bs", "1", "2", "4", "8", "12", "16",
                    "--chunked-prefill-size", "2048", "--max-running-requests", "32", "--host", "127.0.0.1",
                    "--port", str(port), "--random-seed", "0", "--max-total-tokens", str(a.pool)]
                f = restart_script(work / f"srv-{i}.sh", argv, env, work / f"server-{i}.pid", h.logs / f"server-{i}.log")
                subprocess.run(["sh", str(f)], check=True)
                scripts.append(f)
                R["servers"][str(port)] = {"pinned": cpus if pinned else None}
            end = time.monotonic() + h.left() - 60
            up: list[int] = []
            while time.monotonic() < end and len(up) < a.servers:
                for i in range(a.servers):
                    if 30200 + i not in up and healthy(30200 + i):
                        up.append(30200 + i)
                        R["servers"][str(30200 + i)]["healthy_s"] = h.now()
                        h.log(f"round {rnd}: server {30200 + i} healthy")
                time.sleep(0.5)
            h.save()
            for port in up:
                if h.left() < 25:
                    break
                r = R["servers"][str(port)]
                for name, (il, ol, n, c) in (("c1a", (2000, 64, 8, 1)), ("c1b", (2000, 64, 8, 1)),
                                             ("c16", (256, 256, 16, 16))):
                    rc, so, se = h.run(f"bench-r{rnd}-{port}-{name}", [
                        py, "-m", "perfscope", "bench", "--url", f"http://127.0.0.1:{port}", "--input-len", il,
                        "--output-len", ol, "--num-requests", n, "--concurrency", c, "--warmup", 1, "--json"],
                        timeout=120, env=env)
                    b = _json(so, None) or {}
                    r[name] = {k: b.get(k) for k in ("tpot_ms", "itl_p50_ms", "throughput_tok_s", "failed")}
                    r[name]["per_request"] = [round(q["tpot_ms"], 4) for q in b.get("per_request") or []
                                              if q.get("tpot_ms")]
                h.save()
            for i in range(a.servers):
                pidf = work / f"server-{i}.pid"
                if pidf.is_file():
                    pg = shlex.quote(pidf.read_text().strip())
                    subprocess.run(["sh", "-c", f"kill -TERM -{pg} 2>/dev/null; sleep 3; kill -KILL -{pg} 2>/dev/null"])
                    pidf.unlink()
            time.sleep(3)
    except Exception as e:  # noqa: BLE001 - recorded, then the file is reverted and everything packed
        S["error"] = f"{type(e).__name__}: {e}"[-2000:]
        h.log(f"FAILED: {S['error'][:800]}")
    finally:
        for i in range(a.servers):
            pidf = work / f"server-{i}.pid"
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
    return 0 if not S.get("error") else 1


if __name__ == "__main__":
    raise SystemExit(main())
