"""One device call that measures the pages patch on real SGLang (h15b, 2026-12-01): install the carried
set, write the same seeded checkpoint, ``perfscope fix fp8-kv-cast --strategy pages --apply`` (no
restart: no server runs yet), start the patched server (the 495k run's flags), and beside it a control
server from the same patched file with ``PERFSCOPE_FP8_KV_CAST=off`` (the snippet's switch back to the
whole-pool cast) on another port; probe both (the logprob probe of sglang_real.py), bench the control,
stop it, bench + trace + diagnose the patched server, stop it, ``--revert`` and a sha256 check.
Everything lands in OUT as it goes (summary.json rewritten after each step).

    python3 examples/gpu_loop/sglang/patched_run.py --payload P/site.tar.xz --out $OUT --deadline 300
    python3 examples/gpu_loop/sglang/patched_run.py ... --no-server     # CPU dry run: install, patch, revert
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

T0 = time.monotonic()
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
from gpuloop.sglang_real import probe, probe_diff  # noqa: E402
from harness import ORIG_SHA, TARGET_REL, Harness, install, stop_group  # noqa: E402,F401

CONFIG = HERE / "config.json"


def now() -> float:
    return round(time.monotonic() - T0, 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/w")
    ap.add_argument("--site", default="/tmp/site")
    ap.add_argument("--deadline", type=float, default=300)
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--no-control", action="store_true")
    a = ap.parse_args()
    out, work, site = Path(a.out), Path(a.work), Path(a.site)
    S: dict = {"steps": []}
    py = sys.executable
    h = Harness(out, work, a.deadline, T0, S, steps=True)
    logs, save, left, log, run = h.logs, h.save, h.left, h.log, h.run

    def js(s, default=None):
        try:
            return json.loads(s)
        except Exception:  # noqa: BLE001
            return default

    # ---------------------------------------------------------------- install
    env = dict(os.environ)
    target, original, S["install"] = install(a.payload, site, env, REPO, a.no_server)
    log(f"installed in {S['install']['s']}s, target original: {S['install']['target_is_recorded_original']}")
    save()

    procs: dict[str, subprocess.Popen] = {}
    try:
        if not a.no_server:
            procs["warm"] = subprocess.Popen([py, str(HERE / "warm_flashinfer.py"), str(CONFIG)], env=env,
                                             stdout=open(logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        # ------------------------------------------------------------ checkpoint (same generator, seed 0)
        model = work / "model"
        rc, so, _ = run("make-checkpoint", [py, HERE / "make_checkpoint.py", CONFIG, model, "--seed", "0"],
                        timeout=300, env=env)
        S["checkpoint"] = js(so.strip().splitlines()[-1] if so.strip() else "", {"rc": rc})
        # ------------------------------------------------------------ the patch, before any server starts
        fix = [py, "-m", "perfscope", "fix", "fp8-kv-cast", "--strategy", "pages", "--sglang-root", site / "sglang",
               "--python", py, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
               "--state-dir", work / "state", "--port", "30123", "--json"]
        rc, so, se = run("fix-pages-apply", fix + ["--apply"], env=env)
        rep = js(so, {}) or {}
        S["apply"] = {"rc": rc, "outcome": rep.get("outcome"), "reason": rep.get("reason"),
                      "strategy": rep.get("strategy"), "variant": rep.get("variant"),
                      "sha256_before": rep.get("sha256_before"), "sha256_after": rep.get("sha256_after"),
                      "file_sha256_now": hashlib.sha256(target.read_bytes()).hexdigest(),
                      "environment": rep.get("environment"), "stderr": se[-800:]}
        shutil.copy(target, work / "patched-flashinfer_mla_backend.py")
        save()
        if rc != 0:
            raise RuntimeError(f"fix --apply rc {rc}: {se[-500:]}")
        if a.no_server:
            return 0

        # ------------------------------------------------------------ servers
        def argv(port):
            return [py, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "safetensors",
                    "--skip-tokenizer-init", "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
                    "--mem-fraction-static", "0.5", "--cuda-graph-bs", "1", "2", "4", "8",
                    "--chunked-prefill-size", "2048", "--host", "127.0.0.1", "--port", str(port), "--random-seed", "0",
                    "--max-total-tokens", "495000"]

        def start(tag, port, extra_env):
            e = dict(env, **extra_env)
            procs[tag] = subprocess.Popen(argv(port), env=e, stdout=open(logs / f"server-{tag}.log", "wb"),
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            S.setdefault("servers", {})[tag] = {"argv": argv(port), "env": extra_env, "started_at_s": now()}

        def healthy(port):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        def stop(tag):
            p = procs.pop(tag, None)
            if p is None:
                return
            stop_group(p)
            S["servers"][tag]["stopped_at_s"] = now()

        def info(port):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as r:
                i = json.loads(r.read())
            return {k: i.get(k) for k in ("version", "max_total_num_tokens", "kv_cache_dtype", "attention_backend",
                                          "page_size", "cuda_graph_max_bs", "disable_cuda_graph", "mem_fraction_static",
                                          "chunked_prefill_size")}

        start("pages", 30123, {})
        if not a.no_control:
            start("control", 30124, {"PERFSCOPE_FP8_KV_CAST": "off"})
        save()

        def wait(tag, port, until):
            while left() > 0 and time.monotonic() < until:
                if procs[tag].poll() is not None:
                    S["servers"][tag]["exited"] = procs[tag].returncode
                    return False
                if healthy(port):
                    S["servers"][tag]["healthy_at_s"] = now()
                    S["servers"][tag]["server_info"] = info(port)
                    log(f"server {tag} healthy")
                    save()
                    return True
                time.sleep(0.5)
            return False

        if not wait("pages", 30123, time.monotonic() + left() - 40):
            raise RuntimeError(f"patched server not healthy: {(logs / 'server-pages.log').read_text()[-2000:]}")
        vocab = json.loads(CONFIG.read_text())["vocab_size"]
        url = "http://127.0.0.1:30123"
        S["probe_pages"] = probe(url, vocab)
        log("probe pages done")
        rec = json.loads((HERE.parent / "results/h200-2026-12-01-sglang/pool495000/summary.json").read_text())
        S["pages_vs_recorded_unpatched"] = probe_diff(rec["probe_unpatched"], S["probe_pages"])
        log(f"pages vs recorded unpatched: identical={S['pages_vs_recorded_unpatched']['identical']}")
        save()
        # control: same call, whole-pool cast (switch off), probed and benched, then stopped
        if "control" in procs:
            if wait("control", 30124, time.monotonic() + min(40, left() - 100)):
                S["probe_control"] = probe("http://127.0.0.1:30124", vocab)
                S["control_vs_recorded_unpatched"] = probe_diff(rec["probe_unpatched"], S["probe_control"])
                S["pages_vs_control"] = probe_diff(S["probe_control"], S["probe_pages"])
                log(f"pages vs control: identical={S['pages_vs_control']['identical']}")
                save()
                rc, so, se = run("bench-control", [py, "-m", "perfscope", "bench", "--url", "http://127.0.0.1:30124",
                                                   "--input-len", "2000", "--output-len", "64", "--num-requests", "3",
                                                   "--warmup", "1", "--json"], timeout=90, env=env)
                S["bench_control"] = js(so, {"rc": rc, "stderr": se[-800:]})
            stop("control")
            save()
        runp = work / "runs" / "495000-pages"
        rc, so, se = run("bench-pages", [py, "-m", "perfscope", "bench", "--url", url, "--input-len", "2000",
                                         "--output-len", "64", "--num-requests", "3", "--warmup", "1", "--json"],
                         timeout=90, env=env)
        S["bench_pages"] = js(so, {"rc": rc, "stderr": se[-800:]})
        save()
        if left() > 45:
            rc, so, se = run("trace-pages", [py, "-m", "perfscope", "trace", "--url", url, "--steps", "10",
                                             "--input-len", "2000", "--output-len", "64", "--out", runp,
                                             "--timeout", "60", "--json"], timeout=90, env=env)
            S["trace_pages"] = js(so, {"rc": rc, "stderr": se[-800:]})
            if runp.is_dir():
                (runp / "bench.json").write_text(json.dumps(S["bench_pages"], indent=1))
                rc, so, se = run("diagnose-pages", [py, "-m", "perfscope", "diagnose", runp, "--json", "--model-config",
                                                    CONFIG, "--batch", "1", "--context", "2032"], timeout=60, env=env)
                (work / "diagnose-pages.json").write_text(so)
                d = js(so, None)
                if d is not None:
                    S["diagnose_pages"] = {k: d.get(k) for k in ("steps", "floor", "summary") if k in d}
                    S["diagnose_pages"]["findings"] = [{k: f.get(k) for k in ("id", "title", "severity",
                                                                               "predicted_step_ms_after_fix")}
                                                       for f in d.get("findings") or []]
                else:
                    S["diagnose_pages_error"] = se[-1500:]
            save()
    except Exception as e:  # noqa: BLE001 - recorded
        S["error"] = f"{type(e).__name__}: {e}"[-3000:]
        log(f"FAILED: {S['error'][:1500]}")
    finally:
        for tag in list(procs):
            if tag == "warm":
                procs.pop(tag).kill()
            else:
                stop(tag)
        if target.read_bytes() != original:
            rc, so, se = run("fix-pages-revert", fix + ["--revert"], timeout=60, env=env)
            rep = js(so, {}) or {}
            S["revert"] = {"rc": rc, "outcome": rep.get("outcome"), "reason": rep.get("reason"), "stderr": se[-500:]}
        S["reverted_byte_identical"] = target.read_bytes() == original
        S["reverted_sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
        log(f"reverted byte-identical: {S['reverted_byte_identical']}")
        save()
        try:
            with tarfile.open(out / "logs.tar.gz", "w:gz") as tf:
                tf.add(logs, arcname="logs")
                for f in sorted(work.glob("*.json")) + sorted(work.glob("*.py")):
                    tf.add(f, arcname=f.name)
            if (work / "runs").is_dir():
                with tarfile.open(out / "runs.tar", "w") as tf:
                    tf.add(work / "runs", arcname="runs")
        except Exception as e:  # noqa: BLE001
            S["pack_error"] = repr(e)
        S["total_s"] = now()
        save()
    return 0 if not S.get("error") else 1


if __name__ == "__main__":
    raise SystemExit(main())
