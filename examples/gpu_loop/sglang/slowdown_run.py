"""Why does the pages-patched real SGLang get slower after its first requests? (h23, issue 15
follow-up.) One device call: install the carried set, write the seeded checkpoint, ``perfscope fix
fp8-kv-cast --strategy pages --apply`` before any server starts, serve the patched SGLang with the
495k-token pool (the loop's flags), then a sequence of ``perfscope bench`` runs (2000 in / 64 out,
concurrency 1, the loop's workload) between the candidate causes:

    fresh x3 | idle 10 s | plain-request soak | logprob probe | perfscope trace | /freeze_gc |
    /flush_cache | a second trace

Around every bench: the server processes' CPU time per thread (/proc/PID/task/TID/stat and
schedstat: run and run-queue wait), their threads and whether libcupti is mapped, the runner's own
pure-Python loop time (the machine's speed), and after each trace whether SGLang still has a
profile running (``POST /stop_profile``). summary.json is rewritten after every step.

    python3 examples/gpu_loop/sglang/slowdown_run.py --payload P/site.tar.xz --out $OUT --deadline 300
    python3 examples/gpu_loop/sglang/slowdown_run.py --url http://127.0.0.1:PORT --pgid PID --out D \\
        --vocab 4096 --input-len 64 --output-len 8      # the sequence against a running server (CPU dry run)
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
import urllib.error
import urllib.request
from pathlib import Path

T0 = time.monotonic()
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
from gpuloop.sglang_real import probe, probe_diff  # noqa: E402
from harness import ORIG_SHA, TARGET_REL, Harness, install, stop_group  # noqa: E402,F401

CONFIG = HERE / "config.json"
CLK = os.sysconf("SC_CLK_TCK")


def now() -> float:
    return round(time.monotonic() - T0, 1)


# ------------------------------------------------------------------ the server's processes, from /proc
def group_pids(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            st = (d / "stat").read_text()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:  # field 5 of stat: pgrp
            out.append(int(d.name))
    return sorted(out)


def _task(p: Path) -> dict | None:
    try:
        st = (p / "stat").read_text()
        comm = st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        cpu_s = (int(f[11]) + int(f[12])) / CLK  # utime + stime (fields 14, 15)
        ss = (p / "schedstat").read_text().split()  # run ns, run-queue wait ns, timeslices
        return {"comm": comm, "cpu_s": round(cpu_s, 3), "run_s": int(ss[0]) / 1e9, "wait_s": int(ss[1]) / 1e9,
                "slices": int(ss[2])}
    except (OSError, ValueError, IndexError):
        return None


def snapshot(pgid: int | None) -> dict:
    """Every process of the server's group: its title, threads (name, CPU, run-queue wait), RSS,
    whether libcupti is mapped into it."""
    if not pgid:
        return {}
    procs = {}
    for pid in group_pids(pgid):
        base = Path(f"/proc/{pid}")
        try:
            cmd = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
            maps = (base / "maps").read_text(errors="replace")
            rss = next((int(x.split()[1]) for x in (base / "status").read_text().splitlines()
                        if x.startswith("VmRSS:")), 0)
        except OSError:
            continue
        tasks = {}
        for t in (base / "task").iterdir():
            r = _task(t)
            if r:
                tasks[t.name] = r
        procs[str(pid)] = {"cmd": cmd, "rss_mb": round(rss / 1024, 1), "threads": len(tasks),
                           "cupti_mapped": "libcupti" in maps, "kineto_mapped": "kineto" in maps, "tasks": tasks}
    return procs


def delta(a: dict, b: dict) -> dict:
    """CPU seconds, run-queue wait and thread changes between two snapshots, per process; the 4
    threads that used the most CPU in between."""
    out = {}
    for pid, pb in b.items():
        pa = a.get(pid) or {"tasks": {}}
        ts = []
        for tid, tb in pb["tasks"].items():
            ta = pa["tasks"].get(tid) or {"cpu_s": 0, "run_s": 0, "wait_s": 0, "slices": 0}
            ts.append({"tid": tid, "comm": tb["comm"], "cpu_s": round(tb["cpu_s"] - ta["cpu_s"], 3),
                       "run_s": round(tb["run_s"] - ta["run_s"], 4), "wait_s": round(tb["wait_s"] - ta["wait_s"], 4),
                       "slices": tb["slices"] - ta["slices"]})
        ts.sort(key=lambda x: -x["run_s"])
        out[pid] = {"cmd": pb["cmd"][:60], "run_s": round(sum(t["run_s"] for t in ts), 4),
                    "wait_s": round(sum(t["wait_s"] for t in ts), 4), "threads": pb["threads"],
                    "new_threads": sorted({t["comm"] for t in ts if t["tid"] not in pa["tasks"]}),
                    "gone_threads": sorted({t["comm"] for tid, t in pa["tasks"].items() if tid not in pb["tasks"]}),
                    "cupti_mapped": pb["cupti_mapped"], "rss_mb": pb["rss_mb"], "top": ts[:4]}
    return out


def py_loop_ms(n: int = 2_000_000) -> float:
    """The runner's own pure-Python loop (best of 3): a slower machine shows here too."""
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        s = 0
        for i in range(n):
            s += i
        best = min(best, time.perf_counter() - t)
    return round(best * 1e3, 2)


def http(method: str, url: str, body: dict | None = None, timeout: float = 30) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return {"status": r.status, "body": r.read().decode(errors="replace")[:600]}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode(errors="replace")[:600]}
    except OSError as e:
        return {"status": None, "body": repr(e)[:300]}


def server_info(url: str) -> dict:
    r = http("GET", url + "/server_info")
    try:
        i = json.loads(r["body"]) if r["status"] == 200 else {}
    except ValueError:
        i = {}
    if r["status"] == 200 and not i:  # cut at 600 characters: ask again for the whole
        with urllib.request.urlopen(url + "/server_info", timeout=30) as rr:
            i = json.loads(rr.read())
    keep = ("version", "max_total_num_tokens", "kv_cache_dtype", "attention_backend", "page_size",
            "cuda_graph_max_bs", "disable_cuda_graph", "mem_fraction_static", "chunked_prefill_size",
            "disable_overlap_schedule", "disable_radix_cache", "enable_metrics", "gc_threshold", "sleep_on_idle")
    out = {k: i.get(k) for k in keep if k in i}
    st = i.get("internal_states")
    if isinstance(st, list) and st and isinstance(st[0], dict):
        out["internal_states"] = {k: v for k, v in st[0].items() if isinstance(v, (int, float, str, bool))}
    return out


def gpu_state() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,"
                            "utilization.gpu,memory.used", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=15)
        return r.stdout.strip() or r.stderr.strip()[:200]
    except (OSError, subprocess.TimeoutExpired) as e:
        return repr(e)[:200]


def bench_brief(b: dict) -> dict:
    if not isinstance(b, dict) or "tpot_ms" not in b:
        return {"error": b}
    pr = b.get("per_request") or []
    return {"tpot_ms": b.get("tpot_ms"), "tpot_mean_ms": ((b.get("stats_ms") or {}).get("tpot") or {}).get("mean"),
            "ttft_ms": b.get("ttft_ms"), "itl_ms": b.get("itl_ms"), "requests": b.get("requests"),
            "failed": b.get("failed"), "per_request_tpot_ms": [round(r.get("tpot_ms"), 4) for r in pr
                                                               if r.get("tpot_ms") is not None],
            "per_request_ttft_ms": [round(r.get("ttft_ms"), 2) for r in pr if r.get("ttft_ms") is not None]}


# ------------------------------------------------------------------ the sequence
def sequence(S: dict, url: str, pgid: int | None, a, env: dict, h: Harness) -> None:
    py = sys.executable
    seq = S.setdefault("sequence", [])
    n = {"i": 0}
    work, save, left, log = h.work, h.save, h.left, h.log

    def perfscope(name, argv, timeout):
        return h.run(name, [py, "-m", "perfscope", *argv], timeout=timeout, env=env, margin=3)

    def step(kind, label, fn, need):
        if left() < need:
            seq.append({"kind": kind, "label": label, "skipped": f"deadline ({left():.0f}s left < {need}s)"})
            log(f"skip {label}: {left():.0f}s left")
            save()
            return None
        n["i"] += 1
        rec = {"i": n["i"], "kind": kind, "label": label, "at_s": now()}
        before = snapshot(pgid)
        t = time.monotonic()
        try:
            rec.update(fn() or {})
        except Exception as e:  # noqa: BLE001 - recorded, the sequence goes on
            rec["error"] = f"{type(e).__name__}: {e}"[:1500]
            log(f"{label} FAILED: {rec['error'][:300]}")
        rec["s"] = round(time.monotonic() - t, 2)
        after = snapshot(pgid)
        rec["procs"] = delta(before, after)
        seq.append(rec)
        if kind == "bench":
            per_tok = {}
            toks = (rec.get("bench") or {}).get("requests") or 0
            for pid, d in rec["procs"].items():
                # the warm-up request included: its CPU time is in the same window
                per_tok[d["cmd"][:40] + f" [{pid}]"] = round(d["run_s"] * 1e6 / max(1, (toks + 1) * a.output_len), 1)
            rec["cpu_us_per_output_token"] = per_tok
            log(f"{label}: TPOT {(rec.get('bench') or {}).get('tpot_ms')} ms, per request "
                f"{(rec.get('bench') or {}).get('per_request_tpot_ms')}, py loop {rec.get('py_loop_ms')} ms")
        save()
        return rec

    def bench(label, nreq=None):
        def fn():
            loop = py_loop_ms()
            rc, so, se = perfscope(f"bench-{n['i']:02d}-{label}", ["bench", "--url", url, "--input-len", a.input_len,
                                                                  "--output-len", a.output_len, "--num-requests",
                                                                  nreq or a.requests, "--warmup", "1", "--json"], 120)
            try:
                b = json.loads(so)
            except ValueError:
                b = {"rc": rc, "stderr": se[-800:]}
            return {"py_loop_ms": loop, "bench": bench_brief(b)}
        return step("bench", label, fn, 8)

    def idle(label, s):
        return step("idle", label, lambda: (time.sleep(min(s, max(0, left() - 30))), {"idle_s": s})[1], s + 25)

    def do_probe(label):
        def fn():
            p = probe(url, a.vocab)
            (work / f"probe-{label}.json").write_text(json.dumps(p))
            r = {"output_tokens": sum(len(x.get("lp") or []) for part in ("bs1", "bs8") for x in p.get(part) or [])}
            if a.recorded_probe and Path(a.recorded_probe).is_file():
                rec = json.loads(Path(a.recorded_probe).read_text())
                d = probe_diff(rec["probe_unpatched"], p)
                r["vs_recorded_unpatched"] = {"identical": d["identical"],
                                              "tokens_differing": {k: d[k]["tokens_differing"] for k in ("bs1", "bs8")}}
            return r
        return step("probe", label, fn, 25)

    def trace(label):
        def fn():
            runp = work / "runs" / label
            shutil.rmtree(runp, ignore_errors=True)
            rc, so, se = perfscope(f"trace-{label}", ["trace", "--url", url, "--steps", a.trace_steps, "--input-len",
                                                     a.input_len, "--output-len", a.output_len, "--out", runp,
                                                     "--timeout", "60", "--json"], 90)
            try:
                t = json.loads(so)
            except ValueError:
                t = {"rc": rc, "stderr": se[-800:]}
            r = {"rc": rc, "trace": {k: t.get(k) for k in ("files", "timings", "workload") if k in t} or t}
            time.sleep(1.0)
            r["stop_profile_after"] = http("POST", url + "/stop_profile", None)  # refused = nothing running
            return r
        return step("trace", label, fn, 40)

    def post(label, path):
        return step("action", label, lambda: {"reply": http("POST", url + path, {})}, 15)

    S["gpu_start"] = gpu_state()
    S["server_info_start"] = server_info(url)
    S["stop_profile_at_start"] = http("POST", url + "/stop_profile", None)
    S["snapshot_start"] = {pid: {k: v for k, v in p.items() if k != "tasks"} | {
        "thread_names": sorted({t["comm"] for t in p["tasks"].values()})} for pid, p in snapshot(pgid).items()}
    save()
    bench("fresh-1")
    bench("fresh-2")
    bench("fresh-3")
    idle("idle-10s", a.idle_s)
    bench("after-idle")
    bench("soak", a.soak_requests)
    bench("after-soak")
    do_probe("probe")
    bench("after-probe-1")
    bench("after-probe-2")
    trace("trace-1")
    bench("after-trace-1")
    bench("after-trace-2")
    bench("after-trace-3")
    post("freeze-gc", "/freeze_gc")
    bench("after-freeze-gc")
    post("flush-cache", "/flush_cache")
    bench("after-flush-cache")
    trace("trace-2")
    bench("after-trace2-1")
    bench("after-trace2-2")
    S["server_info_end"] = server_info(url)
    S["gpu_end"] = gpu_state()
    S["snapshot_end"] = {pid: {k: v for k, v in p.items() if k != "tasks"} | {
        "thread_names": sorted({t["comm"] for t in p["tasks"].values()})} for pid, p in snapshot(pgid).items()}
    S["table"] = [{"i": r.get("i"), "label": r["label"], "at_s": r.get("at_s"),
                   "tpot_ms": (r.get("bench") or {}).get("tpot_ms"),
                   "per_request_tpot_ms": (r.get("bench") or {}).get("per_request_tpot_ms"),
                   "py_loop_ms": r.get("py_loop_ms"), "skipped": r.get("skipped")}
                  for r in seq if r["kind"] == "bench" or r.get("skipped")]
    save()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payload")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/w23")
    ap.add_argument("--site", default="/tmp/site")
    ap.add_argument("--deadline", type=float, default=300)
    ap.add_argument("--no-server", action="store_true", help="CPU dry run: install, patch, revert (no checkpoint)")
    ap.add_argument("--url", help="attach to this running server (no install, no patch, no start)")
    ap.add_argument("--pgid", type=int, help="with --url: the server's process group (its /proc stats)")
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--input-len", type=int, default=2000)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--soak-requests", type=int, default=40)
    ap.add_argument("--idle-s", type=float, default=10)
    ap.add_argument("--trace-steps", type=int, default=10)
    ap.add_argument("--pool", type=int, default=495000)
    ap.add_argument("--recorded-probe", default=str(HERE.parent / "results/h200-2026-12-01-sglang/pool495000/summary.json"))
    a = ap.parse_args()
    out, work, site = Path(a.out), Path(a.work), Path(a.site)
    S: dict = {"argv": sys.argv, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    py = sys.executable
    a.vocab = a.vocab or json.loads(CONFIG.read_text())["vocab_size"]
    h = Harness(out, work, a.deadline, T0, S)
    logs, save, left, log, run = h.logs, h.save, h.left, h.log, h.run

    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if a.url:  # attach: the sequence only (the CPU dry run against a real CPU SGLang)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        S["mode"] = "attach"
        try:
            sequence(S, a.url.rstrip("/"), a.pgid, a, env, h)
        except Exception as e:  # noqa: BLE001
            S["error"] = f"{type(e).__name__}: {e}"[-3000:]
        _pack(S, out, logs, work)
        save()
        return 0 if not S.get("error") else 1

    # ---------------------------------------------------------------- install (harness.install)
    target, original, S["install"] = install(a.payload, site, env, REPO, a.no_server)
    S["install"].update(nproc=os.cpu_count(), loadavg=Path("/proc/loadavg").read_text().strip())
    log(f"installed in {S['install']['s']}s, target original: {S['install']['target_is_recorded_original']}")
    save()
    procs: dict[str, subprocess.Popen] = {}
    fix = [py, "-m", "perfscope", "fix", "fp8-kv-cast", "--strategy", "pages", "--sglang-root", site / "sglang",
           "--python", py, "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
           "--state-dir", work / "state", "--port", "30123", "--json"]
    try:
        if a.no_server:
            rc, so, se = run("fix-pages-apply", fix + ["--apply"], env=env)
            S["apply"] = {"rc": rc, "sha256_after": hashlib.sha256(target.read_bytes()).hexdigest(), "stderr": se[-800:]}
            if rc != 0:
                raise RuntimeError(f"fix --apply rc {rc}: {se[-500:]}")
            return 0
        procs["warm"] = subprocess.Popen([py, str(HERE / "warm_flashinfer.py"), str(CONFIG)], env=env,
                                         stdout=open(logs / "warm_flashinfer.log", "wb"), stderr=subprocess.STDOUT)
        model = work / "model"
        rc, so, _ = run("make-checkpoint", [py, HERE / "make_checkpoint.py", CONFIG, model, "--seed", "0"],
                        timeout=300, env=env)
        try:
            S["checkpoint"] = json.loads(so.strip().splitlines()[-1])
        except (ValueError, IndexError):
            S["checkpoint"] = {"rc": rc}
        rc, so, se = run("fix-pages-apply", fix + ["--apply"], env=env)
        try:
            rep = json.loads(so)
        except ValueError:
            rep = {}
        S["apply"] = {"rc": rc, "outcome": rep.get("outcome"), "variant": rep.get("variant"),
                      "sha256_after": hashlib.sha256(target.read_bytes()).hexdigest(), "stderr": se[-800:]}
        save()
        if rc != 0:
            raise RuntimeError(f"fix --apply rc {rc}: {se[-500:]}")
        argv = [py, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "safetensors",
                "--skip-tokenizer-init", "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer",
                "--mem-fraction-static", "0.5", "--cuda-graph-bs", "1", "2", "4", "8",
                "--chunked-prefill-size", "2048", "--host", "127.0.0.1", "--port", "30123", "--random-seed", "0",
                "--max-total-tokens", str(a.pool)]
        procs["pages"] = subprocess.Popen(argv, env=env, stdout=open(logs / "server-pages.log", "wb"),
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        S["server"] = {"argv": argv, "started_at_s": now(), "pgid": procs["pages"].pid}
        save()
        url = "http://127.0.0.1:30123"
        while left() > 60:
            if procs["pages"].poll() is not None:
                raise RuntimeError(f"server exited {procs['pages'].returncode}: "
                                   f"{(logs / 'server-pages.log').read_text(errors='replace')[-2000:]}")
            if http("GET", url + "/health", timeout=2)["status"] == 200:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"server not healthy by {now()}s: "
                               f"{(logs / 'server-pages.log').read_text(errors='replace')[-2000:]}")
        S["server"]["healthy_at_s"] = now()
        log("server healthy")
        if procs["warm"].poll() is None:
            procs.pop("warm").kill()
        sequence(S, url, procs["pages"].pid, a, env, h)
    except Exception as e:  # noqa: BLE001 - recorded
        S["error"] = f"{type(e).__name__}: {e}"[-3000:]
        log(f"FAILED: {S['error'][:1500]}")
    finally:
        for tag in list(procs):
            p = procs.pop(tag)
            if tag == "warm":
                p.kill()
                continue
            stop_group(p)
        if target.read_bytes() != original:
            rc, so, se = run("fix-pages-revert", fix + ["--revert"], timeout=30, env=env)
            if target.read_bytes() != original:
                target.write_bytes(original)
        S["reverted_byte_identical"] = target.read_bytes() == original
        _pack(S, out, logs, work)
        save()
    return 0 if not S.get("error") else 1


def _pack(S: dict, out: Path, logs: Path, work: Path) -> None:
    try:
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tf:
            tf.add(logs, arcname="logs")
            for f in sorted(work.glob("*.json")):
                tf.add(f, arcname=f.name)
        if (work / "runs").is_dir():
            with tarfile.open(out / "runs.tar", "w") as tf:
                tf.add(work / "runs", arcname="runs")
            if (out / "runs.tar").stat().st_size > 15 * 1024 * 1024:
                (out / "runs.tar").unlink()
                S["runs_note"] = "runs.tar over 15 MiB: not brought back"
    except Exception as e:  # noqa: BLE001
        S["pack_error"] = repr(e)
    S["total_s"] = now()


if __name__ == "__main__":
    raise SystemExit(main())
