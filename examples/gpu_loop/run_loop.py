"""The whole perfscope loop on one GPU machine, in one command.

    python3 examples/gpu_loop/run_loop.py --out DIR [--phases env,patch,stepbench,loop] [--deadline 500]
    python3 examples/gpu_loop/run_loop.py --out DIR --small --device cpu      # the same loop, CPU-sized
    python3 examples/gpu_loop/run_loop.py --engine sglang --payload site.tar.xz --out DIR   # a real SGLang

The phases live in gpuloop/ (one module each: install, fix, bench, serve, trace, diagnose, compare,
results; sglang_real for ``--engine sglang``, whose loop README.md describes).

Run from the repository root, with perfscope importable (PYTHONPATH=$PWD) and, on a GPU, FlashInfer.
README.md beside this file has the device command and the measured table.

Phases (each one's failure is recorded in summary.json and the next phases still run where they can):

* ``env``: GPU, driver, python / torch / FlashInfer / Triton versions.
* ``patch``: ``perfscope fix fp8-kv-cast --apply --strategy native|pages`` on throw-away copies of
  examples/repro_server/mla_attention.py, to give stepbench the exact patched modules.
* ``stepbench``: examples/repro_server/stepbench.py at full size (eager and CUDA graph): the fixed
  variants pool/pages/fp8 and the two patched modules, step time and logits against the cast path.
* ``loop``: start the repro server (CUDA graphs, FP8 pool) from a scratch copy of
  examples/repro_server, ``perfscope bench`` + ``trace --url`` + ``diagnose`` it; then for each
  strategy ``perfscope fix fp8-kv-cast --target-file <copy>/mla_attention.py --apply --strategy S``,
  restart, bench, trace, diagnose, ``--revert``; ``perfscope compare`` bug vs each fix (HTML).

Everything lands in ``--work`` (default /tmp/gpuloop); ``--out`` gets at most 8 files: summary.json,
table.md, traces.tar, report-bug.html, compare-native.html, compare-pages.html, logs.tar.gz and, when
FlashInfer compiled its kernels in this run, fi-jit-cache.tar.gz (put it in .gpuloop-carry/ and the
next run skips the ~45 s JIT per kernel).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuloop.base import LoopBase, now_s
from gpuloop.bench import BenchMixin
from gpuloop.compare import CompareMixin
from gpuloop.diagnose import DiagnoseMixin
from gpuloop.fix import FixMixin
from gpuloop.install import InstallMixin
from gpuloop.results import ResultsMixin
from gpuloop.serve import ServeMixin
from gpuloop.sglang_real import SglangMixin, sg_main
from gpuloop.trace import TraceMixin


class Loop(InstallMixin, FixMixin, BenchMixin, ServeMixin, TraceMixin, DiagnoseMixin, CompareMixin, ResultsMixin,
           LoopBase):
    """The repro-server loop: every phase from its module (gpuloop/)."""


class SglangLoop(SglangMixin, LoopBase):
    """--engine sglang: the loop against a real SGLang (gpuloop/sglang_real.py)."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run_loop.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where the (at most 8) result files go ($OUT on the device)")
    p.add_argument("--work", default="/tmp/gpuloop")
    p.add_argument("--phases", default="jit,env,patch,stepbench,loop",
                   help="comma-separated; 'analyse' re-diagnoses and compares run folders already in --work")
    p.add_argument("--from-summary", help="start from this summary.json (with --phases analyse)")
    p.add_argument("--strategies", default="native,pages")
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="CPU-sized model and pool (for a dry run without a GPU)")
    p.add_argument("--deadline", type=float, default=500, help="seconds: no new phase starts after this")
    p.add_argument("--port", type=int, default=30123)
    p.add_argument("--flashinfer-backend", default="fa2")
    p.add_argument("--pool-tokens", type=int, default=495_000)
    p.add_argument("--context", type=int, default=4096, help="stepbench context")
    p.add_argument("--steps", type=int, default=20, help="stepbench timed steps")
    p.add_argument("--input-len", type=int, default=4000)
    p.add_argument("--trace-output-len", type=int, default=64)
    p.add_argument("--trace-steps", type=int, default=20)
    p.add_argument("--bench-output-len", type=int, default=64)
    p.add_argument("--bench-requests", type=int, default=3)
    p.add_argument("--server-timeout", type=float, default=240)
    p.add_argument("--stepbench-timeout", type=float, default=300)
    p.add_argument("--min-fix-s", type=float, default=60, help="do not start a fix's round with less time left")
    g = p.add_argument_group("--engine sglang (a real SGLang from --payload)")
    g.add_argument("--engine", choices=("repro", "sglang"), default="repro")
    g.add_argument("--payload", help="tar.xz of the unpacked SGLang wheel set (README)")
    g.add_argument("--pools", default="495000,default",
                   help="comma-separated --max-total-tokens values; 'default' = SGLang's own pool size")
    g.add_argument("--shifted-pools", default="495000",
                   help="pools where a deliberately wrong copy of the patch is served too (the check must fail)")
    g.add_argument("--min-shifted-s", type=float, default=80,
                   help="do not start the shifted-index control server with less time left")
    g.add_argument("--mem-fraction", type=float, default=0.5, help="--mem-fraction-static of the SGLang server")
    g.add_argument("--default-pool-output-len", type=int, default=32, help="bench/trace tokens on the default pool")
    g.add_argument("--default-pool-requests", type=int, default=3)
    a = p.parse_args(argv)
    a.phases = set(a.phases.split(","))
    a.strategies = [s for s in a.strategies.split(",") if s]
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(Path(a.work) / "fiws"))
    if a.engine == "sglang":
        return sglang(a)
    lp = Loop(a)
    try:
        lp.phase("jit", lp.restore_jit_cache)
        lp.phase("env", lp.env)
        lp.phase("patch", lp.patch)
        lp.phase("stepbench", lp.stepbench, min_left=90)
        lp.phase("loop", lp.loop, min_left=120)
        lp.phase("analyse", lp.analyse, min_left=5)
    finally:
        lp.stop_server()
        try:
            lp.table()
        except Exception as e:  # noqa: BLE001
            lp.summary["table_error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
        lp.summary["total_s"] = now_s()
        lp.pack()
    failed = [k for k, v in lp.summary["phases"].items() if v.get("status") != "ok"]
    print(f"[{now_s():6.1f}s] done; phases not ok: {failed or 'none'}", flush=True)
    return 1 if failed else 0


def sglang(a) -> int:
    a.phases = {"install", "checkpoint", "loop"}
    a.pools = [x for x in a.pools.split(",") if x]
    a.shifted_pools = set(x for x in a.shifted_pools.split(",") if x)
    if a.input_len == 4000:  # the repro default; SGLang rows use 2000-token prompts (as the shared README's runs)
        a.input_len = 2000
    lp = SglangLoop(a)
    try:
        sg_main(lp)
    finally:
        try:
            lp.sg_stop()
        except Exception as e:  # noqa: BLE001
            lp.summary["stop_error"] = str(e)
        try:
            lp.sg_table()
        except Exception as e:  # noqa: BLE001
            lp.summary["table_error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
        lp.summary["total_s"] = now_s()
        lp.sg_pack()
    failed = [k for k, v in lp.summary["phases"].items() if v.get("status") != "ok"]
    failed += [f"pool {k}" for k, v in (lp.summary.get("pools") or {}).items() if v.get("error")]
    print(f"[{now_s():6.1f}s] done; not ok: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

