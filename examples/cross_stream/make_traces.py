"""Real Kineto traces of a step whose critical path crosses streams (cudaEventRecord / cudaStreamWaitEvent).

    python3 examples/cross_stream/make_traces.py --out DIR          # on a CUDA GPU

The step, eager, as a rank with its collective on a side stream runs it:

    main stream:  pre (P matmuls)  -> record e1 -> independent work (8 matmuls 4096) -> wait e2 -> post
    side stream:  wait e1 -> "collective" -> record e2

The "collective" is ``torch.cuda._sleep``: one thread that spins for a set number of cycles, on one
SM, as an NCCL kernel holds a few SMs and waits on its peers (a matmul there would take every SM
and serialise the streams: contention, not a dependency).

Variants (each a pair of gzipped chrome traces, 5 ``ProfilerStep#N`` steps, and CUDA-event step times):

- ``base``: pre 4 x 4096, collective 3 ms (the side stream is the critical path)
- ``side_short``: the collective cut to 0.3 ms (the "faster all-reduce"): the step is then bound by
  the main stream's independent work
- ``pre_short``: the pre work shrunk to 4 x 1024: the collective starts earlier (it waits on e1)

Each variant is written twice: ``<v>.json.gz`` as torch.profiler writes it by default (runtime calls
only: which stream records or waits is not in the trace), and ``<v>_sync.json.gz`` with
``enable_cuda_sync_events`` (Kineto's ``cuda_sync`` events: ``wait_on_stream`` and
``wait_on_cuda_event_record_corr_id``). ``timings.json``: CUDA-event medians of 30 unprofiled steps.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import torch

VARIANTS = {"base": (4, 4096, 3.0), "side_short": (4, 4096, 0.3), "pre_short": (4, 1024, 3.0)}
IND = (8, 4096)  # the main stream's independent work


def cycles_per_ms() -> float:
    torch.cuda._sleep(1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(20_000_000)
    b.record()
    torch.cuda.synchronize()
    return 20_000_000 / a.elapsed_time(b)


def make_step(p_n, p_size, side_ms, cpm):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def mk(n):
        return torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g) / n ** 0.5

    pa, pb = mk(p_size), mk(p_size)
    cycles = int(side_ms * cpm)
    y = torch.zeros(2048, 2048, device=dev, dtype=torch.bfloat16)
    ia, ib = mk(IND[1]), mk(IND[1])
    pw = mk(2048)
    side = torch.cuda.Stream()
    e1, e2 = torch.cuda.Event(), torch.cuda.Event()

    def step():
        x = pa
        for _ in range(p_n):
            x = x @ pb
        e1.record()  # on the main stream
        with torch.cuda.stream(side):
            side.wait_event(e1)
            torch.cuda._sleep(cycles)
            e2.record(side)
        z = ia
        for _ in range(IND[0]):
            z = z @ ib
        torch.cuda.current_stream().wait_event(e2)
        out = (y[:2048, :2048] + z[:2048, :2048] + x[:1, :1]) @ pw
        return out @ pw

    return step


def time_steps(step, n=30):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts)}


def profile(step, path: Path, sync_events: bool):
    from torch.profiler import ProfilerActivity, profile as prof, schedule

    kw = {}
    if sync_events:
        kw["experimental_config"] = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
              schedule=schedule(wait=1, warmup=1, active=5), **kw) as p:
        for _ in range(7):
            step()
            torch.cuda.synchronize()  # one step per ProfilerStep, as a training loop's step ends
            p.step()
    raw = path.with_suffix("")  # .json
    p.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, gzip.open(path, "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cpm = cycles_per_ms()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "variants": {}, "independent": IND,
           "sleep_cycles_per_ms": round(cpm)}
    for name, shape in VARIANTS.items():
        step = make_step(*shape, cpm)
        res["variants"][name] = {"pre": shape[:2], "collective_ms": shape[2], "cuda_events": time_steps(step)}
        profile(step, a.out / f"{name}.json.gz", False)
        profile(step, a.out / f"{name}_sync.json.gz", True)
        print(name, res["variants"][name], flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    (a.out / "timings.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
