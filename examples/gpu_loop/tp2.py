"""Tensor-parallel truth in one command (issue 6): the repro server at TP=2, traced and diagnosed.

On an ``nvidia-h200-x2`` device machine, from the repository root (the wheels in .gpuloop-carry/
give perfscope's parsers; see the TP section of examples/repro_server/README.md):

    python3 -m pip install -q --no-deps --no-index .gpuloop-carry/*.whl; \\
    PYTHONPATH=$PWD python3 examples/gpu_loop/tp2.py --out $OUT --deadline 540

Dry run of everything but the GPU (CPU, tiny model; the custom all-reduce runs are skipped):

    PYTHONPATH=$PWD python examples/gpu_loop/tp2.py --out /tmp/tp2-out --device cpu --small

Runs, in this order, until ``--deadline`` seconds are spent (each one: start
``python -m examples.repro_server --tp-size 2 ...``, ``perfscope trace --url``, ``perfscope diagnose``
on the run folder and on its DECODE files, time ``diagnose`` of rank 0's DECODE file alone against
both ranks' files, stop the server):

    nccl-pool      --allreduce nccl   --kv-strategy pool   (the whole-pool FP8 cast: the bug)
    nccl-fp8       --allreduce nccl   --kv-strategy fp8    (no cast)
    custom-pool    --allreduce custom --kv-strategy pool   (torch symm-mem one-shot; NCCL if unavailable)
    custom-fp8     --allreduce custom --kv-strategy fp8
    straggler-tail --allreduce nccl   --kv-strategy fp8 --straggler-rank 1 --straggler-ms 20 --straggler-at tail
    straggler-head   the same, --straggler-at head (rank 1 late before its first all-reduce)

NVLink multicast stays off: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set here
and in every server rank (examples/repro_server/tp.py).

``--out`` gets at most 5 files: summary.json (every number), table.md, diagnose.tar.gz (the
diagnose JSONs), logs.tar.gz, traces.tar.gz (the DECODE traces of as many runs as fit in 15 MB).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from perfscope.demo import read_server_url

REPO = Path(__file__).resolve().parents[2]
T0 = time.monotonic()
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MAX_TAR = 15 * 1024 * 1024

RUNS = [
    ("nccl-pool", ["--allreduce", "nccl", "--kv-strategy", "pool"]),
    ("nccl-fp8", ["--allreduce", "nccl", "--kv-strategy", "fp8"]),
    ("custom-pool", ["--allreduce", "custom", "--kv-strategy", "pool"]),
    ("custom-fp8", ["--allreduce", "custom", "--kv-strategy", "fp8"]),
    ("straggler-tail", ["--allreduce", "nccl", "--kv-strategy", "fp8", "--straggler-rank", "1",
                        "--straggler-ms", "{straggler_ms}", "--straggler-at", "tail"]),
    ("straggler-head", ["--allreduce", "nccl", "--kv-strategy", "fp8", "--straggler-rank", "1",
                        "--straggler-ms", "{straggler_ms}", "--straggler-at", "head"]),
]


def now() -> float:
    return round(time.monotonic() - T0, 1)


def say(msg: str) -> None:
    print(f"[{now():6.1f}s] {msg}", flush=True)


class TP2:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        shutil.rmtree(self.work, ignore_errors=True)
        self.logs = self.work / "logs"
        for d in (self.work, self.logs, Path(a.out)):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **SAFE_ENV}
        self.env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.summary: dict = {"argv": sys.argv, "device": a.device, "runs": {}, "env": {}}
        self.cuda = a.device.startswith("cuda")

    def left(self) -> float:
        return self.a.deadline - (time.monotonic() - T0)

    def save(self) -> None:
        (Path(self.a.out) / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str) + "\n")

    def sh(self, name: str, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        timeout = max(5.0, min(timeout, self.left() - 5))
        t = time.monotonic()
        try:
            p = subprocess.run([str(x) for x in argv], cwd=REPO, env=self.env, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            p = subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout:.0f}s")
        (self.logs / f"{name}.out").write_text(p.stdout or "")
        (self.logs / f"{name}.err").write_text(p.stderr or "")
        say(f"{name}: rc {p.returncode} in {time.monotonic() - t:.1f}s")
        return p

    # ------------------------------------------------------------------ env
    def probe_env(self) -> None:
        code = ("import json,os,torch\nd={'torch':torch.__version__,'cuda':torch.version.cuda,"
                "'gpus':torch.cuda.device_count(),'names':[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}\n"
                "try:\n import torch.cuda.nccl as n; d['nccl']=n.version()\nexcept Exception as e: d['nccl']=str(e)\n"
                "d['p2p']=torch.cuda.can_device_access_peer(0,1) if torch.cuda.device_count()>1 else None\n"
                "d['symm_mem_one_shot']=hasattr(torch.ops.symm_mem,'one_shot_all_reduce')\n"
                "d['env']={k:os.environ.get(k) for k in ('NCCL_NVLS_ENABLE','TORCH_SYMM_MEM_DISABLE_MULTICAST')}\n"
                "for m in ('msgspec','orjson','flashinfer'):\n"
                "  try: d[m]=getattr(__import__(m),'__version__','?')\n"
                "  except Exception as e: d[m]='missing: %s'%e\nprint(json.dumps(d))")
        r = self.sh("env", [sys.executable, "-c", code], timeout=120)
        try:
            self.summary["env"] = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.summary["env"] = {"error": r.stderr[-800:]}
        if self.cuda:
            t = self.sh("nvidia-smi-topo", ["nvidia-smi", "topo", "-m"], timeout=30)
            self.summary["env"]["topo"] = t.stdout[-2000:]

    # ------------------------------------------------------------------ one run
    def server_argv(self, extra: list[str]) -> list[str]:
        a = [sys.executable, "-m", "examples.repro_server", "--port", "0", "--device", self.a.device, "--tp-size", "2"]
        if self.a.small:
            a += ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "2", "--max-total-tokens", "16000",
                  "--vocab-size", "256", "--threads", "1", "--mlp-size", "128"]
        else:
            a += ["--num-heads", str(self.a.num_heads)]
            if not self.a.flashinfer:
                a += ["--no-flashinfer"]
        return a + [x.format(straggler_ms=self.a.straggler_ms) for x in extra]

    def run_one(self, name: str, extra: list[str]) -> dict:
        rec: dict = {"server_args": extra}
        if "custom" in name and not self.cuda:
            return {"status": "skipped", "reason": "the custom all-reduce needs CUDA"}
        log = open(self.logs / f"{name}.server.log", "w")
        argv = self.server_argv(extra)
        rec["argv"] = argv
        t_launch = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
        url = read_server_url(proc, min(self.a.start_timeout, self.left() - 30))
        try:
            if url is None:
                rec.update(status="failed", reason="server did not start",
                           log_tail=(self.logs / f"{name}.server.log").read_text()[-2000:])
                return rec
            rec["start_s"] = round(time.monotonic() - t_launch, 1)
            import urllib.request

            info = json.loads(urllib.request.urlopen(url + "/server_info", timeout=30).read())
            rec["server_info"] = {k: info.get(k) for k in (
                "tp_size", "tp_backend", "allreduce", "allreduce_requested", "custom_all_reduce_error",
                "disable_custom_all_reduce", "kv_strategy", "num_attention_heads", "num_attention_heads_per_rank",
                "mlp_size", "num_hidden_layers", "hidden_size", "max_total_num_tokens", "straggler", "flashinfer",
                "device_name", "torch_version", "nccl_nvls_enable", "torch_symm_mem_disable_multicast")}
            run = self.work / "runs" / name
            t = self.sh(f"{name}.trace", [sys.executable, "-m", "perfscope", "trace", "--url", url,
                                          "--steps", str(self.a.steps), "--concurrency", str(self.a.concurrency),
                                          "--input-len", str(self.a.input_len), "--output-len", str(self.a.output_len),
                                          "--remote-dir", str(self.work), "--out", str(run), "--json"], timeout=300)
            if t.returncode != 0:
                rec.update(status="failed", reason="trace failed", stderr=t.stderr[-1500:])
                return rec
            rec["trace"] = json.loads(t.stdout)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        dec = sorted((run / "traces").glob("*-DECODE.trace.json.gz"))
        d_all = self.sh(f"{name}.diagnose", [sys.executable, "-m", "perfscope", "diagnose", str(run), "--json"])
        d_dec = self.sh(f"{name}.diagnose-decode", [sys.executable, "-m", "perfscope", "diagnose", *map(str, dec), "--json"])
        ddir = self.work / "diagnose"
        ddir.mkdir(exist_ok=True)
        (ddir / f"{name}.json").write_text(d_all.stdout)
        (ddir / f"{name}.decode.json").write_text(d_dec.stdout)
        rec["diagnose_rc"] = [d_all.returncode, d_dec.returncode]
        if d_all.returncode == 0 and d_dec.returncode == 0:
            rec.update(self.extract(json.loads(d_all.stdout), json.loads(d_dec.stdout)))
        rec["diagnose_speed"] = self.speed(name, dec)
        rec["status"] = "ok"
        return rec

    @staticmethod
    def extract(d_all: dict, d_dec: dict) -> dict:
        ranks = []
        for r in d_all["ranks"]:
            f_ids = [f["id"] for f in r["findings"]]
            nccl = next((f for f in r["findings"] if f["id"] == "nccl-allreduce"), None)
            ranks.append({
                "rank": r["rank"], "stage": r["stage"], "steps": r["steps"]["count"],
                "median_ms": r["steps"]["median_ms"], "analysed_on": r["steps"]["analysed_on"],
                "kernel_ms_per_step": r["kernel_ms_per_step"], "idle_ms_per_step": r["idle_ms_per_step"],
                "buckets_ms": {b: v["ms_per_step"] for b, v in r["buckets"].items() if v["ms_per_step"]},
                "comm_sub_ms": {k: v["ms_per_step"] for k, v in r["sub_buckets"].items() if k.startswith("communication")},
                "comm_ops": [(o["name"][:90], o["ms_per_step"], o["count_per_step"]) for o in r["ops"]
                             if o["bucket"] == "communication"][:4],
                "findings": f_ids, "nccl_allreduce": nccl and {k: nccl.get(k) for k in ("summary", "share", "evidence")},
            })
        return {"ranks": ranks, "straggler_run_folder": d_all.get("straggler"), "straggler_decode": d_dec.get("straggler")}

    def speed(self, name: str, dec: list[Path]) -> dict:
        if len(dec) < 2:
            return {"error": f"{len(dec)} DECODE files"}
        one, two = [], []
        for _ in range(self.a.speed_rounds):
            for files, acc in (([dec[0]], one), (dec[:2], two)):
                t = time.perf_counter()
                r = subprocess.run([sys.executable, "-m", "perfscope", "diagnose", *map(str, files), "--json"],
                                   cwd=REPO, env=self.env, capture_output=True, timeout=300)
                acc.append(time.perf_counter() - t if r.returncode == 0 else float("nan"))
        m1, m2 = statistics.median(one), statistics.median(two)
        return {"one_rank_s": round(m1, 3), "two_ranks_s": round(m2, 3), "ratio": round(m2 / m1, 3),
                "target": "<= 1.3", "bytes": [p.stat().st_size for p in dec[:2]], "cores": os.cpu_count()}

    # ------------------------------------------------------------------ outputs
    def table(self) -> str:
        rows = ["| run | all-reduce | kv | rank | stage | step ms | kernel ms | comm ms | comm sub | findings | diag 2/1 |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, rec in self.summary["runs"].items():
            si = rec.get("server_info") or {}
            if rec.get("status") != "ok":
                rows.append(f"| {name} | | | | | | | | | {rec.get('status')}: {rec.get('reason', '')} | |")
                continue
            for r in rec.get("ranks", []):
                rows.append(f"| {name} | {si.get('allreduce')} | {si.get('kv_strategy')} | {r['rank']} | {r['stage']} | "
                            f"{r['median_ms']} | {r['kernel_ms_per_step']} | {r['buckets_ms'].get('communication', 0)} | "
                            f"{r['comm_sub_ms']} | {','.join(r['findings'])} | {rec['diagnose_speed'].get('ratio')} |")
            rows.append(f"| {name} | straggler (DECODE files) | {json.dumps(rec.get('straggler_decode'))} |||||||||")
        return "\n".join(rows) + "\n"

    def pack(self) -> None:
        out = Path(self.a.out)
        (out / "table.md").write_text(self.table())
        for arc, src in (("diagnose.tar.gz", self.work / "diagnose"), ("logs.tar.gz", self.logs)):
            if src.exists():
                with tarfile.open(out / arc, "w:gz") as t:
                    t.add(src, arcname=src.name)
        buf = io.BytesIO()
        kept = []
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            for name in self.summary["runs"]:
                files = sorted((self.work / "runs" / name / "traces").glob("*-DECODE.trace.json.gz"))
                size = sum(f.stat().st_size for f in files)
                if files and buf.tell() + size < MAX_TAR:
                    for f in files:
                        t.add(f, arcname=f"{name}/{f.name}")
                    kept.append(name)
        if kept and len(buf.getvalue()) < MAX_TAR:
            (out / "traces.tar.gz").write_bytes(buf.getvalue())
        self.summary["traces_brought_back"] = kept
        self.save()

    def main(self) -> int:
        say(f"tp2: device {self.a.device}, deadline {self.a.deadline}s")
        self.probe_env()
        self.save()
        for name, extra in RUNS:
            if self.a.only and name not in self.a.only.split(","):
                continue
            if self.left() < self.a.min_left:
                self.summary["runs"][name] = {"status": "skipped", "reason": f"deadline ({self.left():.0f}s left)"}
                continue
            say(f"=== {name}")
            try:
                self.summary["runs"][name] = self.run_one(name, extra)
            except Exception as e:  # noqa: BLE001 - recorded; the next run still goes
                self.summary["runs"][name] = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
            self.save()
        self.pack()
        say("done: " + ", ".join(f"{n} {r.get('status')}" for n, r in self.summary["runs"].items()))
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/tp2work")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny model (CPU dry run)")
    ap.add_argument("--num-heads", type=int, default=32, help="total heads (16 per rank at TP=2, the H200 reference)")
    ap.add_argument("--flashinfer", action="store_true", help="use FlashInfer's MLA wrapper (needs its JIT cache)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--straggler-ms", type=float, default=20.0)
    ap.add_argument("--speed-rounds", type=int, default=3)
    ap.add_argument("--start-timeout", type=float, default=240.0)
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for everything")
    ap.add_argument("--min-left", type=float, default=60.0, help="do not start a run with less than this left")
    ap.add_argument("--only", default="", help="comma-separated run names")
    a = ap.parse_args()
    if a.small:
        a.concurrency, a.input_len, a.output_len, a.steps = 1, 32, 40, 8
    return TP2(a).main()


if __name__ == "__main__":
    sys.exit(main())
