"""What the one-call device scripts of this folder share (patched_run.py, slowdown_run.py): the
summary and its deadline, commands run with their output in logs/, the payload's install, and the
stop of a server's process group."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

TARGET_REL = "srt/layers/attention/flashinfer_mla_backend.py"  # the file the pages patch edits
ORIG_SHA = "bc7bba45c3f52d28d1dcd4092c4c56e0a66a78df7ba5ae95b232e3c8477855d5"  # SGLang 0.5.13.post1's


class Harness:
    """The run's summary (``S``, saved atomically to OUT/summary.json), the time left before
    ``deadline`` seconds from ``t0``, a log line with the elapsed time, and ``run``: a command with its
    stdout/stderr in WORK/logs/<name>.{out,err} (``steps``: also recorded in S["steps"]). WORK is emptied
    first."""

    def __init__(self, out: Path, work: Path, deadline: float, t0: float, summary: dict, steps: bool = False):
        self.out, self.work, self.deadline, self.t0, self.S, self.steps = out, work, deadline, t0, summary, steps
        self.logs = work / "logs"
        # WORK is this run's scratch folder: a previous call's (a warm machine keeps /tmp) would make
        # every `--out` under it refuse its non-empty folder, and its logs would be packed as this run's
        import shutil

        shutil.rmtree(work, ignore_errors=True)
        for d in (out, work, self.logs):
            d.mkdir(parents=True, exist_ok=True)

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def save(self) -> None:
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.S, indent=1, default=str))
        os.replace(tmp, self.out / "summary.json")

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.t0)

    def log(self, m: str) -> None:
        print(f"[{self.now():6.1f}s] {m}", flush=True)

    def pack(self, extra: tuple = (), runs: Optional[Path] = None) -> None:
        """OUT/logs.tar.gz: WORK/logs, and each existing path of ``extra`` under its own name; OUT/runs.tar:
        the run folders under ``runs`` (when it exists), as ``runs/``."""
        import tarfile

        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tf:
            tf.add(self.logs, arcname="logs")
            for f in extra:
                if Path(f).exists():
                    tf.add(f, arcname=Path(f).name)
        if runs is not None and runs.is_dir():
            with tarfile.open(self.out / "runs.tar", "w") as tf:
                tf.add(runs, arcname="runs")

    def bench(self, name: str, py: str, env: dict, url: str, w: dict, n: int, conc: int,
              dest: Optional[Path] = None) -> dict:
        """``perfscope bench`` of ``n`` requests of workload ``w`` at ``conc``: its numbers and each request's
        TPOT (the whole JSON in ``dest``/bench.json when given and it ran)."""
        rc, so, se = self.run(name, [py, "-m", "perfscope", "bench", "--url", url, "--input-len", w["input_len"],
                                     "--output-len", w["output_len"], "--num-requests", n, "--concurrency", conc,
                                     "--warmup", 1, "--json"], timeout=150, env=env)
        b = parse_json(so, None) or {"rc": rc, "stderr": se[-600:]}
        if dest is not None and rc == 0:
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "bench.json").write_text(json.dumps(b, indent=1))
        r = {k: b.get(k) for k in ("tpot_ms", "itl_p50_ms", "ttft_ms", "requests", "failed", "throughput_tok_s",
                                   "rc", "stderr") if k in b}
        r["tpot_per_request"] = [round(q["tpot_ms"], 4) for q in b.get("per_request") or [] if q.get("tpot_ms")]
        return r | {"concurrency": conc}

    def trace(self, name: str, py: str, env: dict, url: str, w: dict, conc: int, dest: Path,
              bench_n: int = 0, extra: tuple = ()) -> dict:
        """``perfscope trace`` of 8 steps into ``dest`` (``bench_n`` > 0: the bench and the GPU-only
        host-timing profile first; ``extra``: more options, e.g. ``--no-stack``)."""
        args = ["trace", "--url", url, "--steps", 8, "--input-len", w["input_len"], "--output-len", w["output_len"],
                "--concurrency", conc, "--out", dest, "--timeout", 90, "--json", "--bench", bench_n] + \
               ([] if bench_n else ["--no-host-timing"]) + list(extra)
        rc, so, se = self.run(name, [py, "-m", "perfscope", *args], timeout=240, env=env)
        return {"rc": rc, "dir": str(dest), "stderr": se[-400:] if rc else ""}

    def run(self, name: str, argv: list, timeout: float = 120, env: Optional[dict] = None,
            margin: float = 5) -> tuple[int, str, str]:
        timeout = max(5.0, min(timeout, self.left() - margin))
        t = time.monotonic()
        try:
            r = subprocess.run([str(x) for x in argv], capture_output=True, text=True, timeout=timeout, env=env)
            rc, so, se = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            so = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, se = 124, "timeout"
        (self.logs / f"{name}.out").write_text(so)
        (self.logs / f"{name}.err").write_text(se)
        if self.steps:
            self.S.setdefault("steps", []).append({"name": name, "rc": rc, "s": round(time.monotonic() - t, 1),
                                                   "at_s": self.now()})
        self.log(f"{name}: rc {rc} in {time.monotonic() - t:.1f}s" + (f" | {se.strip()[-300:]}" if rc else ""))
        if self.steps:
            self.save()
        return rc, so, se


def install(payload: str, site: Path, env: dict, repo: Path, no_server: bool) -> tuple[Path, bytes, dict]:
    """Unpack the payload (and payload/site-extra.tar beside it) into ``site``; set ``env`` to run it
    (PYTHONPATH, FlashInfer arch, offline HF, the carried libnuma when the machine has none). Returns
    the pages patch's target file, its original bytes and the install record."""
    import shutil

    t = time.monotonic()
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    subprocess.run(["tar", "-xJf", payload, "-C", str(site)], check=True)
    extra = Path(payload).parent / "site-extra.tar"
    if extra.is_file():
        subprocess.run(["tar", "-xf", str(extra), "-C", str(site)], check=True)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(repo)])
    if no_server:  # CPU dry run: the carried set is cp312 and may not import here; perfscope from the repo
        env["PYTHONPATH"] = str(repo)
    env.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if subprocess.run(["sh", "-c", "ldconfig -p | grep -q 'libnuma.so.1 '"]).returncode != 0:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(site / "_h15lib"), env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    target = site / "sglang" / TARGET_REL
    original = target.read_bytes()
    sha = hashlib.sha256(original).hexdigest()
    rec = {"payload_sha256_16": hashlib.sha256(Path(payload).read_bytes()).hexdigest()[:16],
           "s": round(time.monotonic() - t, 1), "target": str(target), "target_sha256": sha,
           "target_is_recorded_original": sha == ORIG_SHA}
    return target, original, rec


def parse_json(text: str, default=None):
    """``text`` as JSON (a command's --json output), else ``default``."""
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return default


def healthy(port: int) -> bool:
    """Whether the server on 127.0.0.1:``port`` answers /health with 200 within 2 s."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


SERVER_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "FLASHINFER_CUDA_ARCH_LIST", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def restart_script(path: Path, argv: list, env: dict, pidfile: Path, log: Path, extra: Optional[dict] = None) -> Path:
    """Write ``path``: a ``--restart-cmd`` script that stops the server group recorded in ``pidfile``
    (TERM, up to 30 s, then KILL), starts ``argv`` in a new session with the install's environment
    (SERVER_ENV from ``env``, plus ``extra``), its output appended to ``log``, and records its pid."""
    import shlex

    extra = extra or {}
    envs = " ".join(f"{k}={shlex.quote(env[k])}" for k in SERVER_ENV if env.get(k))
    envs += "".join(f" {k}={shlex.quote(v)}" for k, v in extra.items())
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    path.write_text(f"""#!/bin/sh
p=$(cat {q(pidfile)} 2>/dev/null)
if [ -n "$p" ]; then
  kill -TERM -"$p" 2>/dev/null
  i=0; while kill -0 -"$p" 2>/dev/null && [ $i -lt 60 ]; do sleep 0.5; i=$((i+1)); done
  kill -KILL -"$p" 2>/dev/null; sleep 1
fi
echo "===== $(date -u +%FT%TZ) start {' '.join(extra)}" >> {q(log)}
env {envs} setsid {" ".join(shlex.quote(str(x)) for x in argv)} >> {q(log)} 2>&1 < /dev/null &
echo $! > {q(pidfile)}
""")
    return path


def stop_group(p: subprocess.Popen) -> None:
    """SIGTERM the process group ``p`` leads (a server started with start_new_session), then SIGKILL."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(8)
    except Exception:  # noqa: BLE001 - already gone, or it ignored TERM
        try:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
        except Exception:  # noqa: BLE001
            pass
