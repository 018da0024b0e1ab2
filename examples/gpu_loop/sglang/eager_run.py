"""eager-decode's prediction against the real SGLang, one device call: an unmodified SGLang 0.5.13.post1
(the dense DeepSeek-V2-shaped MLA model of ``config.json``, or ``--model moe``: the 12-layer
DeepSeek-V2-Lite shape of ``config_moe.json`` with dummy weights; BF16 KV pool: no FP8 cast, FlashInfer MLA,
overlap scheduler on) launched with ``--disable-cuda-graph`` from a launch script, traced at concurrency
1 and 16 by ``perfscope trace --bench N`` (the bench without any profiler first, the GPU-only
host-timing profile, then the full trace). Then ``perfscope fix eager-decode --launch-file SCRIPT
--trace RUN --apply --restart-cmd 'sh SCRIPT'`` removes the flag and restarts the server; the fixed
server is benched fresh (before any trace), three times more, traced once, and restarted
(``--starts``) and benched fresh again. ``--revert`` restores the script byte for byte.
``eager_table.py`` prints predicted (``perfscope diagnose`` of the bug runs, any machine) against
measured.

    python3 examples/gpu_loop/sglang/eager_run.py --payload payload/site.tar.xz --out $OUT --deadline 560

Writes OUT/summary.json (every step, every bench), OUT/runs.tar (the run folders) and
OUT/logs.tar.gz (command output, server log, the launch script before and after)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
from harness import Harness, healthy, install, parse_json as _json, restart_script  # noqa: E402
from predict_run import C1, C16, CONFIGS, server_info  # noqa: E402

PORT = 30141


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload", required=True)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="dense")
    ap.add_argument("--pool", type=int, default=200000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/ew")
    ap.add_argument("--deadline", type=float, default=560)
    ap.add_argument("--mem-fraction", default="0.38")
    ap.add_argument("--starts", type=int, default=2, help="process starts of the fixed server, each benched fresh")
    a = ap.parse_args()
    t0 = time.monotonic()
    out, work = Path(a.out), Path(a.work)
    S: dict = {"model": a.model, "pool": a.pool, "kv": "bf16", "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    h = Harness(out, work, a.deadline, t0, S, steps=True)
    py = sys.executable
    config = CONFIGS[a.model]
    env = dict(os.environ)
    _, _, S["install"] = install(a.payload, Path("/tmp/site"), env, REPO, False)
    url = f"http://127.0.0.1:{PORT}"
    runs = work / "runs"
    pidf = work / "server.pid"

    def perfscope(name: str, args: list, timeout: float = 120):
        return h.run(name, [py, "-m", "perfscope", *args], timeout=timeout, env=env)

    def bench(name: str, w: dict, n: int, conc: int, dest: Path | None = None) -> dict:
        return h.bench(name, py, env, url, w, n, conc, dest)

    def trace(name: str, w: dict, conc: int, dest: Path, bench_n: int = 0) -> dict:
        return h.trace(name, py, env, url, w, conc, dest, bench_n)

    def wait(phase: str, budget: float) -> bool:
        end = time.monotonic() + budget
        while time.monotonic() < end and h.left() > 30:
            if healthy(PORT):
                S.setdefault("server", {})[f"healthy_{phase}_s"] = h.now()
                S["server"][f"server_info_{phase}"] = server_info(PORT)
                h.log(f"server healthy ({phase})")
                return True
            time.sleep(0.5)
        return False

    launch = work / "srv.sh"
    try:
        warm = subprocess.Popen([py, str(HERE / "warm_flashinfer.py"), str(config)], env=env,
                                stdout=open(h.logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        model = work / "model"
        if a.model == "dense":  # the seeded random checkpoint of the earlier real-SGLang runs
            h.run("make-checkpoint", [py, HERE / "make_checkpoint.py", config, model, "--seed", "0"], timeout=300, env=env)
            load = ["--load-format", "safetensors"]
        else:  # the MoE layers: SGLang's dummy weights
            model.mkdir(parents=True, exist_ok=True)
            (model / "config.json").write_text(config.read_text())
            load = ["--load-format", "dummy"]
        try:
            warm.wait(max(5, min(150, h.left() - 300)))
        except subprocess.TimeoutExpired:
            pass
        argv = [py, "-m", "sglang.launch_server", "--model-path", str(model), *load, "--skip-tokenizer-init", "--attention-backend", "flashinfer", "--mem-fraction-static", a.mem_fraction,
                "--chunked-prefill-size", "2048", "--max-running-requests", "32", "--host", "127.0.0.1",
                "--port", str(PORT), "--random-seed", "0", "--max-total-tokens", str(a.pool), "--disable-cuda-graph"]
        restart_script(launch, argv, env, pidf, h.logs / "server.log")
        S["launch_before"] = launch.read_text()
        subprocess.run(["sh", str(launch)], check=True)
        if not wait("bug", h.left() - 250):
            raise RuntimeError("the eager server did not become healthy")
        # ---------------------------------------------------------------- the bug: eager decode
        for conc, w, n in ((1, C1, 5), (16, C16, 16)):
            if h.left() < 230:
                break
            S[f"trace_bug_c{conc}"] = trace(f"trace-bug-c{conc}", w, conc, runs / f"eager-c{conc}" / "bug", bench_n=n)
            h.save()
        rc, so, se = perfscope("diagnose-bug-c1", ["diagnose", runs / "eager-c1" / "bug", "--json"], timeout=120)
        S["diagnose_bug_c1"] = [(f["id"], f.get("predicted_step_ms_after_fix")) for f in
                                (_json(so, {}) or {}).get("findings", [])]
        # ---------------------------------------------------------------- the fix: the launch flag
        fix = ["fix", "eager-decode", "--launch-file", launch, "--url", url, "--trace", runs / "eager-c1" / "bug",
               "--state-dir", work / "state", "--json"]
        rc, so, se = perfscope("fix-apply-restart", fix + ["--apply", "--restart-cmd", f"sh {shlex.quote(str(launch))}",
                                                           "--health-timeout", "240", "--bench-input-len",
                                                           C1["input_len"], "--bench-output-len", C1["output_len"],
                                                           "--bench-requests", 4, "--out", work / "fixrun"],
                               timeout=400)
        S["fix"] = _json(so, {"rc": rc, "stderr": se[-1500:]})
        S["fix_rc"] = rc
        S["launch_after"] = launch.read_text()
        if "--disable-cuda-graph" in S["launch_after"]:  # the fix refused or reverted: measure graphs anyway
            h.log("launch script still eager: restarting without --disable-cuda-graph by hand")
            restart_script(launch, argv[:-1], env, pidf, h.logs / "server.log")
            subprocess.run(["sh", str(launch)], check=True)
            S["fixed_by_hand"] = True
        if not wait("fixed", min(240, h.left() - 40)):
            raise RuntimeError("the fixed server did not become healthy")
        R = S.setdefault("fixed", {})
        R["bench_c1"] = bench("bench-fixed-c1", C1, 8, 1, runs / "eager-c1" / "fixed")
        R["bench_c16"] = bench("bench-fixed-c16", C16, 16, 16, runs / "eager-c16" / "fixed")
        R["before_trace_c1"] = [bench(f"bench-fixed-pre{i}", C1, 10, 1) for i in range(3) if h.left() > 120]
        h.save()
        if h.left() > 90:
            R["trace_c1_full"] = trace("trace-fixed-c1-full", C1, 1, runs / "eager-c1" / "fixed" / "full")
        for k in range(2, a.starts + 1):
            if h.left() < 120:
                break
            subprocess.run(["sh", str(launch)], check=True)
            if wait(f"fixed-start{k}", min(200, h.left() - 60)):
                R[f"start{k}_bench_c1"] = bench(f"bench-fixed-start{k}-c1", C1, 8, 1,
                                                runs / "eager-c1" / "fixed" / f"start{k}")
                R[f"start{k}_bench_c16"] = bench(f"bench-fixed-start{k}-c16", C16, 16, 16,
                                                 runs / "eager-c16" / "fixed" / f"start{k}")
            h.save()
    except Exception as e:  # noqa: BLE001 - recorded, then the script is reverted and everything packed
        S["error"] = f"{type(e).__name__}: {e}"[-2000:]
        h.log(f"FAILED: {S['error'][:800]}")
    finally:
        if pidf.is_file():
            p = pidf.read_text().strip()
            subprocess.run(["sh", "-c", f"kill -TERM -{p} 2>/dev/null; sleep 2; kill -KILL -{p} 2>/dev/null"])
        if S.get("fix_rc") is not None and not S.get("fixed_by_hand"):
            rc, so, se = h.run("fix-revert", [py, "-m", "perfscope", "fix", "eager-decode", "--launch-file", launch,
                                              "--state-dir", work / "state", "--revert", "--json"],
                               timeout=60, env=env, margin=0)
            S["revert"] = _json(so, {"rc": rc, "stderr": se[-400:]})
            S["reverted_byte_identical"] = launch.read_text() == S.get("launch_before")
        S["total_s"] = h.now()
        h.save()
        h.pack((work / "fixrun",), runs)
    return 0 if not S.get("error") else 1


if __name__ == "__main__":
    raise SystemExit(main())
