"""Plumbing of the GPU loop: the Loop state, commands run and recorded, phases, and the small helpers
every phase uses."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import traceback
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
T0 = time.monotonic()
MAX_OUT_FILE = 15 * 1024 * 1024  # the device tool brings back files of at most 16 MiB


def now_s() -> float:
    return round(time.monotonic() - T0, 1)

class LoopBase:
    def __init__(self, args):
        self.a = args
        self.work = Path(args.work)
        self.out = Path(args.out)
        self.logs = self.work / "logs"
        self.runs = self.work / "runs"
        for d in (self.work, self.out, self.logs, self.runs):
            d.mkdir(parents=True, exist_ok=True)
        self.summary: dict = {"started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "argv": sys.argv, "phases": {}, "commands": []}
        if args.from_summary:
            self.summary = json.loads(Path(args.from_summary).read_text())
            self.summary.setdefault("reanalysed", []).append(
                {"at_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv})
        self.server: subprocess.Popen | None = None
        self.py = sys.executable
        self.cuda = args.device.startswith("cuda")

    # ------------------------------------------------------------------ plumbing
    def left(self) -> float:
        return self.a.deadline - (time.monotonic() - T0)

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str) + "\n")

    def sh(self, name: str, argv: list[str], *, timeout: float = 300, cwd: Path = REPO, env: dict | None = None,
           check: bool = False) -> subprocess.CompletedProcess:
        """Run a command, its stdout/stderr into logs/<name>.{out,err}; recorded in the summary."""
        timeout = max(5.0, min(timeout, self.left() - 5))
        t = time.monotonic()
        rec = {"name": name, "argv": [str(x) for x in argv], "at_s": now_s()}
        try:
            p = subprocess.run([str(x) for x in argv], cwd=cwd, env=env, capture_output=True, text=True,
                               timeout=timeout)
        except OSError as e:
            p = subprocess.CompletedProcess(argv, 127, "", f"[run_loop] {e}")
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            p = subprocess.CompletedProcess(argv, 124, out, err + f"\n[run_loop] timed out after {timeout:.0f}s")
        (self.logs / f"{name}.out").write_text(p.stdout or "")
        (self.logs / f"{name}.err").write_text(p.stderr or "")
        rec.update(rc=p.returncode, seconds=round(time.monotonic() - t, 1))
        if p.returncode != 0:
            rec["stderr_tail"] = (p.stderr or "")[-1500:]
        self.summary["commands"].append(rec)
        print(f"[{now_s():6.1f}s] {name}: rc {p.returncode} in {rec['seconds']}s", flush=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"{name} failed (rc {p.returncode}): {(p.stderr or '')[-800:]}")
        return p

    def phase(self, name: str, fn, min_left: float = 20) -> None:
        if name not in self.a.phases:
            return
        if self.left() < min_left:
            self.summary["phases"][name] = {"status": "skipped", "reason": f"deadline ({self.left():.0f}s left)"}
            self.save()
            return
        t = time.monotonic()
        print(f"[{now_s():6.1f}s] === phase {name}", flush=True)
        try:
            fn()
            st = {"status": "ok"}
        except Exception as e:  # noqa: BLE001 - recorded; later phases run where they can
            st = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            print(f"[{now_s():6.1f}s] phase {name} FAILED: {e}", flush=True)
        st["seconds"] = round(time.monotonic() - t, 1)
        self.summary["phases"][name] = st
        self.save()

    def perfscope(self, name: str, *args, timeout: float = 300, check: bool = False):
        return self.sh(name, [self.py, "-m", "perfscope", *args], timeout=timeout, check=check)

# ---------------------------------------------------------------------- helpers


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _json_or(text: str, default):
    text = (text or "").strip()
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        i = text.find("{")
        try:
            return json.loads(text[i:]) if i >= 0 else default
        except ValueError:
            return default


def _get_json(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except Exception:  # noqa: BLE001
        return {}


def _prefix(a: list, b: list) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return f"{n}/{min(len(a), len(b))}"


def _tpot(rec: dict):
    b = rec.get("bench") or {}
    v = b.get("tpot_ms")
    return round(v, 3) if isinstance(v, (int, float)) else None
