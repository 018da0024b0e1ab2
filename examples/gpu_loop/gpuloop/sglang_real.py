"""The real-SGLang mode of the GPU loop (``run_loop.py --engine sglang``): an unmodified SGLang
installed from a carried archive, serving a random DeepSeek-V2-shaped MLA checkpoint with an FP8 KV
pool, FlashInfer MLA and CUDA graphs; perfscope's whole loop against it, for each pool size:

    start -> logprob probe -> perfscope bench, trace, diagnose -> perfscope fix --strategy native
    (check only) -> perfscope fix --strategy pages --apply --restart-cmd -> logprob probe -> trace,
    bench, diagnose, compare -> [a deliberately wrong copy of the patch: probe must differ] ->
    perfscope fix --revert (sha256 of the file = the original's)

The archive (``--payload``) is a tar.xz of the unpacked wheels (SGLang 0.5.13.post1, FlashInfer
0.6.12, sglang-kernel 0.4.3 without FA3/SM100/mscclpp, their pure-Python needs, paramiko for
perfscope) made on a CPU machine: see examples/gpu_loop/README.md."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from gpuloop.base import REPO, _get_json, _json_or, _sha, now_s

HERE = Path(__file__).resolve().parents[1] / "sglang"
CONFIG = HERE / "config.json"
SITE = Path("/tmp/site")
TARGET_REL = "srt/layers/attention/flashinfer_mla_backend.py"
# the line of the pages patch that loads the row index of each converted row (fixes/fp8_kv_cast/snippet.py);
# the sabotaged copy converts the NEXT row instead, so the kernel reads rows that were not converted
ROW_LINE = "row = tl.load(idx + r, mask=rm, other=0).to(tl.int64)"
ROW_SHIFTED = "row = tl.load(idx + r, mask=rm, other=0).to(tl.int64) + 1  # perfscope h15: deliberately wrong rows"

# probe prompts: batch 1 one after another, then batch 8 in one request (one decode batch of 8)
PROBE_BS1 = (64, 1000, 4000)  # 4000 > --chunked-prefill-size 2048: the second chunk reads paged KV
PROBE_BS8 = (100, 300, 500, 700, 900, 1200, 1500, 1800)
PROBE_NEW = 16


def _post(url: str, body: dict, timeout: float = 300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab - 10) for _ in range(n)]


def probe(url: str, vocab: int) -> dict:
    """Greedy generation with per-token logprobs (output tokens, their top-5, and the prompt's last
    32 tokens) of fixed prompts: batch 1 at three context lengths, then 8 prompts of 8 lengths in
    one request."""
    rng = random.Random(20261201)
    sp = {"max_new_tokens": PROBE_NEW, "temperature": 0.0, "ignore_eos": True}

    def rec(j: dict) -> dict:
        m = j.get("meta_info") or {}
        return {"ids": j.get("output_ids"),
                "lp": [x[0] for x in m.get("output_token_logprobs") or []],
                "top": [[[t[0], t[1]] for t in step] for step in m.get("output_top_logprobs") or []],
                "in_lp": [x[0] for x in m.get("input_token_logprobs") or [] if x[0] is not None]}

    out: dict = {"bs1": [], "bs8": []}
    for n in PROBE_BS1:
        ids = _ids(rng, n, vocab)
        j = _post(url + "/generate", {"input_ids": ids, "sampling_params": sp, "return_logprob": True,
                                      "top_logprobs_num": 5, "logprob_start_len": n - 32})
        out["bs1"].append({"len": n, **rec(j)})
    batch = [_ids(rng, n, vocab) for n in PROBE_BS8]
    js = _post(url + "/generate", {"input_ids": batch, "sampling_params": sp, "return_logprob": True,
                                   "top_logprobs_num": 5, "logprob_start_len": [n - 32 for n in PROBE_BS8]})
    out["bs8"] = [{"len": n, **rec(j)} for n, j in zip(PROBE_BS8, js)]
    return out


def probe_diff(a: dict, b: dict) -> dict:
    """Exact comparison of two probes: ids, logprobs, top-5 and prompt logprobs must be identical."""
    res: dict = {}
    allv: list[float] = []
    for part in ("bs1", "bs8"):
        ra, rb = a.get(part) or [], b.get(part) or []
        d = {"requests": len(ra), "ids_equal": True, "logprobs_identical": True, "max_abs_diff": 0.0,
             "tokens_differing": 0, "first_differing_token": None}
        for x, y in zip(ra, rb):
            if x["ids"] != y["ids"]:
                d["ids_equal"] = False
            for key in ("lp", "in_lp"):
                for i, (u, v) in enumerate(zip(x[key], y[key])):
                    if u != v:
                        d["logprobs_identical"] = False
                        d["max_abs_diff"] = max(d["max_abs_diff"], abs(u - v))
                        if key == "lp":
                            d["tokens_differing"] += 1
                            if d["first_differing_token"] is None:
                                d["first_differing_token"] = {"len": x["len"], "token": i}
                if len(x[key]) != len(y[key]):
                    d["logprobs_identical"] = False
            if x["top"] != y["top"]:
                d["logprobs_identical"] = False
            allv += x["lp"]
        if len(ra) != len(rb) or not ra:
            d["ids_equal"] = d["logprobs_identical"] = False
        res[part] = d
    res["identical"] = all(res[p]["ids_equal"] and res[p]["logprobs_identical"] for p in ("bs1", "bs8"))
    if allv:  # how far from uniform the model is (dummy weights: every value ~ -ln(vocab))
        res["output_logprob_min"], res["output_logprob_max"] = min(allv), max(allv)
        res["distinct_output_logprobs"] = len(set(allv))
    return res


def shifted_copy(patched: str) -> str:
    """The pages-patched file with the conversion kernel's row index shifted by one (the control
    that must fail the outputs check); refuses a file without exactly one row line."""
    if patched.count(ROW_LINE) != 1:
        raise ValueError(f"expected one {ROW_LINE!r} in the patched file, found {patched.count(ROW_LINE)}")
    return patched.replace(ROW_LINE, ROW_SHIFTED)


class SglangMixin:
    # ------------------------------------------------------------------ install
    def sg_install(self) -> None:
        a = self.a
        pay = Path(a.payload)
        if not pay.is_file():
            raise RuntimeError(f"--payload {pay}: no such file (see README: the archive of unpacked wheels)")
        h = hashlib.sha256(pay.read_bytes()).hexdigest()[:16]
        stamp = SITE / ".payload-sha"
        t = time.monotonic()
        if stamp.is_file() and stamp.read_text() == h:
            how = "already unpacked (warm machine)"
        else:
            shutil.rmtree(SITE, ignore_errors=True)
            SITE.mkdir(parents=True)
            with tarfile.open(pay) as tf:
                tf.extractall(SITE, filter="tar")
            # files put back after the archive was made (payload/site-extra.tar beside it), if any
            extra = pay.parent / "site-extra.tar"
            if extra.is_file():
                with tarfile.open(extra) as tf:
                    tf.extractall(SITE, filter="tar")
            stamp.write_text(h)
            how = "unpacked"
        env = os.environ
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(REPO)])
        env.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
        env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        lib = SITE / "_h15lib"
        r = subprocess.run(["sh", "-c", "ldconfig -p | grep -q 'libnuma.so.1 '"])
        if r.returncode != 0 and lib.is_dir():
            env["LD_LIBRARY_PATH"] = os.pathsep.join([str(lib), env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
        info = {"payload_sha256_16": h, "install": how, "install_s": round(time.monotonic() - t, 1),
                "libnuma": "system" if r.returncode == 0 else "carried"}
        code = ("import json,torch,sglang,flashinfer,sgl_kernel,transformers,triton\n"
                "print(json.dumps({'torch':torch.__version__,'cuda':torch.version.cuda,'gpu':torch.cuda.get_device_name(),"
                "'sglang':sglang.__version__,'flashinfer':flashinfer.__version__,'sgl_kernel':sgl_kernel.__version__,"
                "'transformers':transformers.__version__,'triton':triton.__version__}))")
        r = self.sh("sg-versions", [self.py, "-c", code], timeout=180)
        info.update(_json_or(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "", {"error": r.stderr[-800:]}))
        r = self.sh("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                    timeout=30)
        info["nvidia_smi"] = r.stdout.strip()
        self.summary["env"] = info
        if "sglang" not in info:
            raise RuntimeError(f"the installed SGLang does not import: {info.get('error')}")
        self.target = SITE / "sglang" / TARGET_REL
        self.original = self.target.read_bytes()
        self.summary["target"] = {"path": str(self.target), "sha256": _sha(self.target)}

    # ------------------------------------------------------------------ checkpoint (+ FlashInfer JIT meanwhile)
    def sg_checkpoint(self) -> None:
        warm = subprocess.Popen([self.py, str(HERE / "warm_flashinfer.py"), str(CONFIG)],
                                stdout=open(self.logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        self.model = self.work / "model"
        r = self.sh("make-checkpoint", [self.py, str(HERE / "make_checkpoint.py"), str(CONFIG), str(self.model)],
                    timeout=300, check=True)
        self.summary["checkpoint"] = _json_or(r.stdout, {})
        try:
            warm.wait(max(5, min(200, self.left() - 60)))
        except subprocess.TimeoutExpired:
            pass  # still building: the server waits on FlashInfer's lock
        self.summary["flashinfer_warmup"] = (self.logs / "warm_flashinfer.log").read_text()[-600:]

    # ------------------------------------------------------------------ server
    def sg_script(self, tag: str, pool: int | None, argv: list[str] | None = None) -> Path:
        """A start/restart script (the --restart-cmd): stops the server it started last (its whole
        process group), starts SGLang in a new session on the same port, returns at once."""
        a = self.a
        override = argv
        argv = [self.py, "-m", "sglang.launch_server", "--model-path", str(self.model), "--load-format", "safetensors",
                "--skip-tokenizer-init", "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
                "--mem-fraction-static", str(a.mem_fraction), "--cuda-graph-bs", "1", "2", "4", "8",
                "--chunked-prefill-size", "2048", "--host", "127.0.0.1", "--port", str(a.port), "--random-seed", "0"]
        if pool:
            argv += ["--max-total-tokens", str(pool)]
        argv = argv if override is None else override  # tests: another server behind the same script
        pidf = self.work / "server.pid"
        log = self.logs / f"server-{tag}.log"
        envs = " ".join(f"{k}={_q(os.environ[k])}" for k in ("PYTHONPATH", "LD_LIBRARY_PATH", "FLASHINFER_CUDA_ARCH_LIST",
                                                           "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                           "FLASHINFER_WORKSPACE_BASE") if os.environ.get(k))
        s = f"""#!/bin/sh
# perfscope gpu_loop: (re)start SGLang ({tag}); returns once the new server is starting
# (no `kill --`: dash, the /bin/sh of Debian and Ubuntu, reads `-- -PID` as "Illegal number: -")
p=$(cat {_q(str(pidf))} 2>/dev/null)
if [ -n "$p" ]; then
  kill -TERM -"$p" 2>/dev/null
  i=0; while kill -0 -"$p" 2>/dev/null && [ $i -lt 60 ]; do sleep 0.5; i=$((i+1)); done
  kill -KILL -"$p" 2>/dev/null; sleep 1
  if kill -0 -"$p" 2>/dev/null; then echo "the old server (process group $p) is still running" >&2; exit 1; fi
fi
echo "===== $(date -u +%FT%TZ) start" >> {_q(str(log))}
env {envs} setsid {" ".join(_q(x) for x in argv)} >> {_q(str(log))} 2>&1 < /dev/null &
echo $! > {_q(str(pidf))}
"""
        f = self.work / f"srv-{tag}.sh"
        f.write_text(s)
        self.summary.setdefault("servers", {})[tag] = {"argv": argv, "script": str(f)}
        return f

    def sg_url(self) -> str:
        return f"http://127.0.0.1:{self.a.port}"

    def sg_wait(self, tag: str, timeout: float, log: Path | None = None) -> float:
        t = time.monotonic()
        log = log or self.logs / f"server-{tag}.log"

        def tail() -> str:
            return log.read_text(errors="replace")[-2500:] if log.is_file() else f"(no {log.name})"

        end = t + min(timeout, self.left() - 10)
        pidf = self.work / "server.pid"
        while time.monotonic() < end:
            pid = pidf.read_text().strip() if pidf.is_file() else ""
            if pid and subprocess.run(["kill", "-0", pid], capture_output=True).returncode != 0:
                raise RuntimeError(f"SGLang {tag} exited before it was healthy: {tail()}")
            try:
                with urllib.request.urlopen(self.sg_url() + "/health", timeout=2) as r:
                    if r.status == 200:
                        return round(time.monotonic() - t, 1)
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"SGLang {tag} not healthy in {timeout:.0f}s: {tail()}")

    def sg_start(self, tag: str, script: Path, log_tag: str | None = None) -> dict:
        """Run the (re)start script, wait for /health; ``log_tag``: the script's own tag (its log)."""
        t = time.monotonic()
        self.summary.setdefault("servers", {}).setdefault(tag, {"script": str(script)})
        self.sh(f"start-{tag}", ["sh", str(script)], timeout=60, check=True)
        up = self.sg_wait(tag, self.a.server_timeout, self.logs / f"server-{log_tag or tag}.log")
        info = _get_json(self.sg_url() + "/server_info")
        keep = {k: info.get(k) for k in ("version", "max_total_num_tokens", "kv_cache_dtype", "attention_backend",
                                         "page_size", "cuda_graph_max_bs", "disable_cuda_graph", "mem_fraction_static",
                                         "chunked_prefill_size", "max_running_requests")}
        rec = {"healthy_after_s": up, "started_s": round(time.monotonic() - t, 1), "server_info": keep}
        self.summary["servers"][tag].update(rec)
        print(f"[{now_s():6.1f}s] SGLang {tag} up in {up}s, pool {keep.get('max_total_num_tokens')}", flush=True)
        return rec

    def sg_stop(self) -> None:
        pidf = self.work / "server.pid"
        if pidf.is_file():
            subprocess.run(["sh", "-c", f'p=$(cat {_q(str(pidf))}); kill -TERM -"$p" 2>/dev/null; sleep 3; '
                                        f'kill -KILL -"$p" 2>/dev/null; true'])
            pidf.unlink()

    # ------------------------------------------------------------------ perfscope against it
    def sg_fix_args(self, strategy: str) -> list[str]:
        return ["fix", "fp8-kv-cast", "--strategy", strategy, "--url", self.sg_url(), "--port", str(self.a.port),
                "--sglang-root", str(SITE / "sglang"), "--python", self.py, "--state-dir", str(self.work / "state"),
                "--json"]

    def sg_measure(self, tag: str, ctx: int, out_len: int, requests: int) -> dict:
        """perfscope trace + bench + diagnose into runs/<tag>."""
        a = self.a
        run = self.runs / tag
        shutil.rmtree(run, ignore_errors=True)
        rec: dict = {}
        bench = ["bench", "--url", self.sg_url(), "--input-len", str(ctx), "--output-len", str(out_len),
                 "--num-requests", str(requests), "--warmup", "1", "--json"]
        # bench first (no profiler has run in this server process yet), trace, then bench again: a
        # second TPOT after /start_profile + /stop_profile shows whether the profiler left a cost
        pre = self.work / f"bench-{tag}"  # bench --out writes bench.json as compare reads it
        shutil.rmtree(pre, ignore_errors=True)
        r = self.perfscope(f"bench-{tag}", *bench, "--out", str(pre), timeout=300)
        rec["bench"] = _json_or(r.stdout, {"rc": r.returncode, "stderr": r.stderr[-1500:]})
        r = self.perfscope(f"trace-{tag}", "trace", "--url", self.sg_url(), "--steps", str(a.trace_steps),
                           "--input-len", str(ctx), "--output-len", str(out_len), "--out", str(run),
                           "--timeout", "240", "--json", timeout=300)
        rec["trace"] = _json_or(r.stdout, {"rc": r.returncode, "stderr": r.stderr[-1500:]})
        if run.is_dir() and (pre / "bench.json").is_file():  # the bench before the trace, as bench --out adds it
            if str(REPO) not in sys.path:  # perfscope is on the subprocesses' PYTHONPATH, not yet on ours
                sys.path.insert(0, str(REPO))
            from perfscope import rundir

            b = json.loads((pre / "bench.json").read_text())
            shutil.copy(pre / "bench.json", run / "bench.json")
            rundir.update_run(run, timings={"bench": {k: v for k, v in b.items()
                                                      if k not in ("workload", "server", "errors", "per_request")}})
        r = self.perfscope(f"bench-after-trace-{tag}", *bench, timeout=300)
        rec["bench_after_trace"] = _json_or(r.stdout, {"rc": r.returncode, "stderr": r.stderr[-1500:]})
        if run.is_dir():
            r = self.perfscope(f"diagnose-{tag}", "diagnose", str(run), "--json", "--model-config", str(CONFIG),
                               "--batch", "1", "--context", str(ctx + out_len // 2), timeout=240)
            d = _json_or(r.stdout, None)
            if d is None:
                rec["diagnose_error"] = r.stderr[-1500:]
            else:
                (self.work / f"diagnose-{tag}.json").write_text(json.dumps(d, indent=1))
                from gpuloop.diagnose import _brief_diag

                rec["diagnosis"] = _brief_diag(d)
        return rec

    def sg_pool(self, name: str, pool: int | None, *, shifted: bool) -> None:
        a = self.a
        P = self.summary.setdefault("pools", {}).setdefault(name, {"max_total_tokens_flag": pool})
        ctx, out_len, nreq = (a.input_len, a.bench_output_len, a.bench_requests) if pool else \
            (a.input_len, a.default_pool_output_len, a.default_pool_requests)
        vocab = json.loads(CONFIG.read_text())["vocab_size"]
        script = self.sg_script(f"{name}", pool)
        try:
            P["bug_server"] = self.sg_start(name, script)
            self.save()
            P["probe_bug"] = probe(self.sg_url(), vocab)
            P["bug"] = self.sg_measure(f"{name}-bug", ctx, out_len, nreq)
            self.save()
            if self.left() < a.min_fix_s:
                P["fix_skipped"] = f"deadline ({self.left():.0f}s left): bug server traced and benched only"
                return
            # native: FlashInfer 0.6.12 does not read FP8 MLA KV; the check says why (nothing written)
            r = self.perfscope(f"fix-native-check-{name}", *self.sg_fix_args("native"), timeout=180)
            P["native_check"] = {"rc": r.returncode, "report": _json_or(r.stdout, None), "stderr": r.stderr[-800:]}
            before = _sha(self.target)
            fixrun = self.runs / f"{name}-fixrun"
            shutil.rmtree(fixrun, ignore_errors=True)
            r = self.perfscope(f"fix-pages-apply-{name}", *self.sg_fix_args("pages"), "--apply",
                               "--restart-cmd", f"sh {script}", "--health-timeout", str(a.server_timeout),
                               "--out", str(fixrun), "--bench-input-len", str(ctx), "--bench-output-len", str(out_len),
                               "--bench-requests", str(nreq), timeout=a.server_timeout + 400)
            P["apply"] = {"rc": r.returncode, "report": _json_or(r.stdout, None), "stderr": r.stderr[-1500:],
                          "sha256_before": before, "sha256_after": _sha(self.target)}
            self.save()
            if r.returncode != 0:
                raise RuntimeError(f"fix --apply --restart-cmd failed rc {r.returncode}: {r.stderr[-800:]}")
            patched = self.target.read_bytes()
            shutil.copy(self.target, self.work / f"patched-{name}-flashinfer_mla_backend.py")
            P["probe_pages"] = probe(self.sg_url(), vocab)
            P["pages"] = self.sg_measure(f"{name}-pages", ctx, out_len, nreq)
            P["outputs_pages_vs_bug"] = probe_diff(P["probe_bug"], P["probe_pages"])
            self.save()
            if shifted and self.left() < a.min_shifted_s:
                P["shifted_skipped"] = f"deadline ({self.left():.0f}s left < {a.min_shifted_s:.0f}s)"
            elif shifted:
                text = patched.decode()
                if text.count(ROW_LINE) != 1:
                    raise RuntimeError("the pages patch's row line is not in the patched file: cannot sabotage it")
                self.target.write_text(shifted_copy(text))
                P["shifted_sha256"] = _sha(self.target)
                try:
                    P["shifted_server"] = self.sg_start(f"{name}-shifted", script, log_tag=name)
                    P["probe_shifted"] = probe(self.sg_url(), vocab)
                    P["outputs_shifted_vs_bug"] = probe_diff(P["probe_bug"], P["probe_shifted"])
                    P["outputs_shifted_vs_pages"] = probe_diff(P["probe_pages"], P["probe_shifted"])
                finally:
                    self.target.write_bytes(patched)
                    P["patched_bytes_restored"] = _sha(self.target) == hashlib.sha256(patched).hexdigest()
        finally:
            self.sg_stop()
            if self.target.read_bytes() != self.original:
                r = self.perfscope(f"fix-revert-{name}", *self.sg_fix_args("pages"), "--revert", timeout=120)
                P["revert"] = {"rc": r.returncode, "report": _json_or(r.stdout, None), "stderr": r.stderr[-800:]}
            P["reverted_byte_identical"] = self.target.read_bytes() == self.original
            if not P["reverted_byte_identical"]:  # never leave the installed SGLang patched
                self.target.write_bytes(self.original)
            self.save()

    def sg_compare(self) -> None:
        for name in (self.summary.get("pools") or {}):
            b, p = self.runs / f"{name}-bug", self.runs / f"{name}-pages"
            if b.is_dir() and p.is_dir():
                r = self.perfscope(f"compare-{name}", "compare", str(b), str(p), "--json", timeout=240)
                self.summary["pools"][name]["compare"] = _brief(_json_or(r.stdout, {"rc": r.returncode,
                                                                                   "stderr": r.stderr[-800:]}))

    def sg_loop(self) -> None:
        a = self.a
        for name in a.pools:
            pool = None if name == "default" else int(name)
            if self.left() < 100:
                self.summary.setdefault("pools", {})[name] = {"skipped": f"deadline ({self.left():.0f}s left)"}
                continue
            try:
                self.sg_pool(name, pool, shifted=name in a.shifted_pools)
            except Exception as e:  # noqa: BLE001 - recorded; the next pool still runs
                self.summary["pools"].setdefault(name, {})["error"] = f"{type(e).__name__}: {e}"[-3000:]
                print(f"[{now_s():6.1f}s] pool {name} FAILED: {e}"[:2000], flush=True)
            self.save()
        self.sg_compare()

    # ------------------------------------------------------------------ table
    def sg_table(self) -> None:
        rows = []
        for name, P in (self.summary.get("pools") or {}).items():
            bug = (P.get("bug") or {})
            bd = bug.get("diagnosis") or {}
            f = next((x for x in bd.get("findings") or [] if x.get("id") == "fp8-kv-cast"), None)
            ev = {}
            dj = self.work / f"diagnose-{name}-bug.json"
            if dj.is_file():
                full = json.loads(dj.read_text())
                ev = next((x.get("evidence") or {} for x in full.get("findings", []) if x.get("id") == "fp8-kv-cast"), {})
            pg = P.get("pages") or {}
            pd = pg.get("diagnosis") or {}
            t_bug = (bug.get("bench") or {}).get("tpot_ms")
            t_fix = (pg.get("bench") or {}).get("tpot_ms")
            pred = f.get("predicted_step_ms_after_fix") if f else None
            rows.append({
                "pool": name,
                "max_total_num_tokens": ((P.get("bug_server") or {}).get("server_info") or {}).get("max_total_num_tokens"),
                "tpot_bug_ms": t_bug, "tpot_pages_ms": t_fix,
                "speedup": round(t_bug / t_fix, 2) if t_bug and t_fix else None,
                "predicted_tpot_ms": pred,
                "prediction_error": round((pred - t_fix) / t_fix, 3) if pred and t_fix else None,
                "floor_ms": (pd.get("floor") or {}).get("floor_ms"),
                "worst_bucket_after": (pd.get("floor") or {}).get("worst_bucket"),
                "fp8_kv_cast_found": bool(f),
                "finding_pool_tokens": ev.get("pool_tokens"), "finding_casts_per_step": ev.get("casts_per_step"),
                "finding_launches_per_cast": ev.get("launches_per_cast"),
                "fp8_kv_cast_after": any(x.get("id") == "fp8-kv-cast" for x in pd.get("findings") or []) if pd else None,
                "outputs_pages_identical": (P.get("outputs_pages_vs_bug") or {}).get("identical"),
                "outputs_shifted_identical": (P.get("outputs_shifted_vs_bug") or {}).get("identical"),
                "pages_tokens_differing": _differing(P.get("outputs_pages_vs_bug")),
                "shifted_tokens_differing": _differing(P.get("outputs_shifted_vs_bug")),
                "probe_output_tokens": _n_tokens(P.get("probe_bug")),
                "shifted_skipped": P.get("shifted_skipped"),
                "fix_restart_tpot": _restart_tpot(P),
                "native": _native_line(P.get("native_check")),
                "reverted_byte_identical": P.get("reverted_byte_identical"),
                "error": P.get("error"),
            })
        self.summary["table"] = {"engine": "sglang", "env": self.summary.get("env"), "rows": rows}
        lines = ["| pool | max_total_num_tokens | TPOT bug (ms) | TPOT pages (ms) | speed-up | predicted (ms) | error "
                 "| floor (ms) | finding: pool tokens, casts/step | outputs pages = bug | shifted = bug | reverted |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            pe = r["prediction_error"]
            lines.append(f"| {r['pool']} | {r['max_total_num_tokens']} | {r['tpot_bug_ms']} | {r['tpot_pages_ms']} | "
                         f"{r['speedup']} | {r['predicted_tpot_ms']} | {'-' if pe is None else f'{pe * 100:+.1f}%'} | "
                         f"{r['floor_ms']} | {r['finding_pool_tokens']}, {r['finding_casts_per_step']} | "
                         f"{r['outputs_pages_identical']} | {r['outputs_shifted_identical']} | "
                         f"{r['reverted_byte_identical']} |")
        (self.out / "table.md").write_text("\n".join(lines) + "\n")

    def sg_pack(self) -> None:
        buf_runs = self.out / "runs.tar"
        with tarfile.open(buf_runs, "w") as tf:
            for d in sorted(self.runs.glob("*")):
                tf.add(d, arcname=f"runs/{d.name}")
        if buf_runs.stat().st_size > 15 * 1024 * 1024:
            buf_runs.unlink()
            self.summary["runs_note"] = "runs.tar over 15 MiB: not brought back"
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tf:
            tf.add(self.logs, arcname="logs")
            for f in sorted(self.work.glob("*.json")) + sorted(self.work.glob("*.py")) + sorted(self.work.glob("*.sh")):
                tf.add(f, arcname=f.name)
        self.save()


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _brief(c) -> dict:
    if not isinstance(c, dict):
        return {"raw": str(c)[:500]}
    return {k: v for k, v in c.items() if len(json.dumps(v, default=str)) < 6000}


def _differing(d) -> dict | None:
    """Output tokens whose logprob differs, per batch size, from a probe_diff."""
    if not d:
        return None
    return {p: (d.get(p) or {}).get("tokens_differing") for p in ("bs1", "bs8")}


def _n_tokens(pr) -> dict | None:
    if not pr:
        return None
    return {p: sum(len(r.get("lp") or []) for r in pr.get(p) or []) for p in ("bs1", "bs8")}


def _restart_tpot(P: dict):
    rep = ((P.get("apply") or {}).get("report") or {})
    return rep.get("restart") or {k: rep.get(k) for k in ("tpot_before_ms", "tpot_after_ms") if k in rep} or None


def _native_line(chk) -> str | None:
    if not chk:
        return None
    rep = chk.get("report") or {}
    return f"rc {chk.get('rc')}: {rep.get('reason') or rep.get('strategy_reason') or chk.get('stderr', '')[-300:]}"


def sg_main(lp) -> None:
    lp.phase("install", lp.sg_install, min_left=60)
    if lp.summary["phases"].get("install", {}).get("status") != "ok":
        return
    lp.phase("checkpoint", lp.sg_checkpoint, min_left=60)
    lp.phase("loop", lp.sg_loop, min_left=120)

