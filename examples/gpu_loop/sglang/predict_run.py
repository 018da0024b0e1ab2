"""Predicted vs measured TPOT on the real SGLang, one device call per model: for each KV pool size,
an unmodified SGLang 0.5.13.post1 (FP8 KV pool, FlashInfer MLA, CUDA graphs for batch 1-16, overlap
scheduler on) is traced at concurrency 1 and 16 by ``perfscope trace --bench N``: the bench without
any profiler first, then a short GPU-only profile (kernels and CUDA runtime calls only, the host
timeline nearly free of the CPU profiler's cost: RUN/host-timing), then the full trace (CPU ops with
stacks and shapes). Then ``perfscope fix fp8-kv-cast
--strategy pages --apply --restart-cmd`` patches the installed SGLang and restarts every server, and
each fixed server is benched fresh (before any trace: a GPU trace leaves CUPTI attached), benched
again three times, traced, and benched three times more (the lasting after-trace cost), one server
with ``TEARDOWN_CUPTI=1`` in its environment and one without; then every fixed server is restarted
(``--starts``) and benched fresh again: the spread between process starts is the measurement's. ``--revert`` restores the file byte for
byte. The predictions are made afterwards from the bug runs by ``perfscope diagnose`` (on any
machine): ``examples/gpu_loop/sglang/predict_table.py`` prints predicted vs measured. (The results in
``results/h200-2026-12-01-predict`` were taken by an earlier form of this script, with a separate
``perfscope bench``, ``trace --gpu-only`` and ``trace`` per case, arranged into the same layout.)

    python3 examples/gpu_loop/sglang/predict_run.py --payload payload/site.tar.xz --model dense \\
        --pools 495000,3000000 --out $OUT --deadline 560
    python3 examples/gpu_loop/sglang/predict_run.py --payload P --model moe --no-server --out /tmp/o
                                                   # CPU dry run: install, apply, revert

Writes OUT/summary.json (every step, every bench), OUT/runs.tar (the run folders: traces, run.json,
bench-*.json) and OUT/logs.tar.gz (command output, server logs)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
from harness import Harness, healthy, install, parse_json as _json, restart_script  # noqa: E402

CONFIGS = {"dense": HERE / "config.json", "moe": HERE / "config_moe.json"}
C1 = {"input_len": 2000, "output_len": 64}   # batch 1: one request at a time
C16 = {"input_len": 256, "output_len": 256}  # 16 in flight: short prompts, so prefill chunks barely interrupt decode


def server_info(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as r:
        i = json.loads(r.read())
    return {k: i.get(k) for k in ("version", "max_total_num_tokens", "kv_cache_dtype", "attention_backend",
                                  "cuda_graph_max_bs", "disable_overlap_schedule", "mem_fraction_static")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload", required=True)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="dense")
    ap.add_argument("--pools", default="495000,3000000")
    ap.add_argument("--teardown", default="1", help="index (in --pools) of the server restarted with TEARDOWN_CUPTI=1")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/pw")
    ap.add_argument("--deadline", type=float, default=560)
    ap.add_argument("--mem-fraction", default="0.38")
    ap.add_argument("--starts", type=int, default=2, help="process starts of the fixed servers, each benched fresh")
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--no-stack-c1", action="store_true",
                    help="also trace each bug server at batch 1 with --no-stack --no-shapes (RUN-nostack: the bench "
                         "and the GPU-only profile again, then a full trace without stacks and shapes)")
    a = ap.parse_args()
    t0 = time.monotonic()
    out, work = Path(a.out), Path(a.work)
    S: dict = {"model": a.model, "pools": a.pools, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    h = Harness(out, work, a.deadline, t0, S, steps=True)
    py = sys.executable
    config = CONFIGS[a.model]
    env = dict(os.environ)
    target, original, S["install"] = install(a.payload, Path("/tmp/site"), env, REPO, a.no_server)
    h.save()
    pools = [int(p) for p in a.pools.split(",") if p]
    ports = {p: 30123 + i for i, p in enumerate(pools)}
    teardown = {pools[int(i)] for i in a.teardown.split(",") if i != "" and int(i) < len(pools)}
    fix = [py, "-m", "perfscope", "fix", "fp8-kv-cast", "--strategy", "pages", "--sglang-root", "/tmp/site/sglang",
           "--python", py, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
           "--state-dir", work / "state", "--json"]

    def perfscope(name: str, args: list, timeout: float = 120):
        return h.run(name, [py, "-m", "perfscope", *args], timeout=timeout, env=env)

    def bench(name: str, port: int, w: dict, n: int, conc: int, dest: Path | None = None) -> dict:
        return h.bench(name, py, env, f"http://127.0.0.1:{port}", w, n, conc, dest)

    def trace(name: str, port: int, w: dict, conc: int, dest: Path, bench_n: int = 0, extra: tuple = ()) -> dict:
        return h.trace(name, py, env, f"http://127.0.0.1:{port}", w, conc, dest, bench_n, extra)

    runs = work / "runs"
    try:
        if a.no_server:
            rc, so, se = h.run("fix-apply", fix + ["--apply"], env=env)
            S["apply"] = {"rc": rc, "out": _json(so, so[-400:])}
            return 0
        warm = subprocess.Popen([py, str(HERE / "warm_flashinfer.py"), str(config)], env=env,
                                stdout=open(h.logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        model = work / "model"
        if a.model == "dense":  # the seeded random checkpoint of the earlier real-SGLang runs
            rc, so, _ = h.run("make-checkpoint", [py, HERE / "make_checkpoint.py", config, model, "--seed", "0"],
                              timeout=300, env=env)
            load = ["--load-format", "safetensors"]
        else:  # 10 MoE layers of 64 experts: SGLang's dummy weights (no 11 GB checkpoint to write)
            model.mkdir(parents=True, exist_ok=True)
            (model / "config.json").write_text(config.read_text())
            load = ["--load-format", "dummy"]
        try:
            warm.wait(max(5, min(150, h.left() - 300)))
        except subprocess.TimeoutExpired:
            pass

        def script(pool: int, extra: dict) -> Path:
            port = ports[pool]
            argv = [py, "-m", "sglang.launch_server", "--model-path", str(model), *load, "--skip-tokenizer-init",
                    "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
                    "--mem-fraction-static", a.mem_fraction, "--cuda-graph-bs", "1", "2", "4", "8", "12", "16",
                    "--chunked-prefill-size", "2048", "--max-running-requests", "32", "--host", "127.0.0.1",
                    "--port", str(port), "--random-seed", "0", "--max-total-tokens", str(pool)]
            f = restart_script(work / f"srv-{pool}.sh", argv, env, work / f"server-{pool}.pid",
                               h.logs / f"server-{pool}.log", extra)
            S.setdefault("servers", {})[str(pool)] = {"argv": argv, "env": extra}
            return f

        def wait_all(phase: str, budget: float) -> list[int]:
            end = time.monotonic() + budget
            up: list[int] = []
            while time.monotonic() < end and h.left() > 30 and len(up) < len(pools):
                for p in pools:
                    if p not in up and healthy(ports[p]):
                        up.append(p)
                        S["servers"][str(p)][f"healthy_{phase}_s"] = h.now()
                        S["servers"][str(p)][f"server_info_{phase}"] = server_info(ports[p])
                        h.log(f"server {p} healthy ({phase})")
                time.sleep(0.5)
            h.save()
            return up

        for p in pools:
            subprocess.run(["sh", str(script(p, {}))], check=True)
        up = wait_all("bug", h.left() - 200)
        # ---------------------------------------------------------------- the bug, before any fix
        for p in up:
            port, R = ports[p], {}
            S.setdefault("bug", {})[str(p)] = R
            big = p > 1_000_000
            for conc, w, n in ((1, C1, 3 if big else 5), (16, C16, 16)):
                if h.left() < 200:
                    break
                # one command: the bench without any profiler first, the GPU-only host-timing profile
                # (RUN/host-timing), then the full trace: the run folder diagnose reads as it is
                R[f"trace_c{conc}"] = trace(f"trace-bug-{p}-c{conc}", port, w, conc, runs / f"{p}-bug-c{conc}",
                                            bench_n=n)
                if a.no_stack_c1 and conc == 1 and h.left() > 200:
                    R["trace_c1_nostack"] = trace(f"trace-bug-{p}-c1-nostack", port, w, 1,
                                                  runs / f"{p}-bug-c1-nostack", bench_n=n,
                                                  extra=("--no-stack", "--no-shapes"))
            h.save()
        # ---------------------------------------------------------------- the fix, restarting every server
        rs = work / "restart-all.sh"
        rs.write_text("#!/bin/sh\n" + "".join(
            f"sh {shlex.quote(str(script(p, {'TEARDOWN_CUPTI': '1'} if p in teardown else {})))}\n" for p in pools))
        first = pools[0]
        rc, so, se = h.run("fix-apply-restart", fix + ["--apply", "--url", f"http://127.0.0.1:{ports[first]}", "--restart-cmd",
                                                       f"sh {rs}", "--health-timeout", "300", "--bench-input-len",
                                                       str(C1["input_len"]), "--bench-output-len",
                                                       str(C1["output_len"]), "--bench-requests", "4",
                                                       "--out", str(work / "fixrun")], timeout=420, env=env)
        S["fix"] = _json(so, {"rc": rc, "stderr": se[-1500:]})
        S["fix_rc"] = rc
        S["file_sha256_after_fix"] = hashlib.sha256(target.read_bytes()).hexdigest()
        h.save()
        up = wait_all("fixed", min(240, h.left() - 40))
        # ---------------------------------------------------------------- fixed: fresh benches, traces, benches
        for p in up:
            port, R = ports[p], {}
            S.setdefault("fixed", {})[str(p)] = R
            R["teardown_cupti"] = p in teardown
            R["bench_c1"] = bench(f"bench-fixed-{p}-c1", port, C1, 8, 1, runs / f"{p}-fixed-c1")
            R["bench_c16"] = bench(f"bench-fixed-{p}-c16", port, C16, 16, 16, runs / f"{p}-fixed-c16")
            R["before_trace_c1"] = [bench(f"bench-fixed-{p}-pre{i}", port, C1, 10, 1) for i in range(3)]
            h.save()
            if h.left() < 70:
                continue
            R["trace_c1_full"] = trace(f"trace-fixed-{p}-c1-full", port, C1, 1, runs / f"{p}-fixed-c1" / "full")
            if h.left() > 60:
                R["trace_c16_full"] = trace(f"trace-fixed-{p}-c16-full", port, C16, 16,
                                            runs / f"{p}-fixed-c16" / "full")
            R["alive_after_traces"] = healthy(port)
            R["after_trace_c1"] = [bench(f"bench-fixed-{p}-post{i}", port, C1, 10, 1) for i in range(3)
                                   if h.left() > 25]
            h.save()
        # ---------------------------------------------------------------- fixed, further process starts
        # a process's host speed varies between starts: the measurement a prediction is held to is the
        # fresh bench of each start (before any trace of that process), their spread the measurement's
        for k in range(2, a.starts + 1):
            if h.left() < 150:
                break
            subprocess.run(["sh", str(rs)], check=True)
            for p in wait_all(f"fixed-start{k}", min(200, h.left() - 60)):
                port, R = ports[p], S["fixed"].setdefault(str(p), {})
                R[f"start{k}_bench_c1"] = bench(f"bench-fixed-{p}-start{k}-c1", port, C1, 8, 1,
                                                runs / f"{p}-fixed-c1" / f"start{k}")
                R[f"start{k}_bench_c16"] = bench(f"bench-fixed-{p}-start{k}-c16", port, C16, 16, 16,
                                                 runs / f"{p}-fixed-c16" / f"start{k}")
            h.save()
    except Exception as e:  # noqa: BLE001 - recorded, then the file is reverted and everything packed
        S["error"] = f"{type(e).__name__}: {e}"[-2000:]
        h.log(f"FAILED: {S['error'][:800]}")
    finally:
        for p in pools:
            pidf = work / f"server-{p}.pid"
            if pidf.is_file():
                subprocess.run(["sh", "-c", f"kill -TERM -{pidf.read_text().strip()} 2>/dev/null; sleep 2; "
                                            f"kill -KILL -{pidf.read_text().strip()} 2>/dev/null"])
        if target.read_bytes() != original:
            rc, so, se = h.run("fix-revert", fix + ["--revert"], timeout=60, env=env, margin=0)
            S["revert"] = _json(so, {"rc": rc, "stderr": se[-400:]})
        S["reverted_byte_identical"] = target.read_bytes() == original
        S["total_s"] = h.now()
        h.save()
        h.pack((*sorted(work.glob("*.sh")), work / "fixrun"), runs)
    return 0 if not S.get("error") else 1


if __name__ == "__main__":
    raise SystemExit(main())
