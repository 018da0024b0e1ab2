"""untuned-fused-moe end to end on the real SGLang, one device call: an unmodified SGLang 0.5.13.post1
serving the 12-layer DeepSeek-V2-Lite-shaped MoE model of ``config_moe.json`` (10 MoE layers, 64
routed experts top-6, dummy weights, BF16 KV so that no KV cast hides the MoE; CUDA graphs for batch
1-64, overlap scheduler on) is

1. benched without any profiler at concurrency 1, 16 and 64 (TPOT, throughput), its greedy outputs
   with top-5 logprobs recorded (4 prompts one by one, then all 4 at once);
2. traced at concurrency 16 (``perfscope trace --bench``) and diagnosed with its server log
   (``diagnose --server-log``): the ``untuned-fused-moe`` finding with the missing file;
3. fixed: ``perfscope fix untuned-fused-moe --trace RUN --apply --restart-cmd`` tunes SGLang's own
   kernel for the served batch sizes on this GPU (bounded by ``--budget``), installs the config,
   restarts the server and keeps the file only when TPOT at concurrency 16 drops beyond the noise;
4. benched again at 1, 16 and 64 and its outputs compared with step 1's;
5. reverted (``fix --revert``): the install's configs folder byte for byte as before.

    python3 examples/gpu_loop/sglang/moe_fix_run.py --payload P/site.tar.xz --out $OUT --deadline 580
    python3 examples/gpu_loop/sglang/moe_fix_run.py --site /tmp/site --out $OUT   # SGLang already unpacked

Writes OUT/summary.json (every step: benches, outputs compared, the finding, the fix's record) and
OUT/logs.tar.gz (command output, the server log, the run folders' JSON)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
from harness import Harness, healthy, install, parse_json as _json, restart_script  # noqa: E402

CONFIG = HERE / "config_moe.json"
W = {"input_len": 256, "output_len": 128}
CONCURRENCY = ((1, 8), (16, 32), (64, 64))  # (in flight, measured requests)
PORT = 30131
CONFIGS_REL = "srt/layers/moe/moe_runner/triton_utils/configs"


def _post(port: int, path: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def tree_digest(root: Path) -> dict:
    """sha256 of every file under ``root`` (relative path -> digest): the install compared byte for byte."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def outputs(port: int, vocab: int) -> dict:
    """Greedy ids and top-5 logprobs of 4 fixed prompts, one by one and as one batch of 4."""
    prompts = [[(7 * i + 13 * j) % (vocab - 1) + 1 for j in range(n)] for i, n in enumerate((64, 200, 500, 120))]
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}

    def one(r: dict) -> dict:
        m = r.get("meta_info") or {}
        lp = [x[0] for x in m.get("output_token_logprobs") or []]
        top = [[t[0] for t in (x or [])] for x in m.get("output_top_logprobs") or []]
        return {"ids": r.get("output_ids"), "logprobs": lp, "top5": top}

    body = {"sampling_params": sp, "return_logprob": True, "top_logprobs_num": 5}
    single = [one(_post(port, "/generate", {**body, "input_ids": p})) for p in prompts]
    batch = [one(r) for r in _post(port, "/generate", {**body, "input_ids": prompts})]
    return {"single": single, "batch": batch}


def same_outputs(a: dict, b: dict) -> dict:
    """Ids identical? The largest logprob difference (a tuned tile order may move the last bits)."""
    ids_same, diff = True, 0.0
    for k in ("single", "batch"):
        for x, y in zip(a.get(k) or [], b.get(k) or []):
            ids_same &= x["ids"] == y["ids"]
            for p, q in zip(x["logprobs"], y["logprobs"]):
                if p is not None and q is not None:
                    diff = max(diff, abs(p - q))
    return {"ids_identical": ids_same, "max_abs_logprob_diff": diff}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload", help="the archive make_payload.py writes (unpacked into --site)")
    ap.add_argument("--site", default="/tmp/site")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/mw")
    ap.add_argument("--deadline", type=float, default=580)
    ap.add_argument("--budget", type=float, default=150, help="the tuning's bound (fix --budget)")
    ap.add_argument("--mem-fraction", default="0.5")
    a = ap.parse_args()
    t0 = time.monotonic()
    out, work, site = Path(a.out), Path(a.work), Path(a.site)
    S: dict = {"model": "moe", "config": json.loads(CONFIG.read_text()),
               "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    h = Harness(out, work, a.deadline, t0, S, steps=True)
    py = sys.executable
    env = dict(os.environ)
    if a.payload:
        _, _, S["install"] = install(a.payload, site, env, REPO, False)
    else:
        env.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), FLASHINFER_CUDA_ARCH_LIST="9.0a",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    sglang_root = site / "sglang"
    configs = sglang_root / CONFIGS_REL
    S["configs_before"] = before_tree = tree_digest(configs)
    h.save()
    url = f"http://127.0.0.1:{PORT}"
    vocab = int(S["config"].get("vocab_size") or 32000)
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(CONFIG.read_text())
    log = h.logs / "server.log"
    pidf = work / "server.pid"
    argv = [py, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "dummy",
            "--skip-tokenizer-init", "--kv-cache-dtype", "auto", "--attention-backend", "flashinfer",
            "--mem-fraction-static", a.mem_fraction, "--max-total-tokens", "500000",
            "--cuda-graph-bs", "1", "2", "4", "8", "16", "32", "64", "--max-running-requests", "64",
            "--chunked-prefill-size", "4096", "--host", "127.0.0.1", "--port", str(PORT), "--random-seed", "0",
            # decode is what is measured: no piecewise graphs for prefill (26 s a start on the H200) and
            # prefill on the paged MLA kernel (FlashInfer's ragged module is an 87 s build)
            "--disable-piecewise-cuda-graph", "--flashinfer-mla-disable-ragged"]
    srv = restart_script(work / "srv.sh", argv, env, pidf, log)
    S["server_argv"] = argv

    def perfscope(name: str, args: list, timeout: float = 120):
        return h.run(name, [py, "-m", "perfscope", *args], timeout=timeout, env=env)

    def bench(name: str, conc: int, n: int) -> dict:
        rc, so, se = perfscope(name, ["bench", "--url", url, "--input-len", W["input_len"], "--output-len",
                                      W["output_len"], "--num-requests", n, "--concurrency", conc, "--warmup", 2,
                                      "--json"], timeout=150)
        b = _json(so, None) or {"rc": rc, "stderr": se[-600:]}
        r = {k: b.get(k) for k in ("tpot_ms", "itl_p50_ms", "ttft_ms", "requests", "failed", "throughput_tok_s",
                                   "rc", "stderr") if k in b}
        r["tpot_per_request"] = [round(q["tpot_ms"], 4) for q in b.get("per_request") or [] if q.get("tpot_ms")]
        return r | {"concurrency": conc}

    def wait_healthy(budget: float) -> bool:
        end = time.monotonic() + budget
        while time.monotonic() < end and h.left() > 20:
            if healthy(PORT):
                return True
            time.sleep(0.5)
        return False

    def measure(phase: str) -> None:
        R = S.setdefault(phase, {})
        for conc, n in CONCURRENCY:
            if h.left() > 60:
                R[f"bench_c{conc}"] = bench(f"bench-{phase}-c{conc}", conc, n)
        try:
            R["outputs"] = outputs(PORT, vocab)
        except Exception as e:  # noqa: BLE001 - recorded
            R["outputs_error"] = f"{type(e).__name__}: {e}"
        h.save()

    fix = [py, "-m", "perfscope", "fix", "untuned-fused-moe", "--sglang-root", str(sglang_root), "--python", py,
           "--url", url, "--state-dir", str(work / "state"), "--json"]
    run = work / "run-c16"
    try:
        warm = subprocess.Popen([py, str(HERE / "warm_flashinfer.py"), str(CONFIG), "--no-ragged"], env=env,
                                stdout=open(h.logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        try:
            warm.wait(max(5, min(120, h.left() - 400)))
        except subprocess.TimeoutExpired:
            pass
        subprocess.run(["sh", str(srv)], check=True)
        if not wait_healthy(min(300, h.left() - 60)):
            raise RuntimeError("the server did not answer /health")
        S["healthy_s"] = h.now()
        S["default_config_line"] = [ln.strip()[-400:] for ln in log.read_text(errors="replace").splitlines()
                                    if "MoE kernel config" in ln or "Config file not found" in ln][:4]
        measure("before")
        rc, so, se = perfscope("trace-c16", ["trace", "--url", url, "--steps", 8, "--input-len", W["input_len"],
                                             "--output-len", W["output_len"], "--concurrency", 16, "--out", run,
                                             "--timeout", 90, "--bench", 16, "--json"], timeout=240)
        S["trace_rc"] = rc
        rc, so, se = perfscope("diagnose", ["diagnose", run, "--server-log", log, "--json"], timeout=180)
        d = _json(so, {}) or {}
        S["diagnose_rc"] = rc
        S["finding"] = next((f for f in d.get("findings") or [] if f.get("id") == "untuned-fused-moe"), None)
        S["diagnose_keys"] = sorted(d)  # the whole report is logs/diagnose.out
        h.save()
        rc, so, se = h.run("fix-check", fix + ["--trace", str(run)], timeout=180, env=env)
        S["check"] = _json(so, {"rc": rc, "stderr": se[-1500:]})
        rc, so, se = h.run("fix-apply-restart", fix + [
            "--trace", str(run), "--apply", "--restart-cmd", f"sh {srv}", "--health-timeout", "300",
            "--budget", str(a.budget), "--bench-concurrency", "16", "--bench-input-len", str(W["input_len"]),
            "--bench-output-len", str(W["output_len"]), "--bench-requests", "16", "--bench-max-requests", "64",
            "--out", str(work / "fixrun")], timeout=a.budget + 420, env=env)
        S["fix"] = _json(so, {"rc": rc, "stderr": se[-1500:]})
        S["fix_rc"] = rc
        S["configs_after_fix"] = {k: v for k, v in tree_digest(configs).items() if before_tree.get(k) != v}
        h.save()
        if wait_healthy(min(200, h.left() - 40)):
            measure("after")
            if S.get("before", {}).get("outputs") and S["after"].get("outputs"):
                S["outputs_compared"] = same_outputs(S["before"]["outputs"], S["after"]["outputs"])
    except Exception as e:  # noqa: BLE001 - recorded, then the install is reverted and everything packed
        S["error"] = f"{type(e).__name__}: {e}"[-2000:]
        h.log(f"FAILED: {S['error'][:800]}")
    finally:
        if pidf.is_file():
            subprocess.run(["sh", "-c", f"kill -TERM -{pidf.read_text().strip()} 2>/dev/null; sleep 2; "
                                        f"kill -KILL -{pidf.read_text().strip()} 2>/dev/null"])
        if tree_digest(configs) != before_tree:
            rc, so, se = h.run("fix-revert", fix + ["--revert"], timeout=60, env=env, margin=0)
            S["revert"] = _json(so, {"rc": rc, "stderr": se[-400:]})
        S["reverted_byte_identical"] = tree_digest(configs) == before_tree
        S["total_s"] = h.now()
        h.save()
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tf:
            tf.add(h.logs, arcname="logs")
            tf.add(srv, arcname=srv.name)
            for d in (work / "fixrun", run):
                if d.is_dir():
                    for f in d.rglob("*.json"):
                        tf.add(f, arcname=str(f.relative_to(work)))
    return 0 if not S.get("error") else 1


if __name__ == "__main__":
    raise SystemExit(main())
