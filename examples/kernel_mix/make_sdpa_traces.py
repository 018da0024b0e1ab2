"""A real Kineto trace of torch SDPA on the cuDNN backend (decode and prefill shapes), with CUDA-event timings.

    PYTHONUNBUFFERED=1 python3 examples/kernel_mix/make_sdpa_traces.py --out DIR [--deadline S]
    python3 examples/kernel_mix/make_sdpa_traces.py --out DIR --device cpu --small   # dry run (math backend)

Every call is ``torch.nn.functional.scaled_dot_product_attention`` in eager mode under
``torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`` (no fallback: a shape cuDNN refuses
raises, and is recorded as refused), bf16, head dim 128, 32 query heads over 8 KV heads (GQA via
``enable_gqa=True``; where cuDNN refuses that, the KV heads expanded to 32 and the case says so):

- decode: one query token per request, KV length 1k/4k/16k/32k, batch 1/8/64 (not causal);
- prefill: batch 2, 4096 query tokens over 4096 keys, causal.

Written files:

- ``sdpa_cudnn.json.gz``: each shape one ``record_function`` range named after it (``sdpa_cudnn decode
  b=8 kv=4096``) holding 3 SDPA calls (inputs made before the profiler, so the only GPU work in the
  trace is what the SDPA calls launch); ``record_shapes`` on. ``prof.step()`` runs after each shape,
  but with no ``schedule`` torch writes no ``ProfilerStep#N`` range: perfscope reads the trace as one
  whole-trace step.
- ``sdpa_timings.json``: environment (GPU, torch, cuDNN version), per shape the backend used, the
  CUDA-event median of 20 calls for cuDNN and for torch's default backend choice beside it, the
  KV bytes read and the achieved TB/s; which kernels cuDNN launched per shape (from the profiler).
- ``sdpa_log.txt``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

T0 = time.monotonic()
LOG: list[str] = []
OUT = Path(".")

HQ, HKV, D = 32, 8, 128
DECODE_KV = (1024, 4096, 16384, 32768)
DECODE_B = (1, 8, 64)
PREFILL = (2, 4096)  # batch, tokens
CALLS_PER_STEP = 3
TIMED = 20


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)
    try:
        (OUT / "sdpa_log.txt").write_text("\n".join(LOG) + "\n")
    except OSError:
        pass


def make_inputs(dev, b, sq, skv, gqa: bool, dt=torch.bfloat16):
    g = torch.Generator(device=dev).manual_seed(0)
    hk = HKV if gqa else HQ
    q = torch.randn(b, HQ, sq, D, generator=g, device=dev, dtype=dt)
    k = torch.randn(b, hk, skv, D, generator=g, device=dev, dtype=dt)
    v = torch.randn(b, hk, skv, D, generator=g, device=dev, dtype=dt)
    return q, k, v


def call(q, k, v, causal: bool, gqa: bool):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def cuda_median(fn, n=TIMED, warm=3) -> dict:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ts = [a.elapsed_time(b) for a, b in evs]
    return {"median_ms": round(statistics.median(ts), 5), "min_ms": round(min(ts), 5),
            "ms": [round(x, 5) for x in ts]}


def kernels_per_case(ev: list) -> dict:
    """{record_function name: {GPU activity name: count}}: each kernel/memset joined to its launch
    (runtime or driver API: cuDNN launches through cuLaunchKernel) by correlation id, and the launch
    to the ``sdpa_cudnn ...`` range it falls in."""
    ranges = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev if e.get("ph") == "X"
              and e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("sdpa_cudnn ")]
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("ph") == "X"
              and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    per: dict = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"):
            ts = launch.get(e.get("args", {}).get("correlation"))
            name = next((n for a0, a1, n in ranges if ts is not None and a0 <= ts <= a1), "(outside)")
            key = e["name"] if e["cat"] == "kernel" else f"[{e['cat']}] {e['name']}"
            per.setdefault(name, Counter())[key] += 1
    return {k: dict(v) for k, v in per.items()}


def main() -> int:
    global OUT, DECODE_KV, DECODE_B, PREFILL
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds; later shapes are skipped")
    ap.add_argument("--small", action="store_true", help="CPU-sized shapes for a dry run")
    a = ap.parse_args()
    if a.small:
        DECODE_KV, DECODE_B, PREFILL = (64, 256), (1, 2), (1, 128)
    OUT = Path(a.out)
    OUT.mkdir(parents=True, exist_ok=True)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = SDPBackend.CUDNN_ATTENTION if cuda else SDPBackend.MATH
    res: dict = {"what": __doc__.split("\n")[0],
                 "shapes": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D, "dtype": "bfloat16",
                            "decode_kv": list(DECODE_KV), "decode_batch": list(DECODE_B),
                            "prefill": {"batch": PREFILL[0], "tokens": PREFILL[1], "causal": True}},
                 "env": {"torch": torch.__version__, "python": sys.version.split()[0]},
                 "backend": str(backend), "cases": []}
    if cuda:
        res["env"].update(gpu=torch.cuda.get_device_name(0), cc=list(torch.cuda.get_device_capability(0)),
                          cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())

    def save():
        (OUT / "sdpa_timings.json").write_text(json.dumps(res, indent=1))

    cases = [dict(name=f"decode b={b} kv={s}", phase="decode", b=b, sq=1, skv=s, causal=False)
             for s in DECODE_KV for b in DECODE_B]
    cases.append(dict(name=f"prefill b={PREFILL[0]} q={PREFILL[1]} kv={PREFILL[1]} causal", phase="prefill",
                      b=PREFILL[0], sq=PREFILL[1], skv=PREFILL[1], causal=True))

    # 1. which shapes the backend takes (GQA first, KV heads expanded where GQA is refused), timings
    runnable = []
    for c in cases:
        if a.deadline - (time.monotonic() - T0) < 40:
            c["skipped"] = "deadline"
            res["cases"].append(c)
            continue
        for gqa in (True, False):
            try:
                q, k, v = make_inputs(dev, c["b"], c["sq"], c["skv"], gqa)
                with sdpa_kernel([backend]):
                    call(q, k, v, c["causal"], gqa)
                if cuda:
                    torch.cuda.synchronize()
                c["gqa"] = "enable_gqa" if gqa else "kv heads expanded to 32 (enable_gqa refused)"
                break
            except Exception as e:  # noqa: BLE001
                c.setdefault("refused", []).append(f"gqa={gqa}: {type(e).__name__}: {str(e)[:400]}")
                q = k = v = None
        if q is None:
            log(f"{c['name']}: refused by {backend}: {c['refused']}")
            res["cases"].append(c)
            save()
            continue
        hk = k.shape[1]
        c["kv_bytes"] = 2 * c["b"] * hk * c["skv"] * D * 2
        c["q_o_bytes"] = 2 * c["b"] * HQ * c["sq"] * D * 2
        if cuda:
            with sdpa_kernel([backend]):
                c["cudnn"] = cuda_median(lambda: call(q, k, v, c["causal"], gqa))  # noqa: B023 (timed at once)
            try:
                c["default_backend"] = cuda_median(lambda: call(q, k, v, c["causal"], gqa))  # noqa: B023 (timed at once)
            except Exception as e:  # noqa: BLE001
                c["default_backend"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            t = c["cudnn"]["median_ms"] / 1e3
            c["cudnn_tb_s"] = round((c["kv_bytes"] + c["q_o_bytes"]) / t / 1e12, 3)
            if c["phase"] == "prefill":
                fl = 4 * c["b"] * HQ * c["sq"] * c["skv"] * D / 2  # causal: half the score matrix
                c["cudnn_tflop_s"] = round(fl / t / 1e12, 1)
            log(f"{c['name']} ({c['gqa']}): cudnn {c['cudnn']['median_ms']} ms "
                f"({c['cudnn_tb_s']} TB/s), default {c['default_backend'].get('median_ms')} ms")
        runnable.append((c, q, k, v, gqa))
        res["cases"].append(c)
        save()

    # 2. the trace: one ProfilerStep per shape, 3 SDPA calls each inside a record_function
    from torch.profiler import ProfilerActivity, profile, record_function
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    raw = OUT / "sdpa_cudnn.json"
    try:
        with sdpa_kernel([backend]):
            for c, q, k, v, gqa in runnable:  # warm, outside the profiler
                call(q, k, v, c["causal"], gqa)
            if cuda:
                torch.cuda.synchronize()
            with profile(activities=acts, record_shapes=True, with_stack=False) as prof:
                for c, q, k, v, gqa in runnable:
                    with record_function(f"sdpa_cudnn {c['name']}"):
                        for _ in range(CALLS_PER_STEP):
                            call(q, k, v, c["causal"], gqa)
                    if cuda:
                        torch.cuda.synchronize()
                    prof.step()
        prof.export_chrome_trace(str(raw))
        res["kernels_per_case"] = kernels_per_case(json.loads(raw.read_text())["traceEvents"])
        per = res["kernels_per_case"]
        with open(raw, "rb") as f, gzip.open(OUT / "sdpa_cudnn.json.gz", "wb", compresslevel=9) as g:
            shutil.copyfileobj(f, g)
        raw.unlink()
        res["trace_bytes_gz"] = (OUT / "sdpa_cudnn.json.gz").stat().st_size
        log(f"wrote sdpa_cudnn.json.gz: {res['trace_bytes_gz']} bytes gz; kernels: "
            f"{sorted({n for v in per.values() for n in v})}")
    except Exception:  # noqa: BLE001
        res["trace_error"] = traceback.format_exc()[-2000:]
        log(res["trace_error"])
    res["total_s"] = round(time.monotonic() - T0, 1)
    save()
    log(f"done in {res['total_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
