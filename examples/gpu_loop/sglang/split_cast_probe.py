"""Two GPU checks that need no SGLang install (torch + Triton of the machine only).

1. The decode-step cast of SGLang's FlashInfer MLA backend at SGLang's default FP8 pool on one
   H200 (`get_key_buffer(layer).to(torch.bfloat16)` over 15,728,043 rows x 576, 9.06e9 elements,
   8 layers), profiled with torch's profiler: eager (CPU ops with shapes) and replayed from one
   CUDA graph. torch splits each such cast into several launches (32-bit indexing), which is what
   perfscope's fp8-kv-cast rule must group. Writes split_cast_{eager,graph}.json.gz.
2. The pages patch's row conversion (`_perfscope_fp8kv_rows` of fixes/fp8_kv_cast/snippet.py),
   captured once in a CUDA graph and replayed with other indices and row counts: the converted
   rows must equal `pool[rows].to(bfloat16)` bit for bit; a copy whose row index is shifted by one
   must not. Writes rows_check.json.

    python3 split_cast_probe.py OUT_DIR REPO_ROOT [--rows-only] [NAME=SNIPPET.py ...]

NAME=SNIPPET.py: check these copies of the snippet too (e.g. an older revision); the default checks
REPO_ROOT's fixes/fp8_kv_cast/snippet.py and its shifted copy."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import time
import types

import torch

OUT, REPO = sys.argv[1], sys.argv[2]
ROWS_ONLY = "--rows-only" in sys.argv
EXTRA = [a.split("=", 1) for a in sys.argv[3:] if "=" in a]
ROWS, LAYERS, LAT = int(os.environ.get("SPLIT_CAST_ROWS", 15_728_043)), 8, 576  # SGLang allocates max_total_num_tokens + 1 rows (15,728,042 + 1)
res: dict = {"rows": ROWS, "layers": LAYERS, "latent": LAT, "torch": torch.__version__,
             "gpu": torch.cuda.get_device_name()}
t0 = time.time()


def gz(src: str, dst: str) -> None:
    with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    os.unlink(src)


# ---------------------------------------------------------------- 1. the split cast, traced
from torch.profiler import ProfilerActivity, profile, record_function, schedule  # noqa: E402

bufs = [] if ROWS_ONLY else [torch.empty((ROWS, 1, LAT), dtype=torch.float8_e4m3fn, device="cuda")
                             for _ in range(LAYERS)]
w = torch.randn(2048, 2048, dtype=torch.bfloat16, device="cuda") * 0.02
x0 = torch.randn(1, 2048, dtype=torch.bfloat16, device="cuda")
rows = torch.randint(0, ROWS, (2048,), device="cuda")


def step(x):
    for i in range(LAYERS):
        k = bufs[i].to(torch.bfloat16)  # what SGLang 0.5.13's forward_decode does per layer
        x = x @ w + k.view(ROWS, LAT).index_select(0, rows[:1])[:, :1].float().to(torch.bfloat16).sum()
    return x


for mode in () if ROWS_ONLY else ("eager", "graph"):
    if mode == "eager":
        step(x0)
        torch.cuda.synchronize()
    if mode == "graph":
        torch.cuda.empty_cache()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step(x0)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            y = step(x0)
        run = g.replay
    else:
        def run():
            return step(x0)
    ev = []
    p = os.path.join(OUT, f"split_cast_{mode}.json")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts, record_shapes=True, schedule=schedule(wait=0, warmup=1, active=4),
                 on_trace_ready=lambda pr, p=p: pr.export_chrome_trace(p)) as prof:
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            with record_function("decode_step"):
                run()
            b.record()
            torch.cuda.synchronize()
            ev.append(a.elapsed_time(b))
            prof.step()
    gz(p, p + ".gz")
    res[f"step_ms_{mode}"] = ev
    print(mode, "step ms", [round(v, 2) for v in ev], flush=True)
bufs = []  # frees the pool buffers before part 2
torch.cuda.empty_cache()

# ---------------------------------------------------------------- 2. the pages conversion under a CUDA graph
src = open(os.path.join(REPO, "fixes", "fp8_kv_cast", "snippet.py")).read()
LINE = "row = tl.load(idx + r, mask=rm, other=0).to(tl.int64)"
assert src.count(LINE) == 1


def load(text: str, name: str):
    path = os.path.join("/tmp", name + ".py")  # Triton reads the kernel's source from a file
    open(path, "w").write(text)
    m = types.ModuleType(name)
    m.__file__ = path
    exec(compile(text, path, "exec"), m.__dict__)
    return m


def rows_check(mod) -> dict:
    n_rows, cap, bs = 495_001, 16384, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    pool = torch.randint(0, 256, (n_rows, 1, LAT), dtype=torch.uint8, device="cuda", generator=gen)
    pool = pool.masked_fill((pool & 127) == 127, 0).view(torch.float8_e4m3fn)  # no NaN bytes
    idx = torch.zeros(cap, dtype=torch.int32, device="cuda")
    indptr = torch.zeros(bs + 1, dtype=torch.int32, device="cuda")
    mod._PERFSCOPE_FP8KV_SCRATCH.clear()
    g = torch.cuda.CUDAGraph()
    out = mod._perfscope_fp8kv_rows(pool, torch.bfloat16, idx, indptr, bs)  # warm-up (compiles)
    with torch.cuda.graph(g):
        out = mod._perfscope_fp8kv_rows(pool, torch.bfloat16, idx, indptr, bs)
    trials = []
    for t in range(6):
        lens = torch.randint(1, 2000, (bs,), generator=torch.Generator().manual_seed(t))
        n = int(lens.sum())
        idx.copy_(torch.cat([torch.randperm(n_rows, device="cuda")[:n].int(), idx.new_zeros(cap - n)]))
        indptr.copy_(torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).int().cuda())
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        sel = idx[:n].long()
        got = out.view(n_rows, LAT)[sel].view(torch.int16)
        want = pool.view(n_rows, LAT)[sel].to(torch.bfloat16).view(torch.int16)
        gv, wv = got.view(torch.bfloat16).float(), want.view(torch.bfloat16).float()
        bad = got != want
        trials.append({"rows": n, "rows_differing": int(bad.any(1).sum()),
                       "rows_differing_in_value": int((gv != wv).any(1).sum()),
                       "fp8_bytes_of_differing_bits": sorted(set(
                           pool.view(n_rows, LAT)[sel].view(torch.uint8)[bad].tolist()))[:8]})
    return {"trials": trials, "all_bit_identical": all(t["rows_differing"] == 0 for t in trials),
            "all_value_identical": all(t["rows_differing_in_value"] == 0 for t in trials)}


for name, path in EXTRA:
    res[f"pages_rows_graph_{name}"] = rows_check(load(open(path).read(), f"perfscope_snippet_{name}"))
res["pages_rows_graph"] = rows_check(load(src, "perfscope_snippet_ok"))
res["pages_rows_graph_shifted"] = rows_check(load(src.replace(LINE, LINE + " + 1"), "perfscope_snippet_shifted"))
res["seconds"] = round(time.time() - t0, 1)
json.dump(res, open(os.path.join(OUT, "rows_check.json"), "w"), indent=1)
print(json.dumps({k: v for k, v in res.items() if k.startswith("pages")}), flush=True)
