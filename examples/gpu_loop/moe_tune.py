"""Tune SGLang's fused-MoE Triton kernel for a DeepSeek-V2-Lite-shaped MoE (64 routed experts top-6,
2 shared, moe_intermediate 1408, hidden 2048) at the batch sizes 1, 16, 64, on this machine's GPU,
with the fix's tuner (fixes/untuned_fused_moe/tune_script.py) and the installed SGLang.

    python3 examples/gpu_loop/moe_tune.py --out $OUT [--budget-s 220]       # H200, SGLang in PYTHONPATH
    python3 examples/gpu_loop/moe_tune.py --out /tmp/o --device cpu --small  # dry mode: Triton's interpreter

Prints the file SGLang looks for (its own naming: E, N, device name, Triton version folder), what the
installed SGLang would load now (exact / fallback / default), the tuner's timings per batch (default
config vs best, microseconds per MoE layer call, both expert GEMMs) and its own wall time. OUT gets
``summary.json`` and the tuned config file under its SGLang name; nothing is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from perfscope.analysis.moe_config import LOADER_RELDIR, config_file_name, lookup, version_dir  # noqa: E402

V2_LITE = {"E": 64, "N": 1408, "hidden": 2048, "topk": 6}
SMALL = {"E": 4, "N": 64, "hidden": 128, "topk": 2}


def _facts(python: str, device: str) -> dict:
    code = ("import json, os, triton, torch, sglang\n"
            "d = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'\n"
            "print(json.dumps({'triton': triton.__version__, 'device_name': d, 'torch': torch.__version__,\n"
            "  'sglang_root': os.path.dirname(sglang.__file__)}))\n")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a tiny shape (dry mode on CPU)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--budget-s", type=float, default=220.0)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = SMALL if a.small else V2_LITE
    env = dict(os.environ)
    extra = []
    if a.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        extra = ["--iters", "1", "--max-candidates", "2"]
        batches = "1,4" if a.small else a.batches
    else:
        batches = a.batches
    t0 = time.monotonic()
    facts = _facts(a.python, a.device)
    summary: dict = {"shape": shape, "batches": batches, "facts": facts}
    if "error" not in facts:
        dev = facts["device_name"]
        name = config_file_name(shape["E"], shape["N"], dev)
        folder = Path(os.environ.get("SGLANG_MOE_CONFIG_DIR") or Path(facts["sglang_root"]) / LOADER_RELDIR) / "configs"
        dirs = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        kind, where = lookup(dirs, lambda d, n: (folder / d / n).is_file(), name, facts["triton"])
        summary.update(config_file=name, sglang_looks_in=str(folder / version_dir(facts["triton"])),
                       installed_now={"kind": kind, "folder": where})
        print(f"SGLang looks for {folder / version_dir(facts['triton']) / name}: {kind}"
              + (f" (from {where})" if where else ""), flush=True)
    else:
        name = "tuned.json"
    cmd = [a.python, str(REPO / "fixes/untuned_fused_moe/tune_script.py"), "--E", str(shape["E"]), "--N", str(shape["N"]),
           "--hidden", str(shape["hidden"]), "--topk", str(shape["topk"]), "--batches", batches,
           "--budget-s", str(a.budget_s), "--device", a.device, "--out", str(out / name), *extra]
    summary["tune_command"] = cmd
    t1 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.budget_s + 300)
    summary["tune_wall_s"] = round(time.monotonic() - t1, 1)
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res = {"ok": False, "rc": r.returncode, "stderr_tail": (r.stderr or "")[-2000:]}
    summary["tune"] = res
    for m, v in (res.get("per_batch") or {}).items():
        d, b = v.get("default_us"), v.get("best_us")
        sp = f"{d / b:.2f}x" if d and b else "-"
        print(f"batch {m:>3}: default {d} us, best {b} us ({sp}), {v.get('tried')} tried, {v.get('failed')} failed; "
              f"best {v.get('best')}", flush=True)
    summary["total_wall_s"] = round(time.monotonic() - t0, 1)
    print(f"tuning {summary['tune_wall_s']} s (bound {a.budget_s} s), total {summary['total_wall_s']} s; "
          f"ok={res.get('ok')} {res.get('reason') or ''}", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
