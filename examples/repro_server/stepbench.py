"""Median decode step time of the KV strategies, side by side, without HTTP.

    python -m examples.repro_server.stepbench [--device cpu] [--batch 1] [--context 512] [--steps 10]
        [--modes eager,graph] [--source NAME=PATH ...] [--flashinfer-backend fa2] [--json] [--out F]

One model (weights and FP8 pool) is built once; each strategy swaps in its attention backend:
``pool`` / ``pages`` / ``fp8`` are the fixed variants of :mod:`kv_variants`, and ``--source
NAME=PATH`` adds the ``FlashInferMLAAttnBackend`` of another copy of ``mla_attention.py`` (e.g. one
patched by ``perfscope fix fp8-kv-cast --apply``). ``batch`` requests of ``context`` tokens are
prefilled once (with the cast path); then, for every strategy and mode, the first decode step from
that same state gives the logits compared against the ``pool`` (cast) path, and ``steps`` more
decode steps are timed (CUDA events on GPU, wall clock on CPU). ``--modes graph`` replays each
step from a CUDA graph captured for the batch (the plan runs outside the graph, as in SGLang):
``median_ms`` is the whole step (plan, input copies, replay), ``replay_median_ms`` the replay alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from .app import PRESETS
from .kv_variants import backend_class
from .model import CudaGraphRunner, ForwardMode, ModelConfig, ModelRunner


def load_backend(name: str, path: str):
    """``FlashInferMLAAttnBackend`` of the mla_attention.py at ``path`` (imported as its own module)."""
    spec = importlib.util.spec_from_file_location(f"_stepbench_{name}_mla", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod.FlashInferMLAAttnBackend


class Bench:
    def __init__(self, cfg: ModelConfig, args):
        self.args = args
        self.cfg = cfg
        t0 = time.perf_counter()
        self.runner = ModelRunner(cfg, max_total_tokens=args.max_total_tokens, device=args.device,
                                  kv_strategy="pool", flashinfer_backend=args.flashinfer_backend,
                                  use_flashinfer=False if args.no_flashinfer else None)
        self.cuda = self.runner.device.type == "cuda"
        self._sync()
        self.build_s = time.perf_counter() - t0
        g = torch.Generator().manual_seed(0)
        r = self.runner
        # every request owns context + 1 (reference step) + steps + warm-up slots
        n_slots = args.context + args.steps + args.warmup + 2
        self.slots = [r.allocator.alloc(n_slots) for _ in range(args.batch)]
        ids = [torch.randint(1, cfg.vocab_size, (args.context,), generator=g).tolist() for _ in range(args.batch)]
        ctx = [s[: args.context] for s in self.slots]
        t0 = time.perf_counter()
        r.run_batch(r.build_batch(ForwardMode.EXTEND, ids, ctx, ctx))  # the cast path's prefill
        self._sync()
        self.prefill_s = time.perf_counter() - t0

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _batch(self, n: int):
        """Decode batch whose requests read ``n`` tokens (the last one is written by this step)."""
        r, b = self.runner, self.args.batch
        return r.build_batch(ForwardMode.DECODE, [[1 + (i % 7)] for i in range(b)], [s[:n] for s in self.slots],
                             [[s[n - 1]] for s in self.slots])

    def run(self, name: str, backend_cls, mode: str) -> dict:
        args, r = self.args, self.runner
        r.attn_backend = backend_cls(r)
        graph = None
        res: dict = {"strategy": name, "mode": mode}
        step = r.run_batch
        if mode == "graph":
            t0 = time.perf_counter()
            graph = CudaGraphRunner(r, args.batch, args.context + args.steps + args.warmup + 8)
            res["capture_s"] = round(time.perf_counter() - t0, 3)
            step = graph.replay
            graph.replay_events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        # reference step: the same pool state for every strategy (rows < context come from the
        # prefill; row `context` is written by this step, from this strategy's own layers)
        logits = step(self._batch(self.args.context + 1)).float().clone()
        self._sync()
        res["logits"] = logits
        times, walls, replays = [], [], []
        for i in range(args.warmup + args.steps):
            fb = self._batch(self.args.context + 2 + i)
            self._sync()
            if self.cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t0 = time.perf_counter()
            step(fb)
            if self.cuda:
                e1.record()
            self._sync()
            wall = time.perf_counter() - t0
            if i >= args.warmup:
                walls.append(wall * 1e3)
                times.append(e0.elapsed_time(e1) if self.cuda else wall * 1e3)
                if graph is not None:
                    replays.append(graph.replay_events[0].elapsed_time(graph.replay_events[1]))
        res.update(median_ms=statistics.median(times), min_ms=min(times), max_ms=max(times),
                   wall_median_ms=statistics.median(walls), steps=len(times),
                   timer="cuda-events" if self.cuda else "wall")
        if replays:  # the captured forward alone, as field-facts §4 times a graph step
            res.update(replay_median_ms=statistics.median(replays), replay_min_ms=min(replays))
        del graph
        r.attn_backend = None
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.repro_server.stepbench")
    p.add_argument("--device", default="cpu")
    p.add_argument("--strategies", default="pool,pages,fp8", help="fixed variants (pool first: the reference)")
    p.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                   help="also time the backend of this mla_attention.py (repeatable)")
    p.add_argument("--modes", default="eager", help="eager, graph (CUDA graphs), or both: eager,graph")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--num-layers", type=int)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--flashinfer-backend", default="auto", help="FlashInfer MLA backend: auto, fa2, fa3")
    p.add_argument("--no-flashinfer", action="store_true")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", help="also write the JSON result to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pre = PRESETS["cuda" if args.device.startswith("cuda") else "cpu"]
    cfg = ModelConfig(num_hidden_layers=args.num_layers or pre["num_layers"],
                      hidden_size=args.hidden_size or pre["hidden_size"],
                      num_attention_heads=args.num_heads or pre["num_heads"],
                      vocab_size=args.vocab_size or pre["vocab_size"])
    args.max_total_tokens = args.max_total_tokens or pre["max_total_tokens"]
    modes = [m for m in args.modes.split(",") if m]
    if "graph" in modes and not args.device.startswith("cuda"):
        p.error("--modes graph needs --device cuda")
    todo = [(s, backend_class(s)) for s in args.strategies.split(",") if s]
    for spec in args.source:
        name, _, path = spec.partition("=")
        if not path:
            p.error(f"--source {spec}: expected NAME=PATH")
        todo.append((name, load_backend(name, path)))
    if not todo or todo[0][0] != "pool":
        todo.insert(0, ("pool", backend_class("pool")))  # the cast path is the reference
    bench = Bench(cfg, args)
    out = {"device": args.device, "device_name": torch.cuda.get_device_name() if bench.cuda else "cpu",
           "torch": torch.__version__, "layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
           "heads": cfg.num_attention_heads, "pool_tokens": args.max_total_tokens, "batch": args.batch,
           "context": args.context, "flashinfer": bench.runner.use_flashinfer,
           "flashinfer_backend": args.flashinfer_backend, "threads": torch.get_num_threads(),
           "build_s": round(bench.build_s, 2), "prefill_s": round(bench.prefill_s, 2), "results": {},
           "errors": {}}
    if bench.runner.use_flashinfer:
        import flashinfer

        out["flashinfer_version"] = getattr(flashinfer, "__version__", "?")
    ref: dict = {}
    for mode in modes:
        for name, cls in todo:
            key = f"{name}/{mode}"
            try:
                res = bench.run(name, cls, mode)
            except Exception as e:  # noqa: BLE001 - reported, the other strategies still run
                out["errors"][key] = f"{type(e).__name__}: {e}"
                print(f"{key:16s} FAILED {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                bench.runner.attn_backend = None
                continue
            logits = res.pop("logits")
            if name == "pool":
                ref[mode] = logits
            base = ref.get(mode, ref.get("eager"))
            if base is not None:
                d = (logits - base).abs()
                res.update(max_abs_diff_vs_pool=float(d.max()), mean_abs_diff_vs_pool=float(d.mean()),
                           ref_abs_max=float(base.abs().max()),
                           argmax_agree=float((logits.argmax(-1) == base.argmax(-1)).float().mean()))
            out["results"][key] = res
            if not args.json:
                print(f"{key:16s} median {res['median_ms']:9.3f} ms  min {res['min_ms']:9.3f} ms  "
                      f"max|diff| {res.get('max_abs_diff_vs_pool', float('nan')):.4g}  ({res['steps']} steps)",
                      flush=True)
    for mode in modes:
        pool = out["results"].get(f"pool/{mode}")
        for key, res in out["results"].items():
            if pool and key.endswith("/" + mode) and not key.startswith("pool/"):
                out[f"pool/{key}"] = round(pool["median_ms"] / res["median_ms"], 2)
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print(" ".join(f"{k} {v:.1f}x" for k, v in out.items() if k.startswith("pool/")))
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
