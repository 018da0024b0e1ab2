"""`perfscope demo`: the whole loop on this machine, on the reproduction server (CPU by default).

Start the MLA decode server with the FP8 KV whole-pool cast (a scratch copy, so the patch never
touches the shipped source) -> bench it -> trace it -> diagnose -> fix fp8-kv-cast --apply on the
copy -> restart -> bench and trace again -> diagnose -> compare (HTML). Every step is the real
`perfscope` command, run as a child process, so the demo shows exactly what a user would type.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Optional

from rich.console import Console

from perfscope.errors import InputError, PerfscopeError, RemoteError
from perfscope.util.files import atomic_write_text, resource_dir, user_path

_LISTEN = re.compile(r"listening on (http://\S+)")


@dataclass
class DemoConfig:
    out: Path
    device: str = "cpu"
    layers: int = 4
    pool_tokens: int = 32768
    # one torch CPU thread: the demo's server, its load and perfscope share the machine (2 cores in CI); with
    # torch's default of one thread per core every parallel op waits at OpenMP's barrier for a sibling
    # thread the OS has descheduled, so the server's ops ran 10-100x slower after each CPU-hungry cast
    # (a 0.04 ms matmul took 18-25 ms, 9.5 ms of it CPU time spinning) and the fixed server's step
    # was a tenth of what the bug trace's other ops promised
    threads: int = 1
    input_len: int = 32
    output_len: int = 8
    requests: int = 3  # 3 a side: the fewest a before/after interval is drawn from
    steps: int = 4
    strategy: str = "auto"
    extra_server_args: list[str] = field(default_factory=list)


def read_server_url(proc: subprocess.Popen, timeout: float) -> Optional[str]:
    """The URL the reproduction server prints once it serves (``repro_server listening on
    http://HOST:PORT``), read from its stdout; None if it exits or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.stdout is not None:
        line = proc.stdout.readline()
        if isinstance(line, bytes):
            line = line.decode(errors="replace")
        if not line:
            if proc.poll() is not None:
                return None
            continue
        m = _LISTEN.search(line)
        if m:
            return m.group(1)
    return None


class Server:
    """The reproduction server as a child process, started from the scratch copy."""

    def __init__(self, root: Path, args: list[str], log: Path):
        self.root, self.args, self.log = root, args, log
        self.proc: Optional[subprocess.Popen] = None
        self.url: Optional[str] = None

    def start(self, timeout: float = 120.0) -> str:
        logf = open(self.log, "ab")
        # glibc maps every allocation above its mmap threshold (at most 32 MB) afresh and unmaps it when freed:
        # the bug's 37 MB BF16 copy of the pool then cost a page fault per 4 KB and a 3-5 ms munmap per layer,
        # outside any op (CUDA's caching allocator on a GPU server does neither). Large allocations from the
        # heap, kept: the CPU server pays for the cast itself, as a GPU one does.
        env = dict(
            os.environ, PYTHONUNBUFFERED="1", MALLOC_MMAP_THRESHOLD_=str(1 << 32), MALLOC_TRIM_THRESHOLD_=str(1 << 32)
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.repro_server", "--port", "0", *self.args],
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=logf,
            env=env,
            start_new_session=True,
        )
        self.url = read_server_url(self.proc, timeout)
        if self.url:
            # keep draining stdout so the server never blocks on a full pipe
            import threading

            threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
            return self.url
        self.stop()
        raise RemoteError(f"the reproduction server did not start (see {self.log})")

    @staticmethod
    def _drain(stream: Optional[IO[bytes]]) -> None:
        if stream is None:
            return
        try:
            for _ in iter(stream.readline, b""):
                pass
        except (ValueError, OSError):
            pass

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _perfscope(args: list[str], console: Console, capture_json: bool = True) -> dict:
    """Run one `perfscope` command as the user would; return its --json output."""
    cmd = [sys.executable, "-m", "perfscope", *args]
    import shlex

    from rich.text import Text

    # one line however long (a command folded at 80 columns in a log cannot be pasted back)
    console.print(Text("$ perfscope " + shlex.join(args), style="dim"), soft_wrap=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode not in (0, 1):
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise PerfscopeError(f"`perfscope {args[0]}` failed in the demo: {last}")
    if not capture_json:
        console.file.write(r.stdout)  # what the user would see (stderr when the demo prints --json)
        console.file.flush()
        return {}
    try:
        return json.loads(r.stdout)
    except ValueError:
        raise PerfscopeError(f"`perfscope {args[0]}` printed no JSON in the demo") from None


def diff_stat(diff: str) -> tuple[int, int, int]:
    """(lines added, lines removed, hunks) of a unified diff."""
    added = removed = hunks = 0
    for line in diff.splitlines():
        if line.startswith("@@"):
            hunks += 1
        elif line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed, hunks


def patch_summary(check: dict, diff_path: Path) -> str:
    """A few lines in place of the whole diff: what is patched, with which strategy and why, how
    big the change is, and where the full diff lies."""
    a, r, h = diff_stat(check.get("diff") or "")
    lines = [
        f"{check.get('outcome')}: {check.get('target')} {check.get('path')}"
        + (f" (variant {check['variant']})" if check.get("variant") else ""),
        f"strategy {check.get('strategy')}" + (f": {check['strategy_reason']}" if check.get("strategy_reason") else ""),
        f"patch: +{a} -{r} lines in {h} hunk{'s' if h != 1 else ''}; full diff: {diff_path}",
    ]
    return "\n".join(lines)


def copy_server(dest: Path) -> Path:
    """A scratch copy of examples/repro_server under dest/server; returns the attention module."""
    src = resource_dir("examples") / "repro_server"
    root = dest / "server"
    pkg = root / "examples" / "repro_server"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    init = pkg.parent / "__init__.py"
    if not init.exists():
        init.write_text("")
    return pkg / "mla_attention.py"


def run_demo(cfg: DemoConfig, console: Console) -> dict:
    t0 = time.monotonic()
    out = user_path(cfg.out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out}: folder exists and is not empty; pass --out to a new folder")
    out.mkdir(parents=True, exist_ok=True)
    target = copy_server(out)
    args = [
        "--device",
        cfg.device,
        "--num-layers",
        str(cfg.layers),
        "--max-total-tokens",
        str(cfg.pool_tokens),
        "--threads",
        str(cfg.threads),
        *cfg.extra_server_args,
    ]
    server = Server(target.parents[2], args, out / "server.log")
    bench_args = [
        "--input-len",
        str(cfg.input_len),
        "--output-len",
        str(cfg.output_len),
        "--num-requests",
        str(cfg.requests),
        "--warmup",
        "1",
        "--json",
    ]
    trace_args = [
        "--steps",
        str(cfg.steps),
        "--input-len",
        str(cfg.input_len),
        "--output-len",
        str(cfg.steps + 4),
        "--timeout",
        "120",
        "--json",
    ]
    before, after = out / "before", out / "after"
    try:
        console.rule("[bold]1. the server as shipped: FP8 KV pool cast to BF16 on every layer")
        url = server.start()
        console.print(
            f"reproduction server on {url} ({cfg.layers} layers, {cfg.pool_tokens:,}-token FP8 pool, {cfg.device})"
        )
        _perfscope(["trace", "--url", url, "--out", str(before), *trace_args], console)
        b_bench = _perfscope(["bench", "--url", url, "--out", str(before), *bench_args], console)
        diag_b = _perfscope(["diagnose", str(before), "--json"], console)
        top = diag_b["findings"][0] if diag_b.get("findings") else None
        if top:
            console.print(f"[bold red]{top['id']}[/]: {top['summary']}")
        if not top or top["id"] != "fp8-kv-cast":
            raise PerfscopeError("the demo's diagnosis did not find fp8-kv-cast; see " + str(before))

        console.rule("[bold]2. fix it: check and diff, then apply (backup + manifest)")
        check = _perfscope(
            ["fix", "fp8-kv-cast", "--target-file", str(target), "--url", url, "--strategy", cfg.strategy, "--json"],
            console,
        )
        diff_path = out / "fix.diff"
        atomic_write_text(diff_path, check.get("diff") or "", shared=True)
        console.print(patch_summary(check, diff_path))
        fixed = _perfscope(
            [
                "fix",
                "fp8-kv-cast",
                "--target-file",
                str(target),
                "--url",
                url,
                "--strategy",
                cfg.strategy,
                "--apply",
                "--json",
            ],
            console,
        )
        server.stop()

        console.rule("[bold]3. restart, re-measure, trace again")
        url = server.start()
        _perfscope(["trace", "--url", url, "--out", str(after), *trace_args], console)
        a_bench = _perfscope(["bench", "--url", url, "--out", str(after), *bench_args], console)
        diag_a = _perfscope(["diagnose", str(after), "--json"], console)
    finally:
        server.stop()

    console.rule("[bold]4. compare")
    html = out / "compare.html"
    cmp = _perfscope(["compare", str(before), str(after), "--html", str(html), "--json"], console)
    tb, ta = b_bench.get("tpot_ms"), a_bench.get("tpot_ms")
    summary = {
        "tpot_ms_before": tb,
        "tpot_ms_after": ta,
        "speedup": (tb / ta) if tb and ta else None,
        "predicted_step_ms_after_fix": top.get("predicted_step_ms_after_fix"),
        "step_ms_before": diag_b["steps"]["median_ms"],
        "step_ms_after": diag_a["steps"]["median_ms"],
        "findings_before": [f["id"] for f in diag_b["findings"]],
        "findings_after": [f["id"] for f in diag_a["findings"]],
        "fix": {k: fixed.get(k) for k in ("outcome", "strategy", "target", "path") if k in fixed},
        "compare": {k: cmp.get(k) for k in ("step", "tpot") if k in cmp},
        "change": cmp.get("change") or {},  # the noise: spreads, intervals, verdicts (analysis/change.py)
        "predictions": cmp.get("predictions") or [],
        "diff": str(out / "fix.diff"),
        "html": str(html),
        "before": str(before),
        "after": str(after),
        "seconds": round(time.monotonic() - t0, 1),
    }
    atomic_write_text(out / "demo.json", json.dumps(summary, indent=2, default=str), shared=True)
    return summary
