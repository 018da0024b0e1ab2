"""Median decode step time of the three KV strategies, side by side, without HTTP.

    python -m examples.repro_server.stepbench [--device cpu] [--batch 4] [--context 512] [--steps 10]

Builds the model once per strategy (same seed, same pool size), fills ``batch`` requests of
``context`` tokens, and times ``steps`` decode forwards (CUDA events on GPU). Prints one line per
strategy and the pool/pages and pool/fp8 ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from .app import PRESETS
from .model import ForwardMode, ModelConfig, ModelRunner


def time_strategy(strategy: str, cfg: ModelConfig, args) -> list[float]:
    runner = ModelRunner(cfg, max_total_tokens=args.max_total_tokens, device=args.device, kv_strategy=strategy,
                         use_flashinfer=False if args.no_flashinfer else None)
    g = torch.Generator().manual_seed(0)
    slots = [runner.allocator.alloc(args.context + args.steps + 2) for _ in range(args.batch)]
    ctx = [s[: args.context] for s in slots]
    ids = [torch.randint(1, cfg.vocab_size, (args.context,), generator=g).tolist() for _ in range(args.batch)]
    runner.run_batch(runner.build_batch(ForwardMode.EXTEND, ids, ctx, ctx))
    times = []
    for i in range(args.steps + 2):
        n = args.context + i + 1
        fb = runner.build_batch(ForwardMode.DECODE, [[1]] * args.batch, [s[:n] for s in slots],
                                [[s[n - 1]] for s in slots])
        if runner.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.run_batch(fb)
        if runner.device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:  # 2 warm-up steps
            times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.repro_server.stepbench")
    p.add_argument("--device", default="cpu")
    p.add_argument("--strategies", default="pool,pages,fp8")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--num-layers", type=int)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-flashinfer", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pre = PRESETS["cuda" if args.device.startswith("cuda") else "cpu"]
    cfg = ModelConfig(num_hidden_layers=args.num_layers or pre["num_layers"],
                      hidden_size=args.hidden_size or pre["hidden_size"],
                      num_attention_heads=args.num_heads or pre["num_heads"], vocab_size=pre["vocab_size"])
    args.max_total_tokens = args.max_total_tokens or pre["max_total_tokens"]
    res = {}
    for s in args.strategies.split(","):
        t = time_strategy(s, cfg, args)
        res[s] = {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "steps": len(t)}
        if not args.json:
            print(f"{s:6s} median {res[s]['median_ms']:9.2f} ms  min {res[s]['min_ms']:9.2f} ms  ({len(t)} steps)",
                  flush=True)
    out = {"device": args.device, "layers": cfg.num_hidden_layers, "pool_tokens": args.max_total_tokens,
           "batch": args.batch, "context": args.context, "threads": torch.get_num_threads(), "results": res}
    for s in ("pages", "fp8"):
        if "pool" in res and s in res:
            out[f"pool/{s}"] = res["pool"]["median_ms"] / res[s]["median_ms"]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(" ".join(f"{k} {v:.1f}x" for k, v in out.items() if k.startswith("pool/")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
