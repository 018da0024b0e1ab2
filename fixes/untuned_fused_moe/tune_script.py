"""Tune SGLang's own fused-MoE Triton kernel for the served batch sizes; runs on the server's host with
the server's Python (standard library + the server's torch / triton / sglang only).

    python tune_script.py --E 64 --N 1408 --hidden 2048 --topk 6 --batches 1,16,64 \
        --budget-s 240 [--out FILE] [--dry-run] [--device cuda|cpu]

It times ``sglang...triton_utils.fused_experts`` (both expert GEMMs, as the server runs them) under
SGLang's ``override_config`` for each candidate of a pruned search space, per batch size, and prints
one JSON line: per batch the default config's time, the best one's, every candidate tried. ``--out``:
the winners in SGLang's config format ({"<batch>": {BLOCK_SIZE_M, ..., num_stages}}), written only
at the end, to a temp file in the same folder renamed over FILE: a stop (Ctrl-C, SIGTERM, the budget)
leaves no file half-written. ``--dry-run``: the candidates and the time bound, nothing run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time

KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def candidates(m: int, E: int, topk: int, N: int, hidden: int) -> list[dict]:
    """The pruned space for a decode batch of ``m`` tokens: BLOCK_SIZE_M no larger than the tokens an expert
    gets (m * topk / E, at least 16); N/K tiles that divide the GEMMs; GROUP_SIZE_M 1 (one M tile per
    expert in decode); the default config first."""
    per_expert = max(1, (m * topk + E - 1) // E)
    bms = [b for b in (16, 32, 64) if b <= max(16, per_expert * 2)]
    out = []
    for bm in bms:
        for bn in (32, 64, 128):
            for bk in (64, 128, 256):
                if bk > hidden or bk > N:
                    continue
                for w in (4, 8):
                    for st in (2, 3, 4):
                        out.append(
                            {
                                "BLOCK_SIZE_M": bm,
                                "BLOCK_SIZE_N": bn,
                                "BLOCK_SIZE_K": bk,
                                "GROUP_SIZE_M": 1,
                                "num_warps": w,
                                "num_stages": st,
                            }
                        )
    return out


def default_config(m: int, E: int) -> dict:
    """SGLang's get_default_config for bf16 weights (0.5.13.post1 - 0.5.23)."""
    if m <= E:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def align_block_size_torch(topk_ids, block_size: int, num_experts: int, *args, **kw):
    """CPU stand-in for SGLang's moe_align_block_size (sgl-kernel, GPU only), for Triton's interpreter."""
    import torch

    flat = topk_ids.flatten().to(torch.int64)
    pad_id = flat.numel()
    ids, blocks = [], []
    for e in range(num_experts):
        tok = torch.nonzero(flat == e).flatten()
        if tok.numel() == 0:
            continue
        n = -(-tok.numel() // block_size) * block_size
        ids.append(torch.cat([tok, torch.full((n - tok.numel(),), pad_id, dtype=torch.int64)]))
        blocks += [e] * (n // block_size)
    total = sum(int(x.numel()) for x in ids)
    cap = flat.numel() + (num_experts + 1) * (block_size - 1)
    cap = max(cap, total)
    sorted_ids = torch.full((cap,), pad_id, dtype=torch.int32)
    if ids:
        sorted_ids[:total] = torch.cat(ids).to(torch.int32)
    expert_ids = torch.full((-(-cap // block_size),), -1, dtype=torch.int32)
    expert_ids[: len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    return sorted_ids, expert_ids, torch.tensor([total], dtype=torch.int32)


class Stop(BaseException):
    """SIGTERM: a BaseException, so that no ``except Exception`` (a candidate that fails to compile is
    skipped that way) swallows the stop and tunes on."""


def _stop(*_):
    raise Stop()


def _server_args(a):
    """fused_experts reads SGLang's global server args; outside a server, its defaults (no __post_init__)."""
    import dataclasses
    import types

    from sglang.srt import server_args as sa

    try:
        from sglang.srt import runtime_context as rc
    except ImportError:
        rc = None
    if rc is not None and hasattr(rc, "publish"):
        # 0.5.2x: the kernels read the published runtime context; outside a server, publish the defaults of
        # ServerArgs for a one-layer model of the tuned MoE shape (its config.json in a temp folder)
        try:
            rc.get_exec()
            return
        except ValueError:
            pass
        folder = tempfile.mkdtemp(prefix="perfscope-moe-cfg-")
        try:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(
                    {
                        "architectures": ["MixtralForCausalLM"],
                        "model_type": "mixtral",
                        "hidden_size": a.hidden,
                        "intermediate_size": a.N,
                        "num_hidden_layers": 1,
                        "num_attention_heads": 4,
                        "num_key_value_heads": 4,
                        "num_local_experts": a.E,
                        "num_experts_per_tok": a.topk,
                        "vocab_size": 1000,
                        "max_position_embeddings": 4096,
                        "torch_dtype": "bfloat16",
                    },
                    f,
                )
            rc.publish(sa.ServerArgs(model_path=folder, device=a.device, skip_tokenizer_init=True), role="test")
        finally:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        return
    try:
        sa.get_global_server_args()
        return
    except ValueError:
        pass  # 0.5.1x: not set outside a server
    d = {}
    for f in dataclasses.fields(sa.ServerArgs):
        if f.default is not dataclasses.MISSING:
            d[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            d[f.name] = f.default_factory()
    sa.set_global_server_args_for_scheduler(types.SimpleNamespace(**d))


def runner(args):
    import torch

    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_experts, override_config
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    _server_args(args)
    dev = torch.device(args.device)
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    g = torch.Generator(device="cpu").manual_seed(0)
    w1 = (torch.randn(args.E, 2 * args.N, args.hidden, generator=g) * 0.02).to(dev, dt)
    w2 = (torch.randn(args.E, args.hidden, args.N, generator=g) * 0.02).to(dev, dt)
    cfg = MoeRunnerConfig(
        num_experts=args.E,
        num_local_experts=args.E,
        hidden_size=args.hidden,
        intermediate_size_per_partition=args.N,
        top_k=args.topk,
        params_dtype=dt,
        inplace=False,
    )

    def make(m):
        x = torch.randn(m, args.hidden, generator=g).to(dev, dt)
        logits = torch.randn(m, args.E, generator=g).to(dev, torch.float32)
        w, ids = torch.topk(torch.softmax(logits, -1), args.topk, dim=-1)
        return x, StandardTopKOutput(w.to(torch.float32), ids.to(torch.int32), logits)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if dev.type == "cuda":

        def call(x, topk):
            return fused_experts(x, w1, w2, topk, cfg)
    else:
        # SGLang registers its fused-experts op for GPUs only: on CPU (Triton's interpreter) the Python
        # function under the op, the same kernels and configs
        from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as fm

        fused_experts_impl = fm.fused_experts_impl
        # ... and its token/expert alignment is an sgl-kernel CUDA op: on CPU a torch stand-in with
        # the same contract (sorted token ids padded per expert to BLOCK_SIZE_M, one expert id per block)
        fm.moe_align_block_size = align_block_size_torch

        def call(x, topk):
            return fused_experts_impl(x, w1, w2, topk.topk_weights, topk.topk_ids, inplace=False)

    import contextlib

    try:  # 0.5.2x: the kernels read the tensor-parallel group from the runtime context; one GPU, no group
        from sglang.srt.runtime_context import get_parallel

        def no_tp():
            return get_parallel().override(tp_group=None)
    except ImportError:
        no_tp = contextlib.nullcontext

    def time_one(m, inputs, config, iters):
        """Microseconds per call: on a GPU, a CUDA graph of 10 calls replayed ``iters`` times between
        events (launch overhead out, as the server's decode graphs run it); else wall time per call."""
        x, topk = inputs
        with override_config(config), no_tp():
            out = call(x, topk)  # compile + warm up
            sync()
            if dev.type == "cuda":
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(10):
                        call(x, topk)
                graph.replay()
                torch.cuda.synchronize()
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record()
                for _ in range(iters):
                    graph.replay()
                t1.record()
                torch.cuda.synchronize()
                del graph
                return t0.elapsed_time(t1) * 1e3 / (iters * 10), out
            t0 = time.perf_counter()
            for _ in range(iters):
                call(x, topk)
            sync()
        return (time.perf_counter() - t0) / iters * 1e6, out

    return make, time_one


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--E", type=int, required=True)
    ap.add_argument("--N", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--topk", type=int, required=True)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="auto", help="auto: cuda when torch sees a GPU, else cpu")
    ap.add_argument("--max-candidates", type=int, default=0, help="0: all of the pruned space")
    ap.add_argument("--out")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if a.device == "auto":
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    batches = sorted({int(b) for b in a.batches.split(",") if b.strip()})
    if not batches or min(batches) < 1:
        print(json.dumps({"ok": False, "reason": "--batches: positive integers"}))
        return 2
    plan = {m: [default_config(m, a.E)] + candidates(m, a.E, a.topk, a.N, a.hidden) for m in batches}
    if a.max_candidates:
        plan = {m: c[: a.max_candidates + 1] for m, c in plan.items()}
    n = sum(len(c) for c in plan.values())
    res = {
        "ok": True,
        "E": a.E,
        "N": a.N,
        "hidden": a.hidden,
        "topk": a.topk,
        "batches": batches,
        "candidates": {str(m): len(c) for m, c in plan.items()},
        "budget_s": a.budget_s,
    }
    if a.dry_run:
        res["dry_run"] = True
        res["bound_s"] = a.budget_s
        print(json.dumps(res))
        return 0
    signal.signal(signal.SIGTERM, _stop)
    t_start = time.monotonic()
    best: dict = {}
    per: dict = {}
    stopped = None
    try:
        make, time_one = runner(a)
        inputs = {m: make(m) for m in batches}
        refs: dict = {}
        tried: dict = {m: [] for m in batches}
        # candidates outer, batches inner: a budget stop leaves every batch size with the same coverage
        order = []
        for m in batches:
            for c in plan[m]:
                if c not in order:
                    order.append(c)
        for c in order:
            if time.monotonic() - t_start > a.budget_s:
                stopped = "budget"
                break
            for m in batches:
                if c not in plan[m]:
                    continue
                try:
                    us, out = time_one(m, inputs[m], c, a.iters)
                except Exception as e:  # a config that does not compile or fit (shared memory): skip it
                    tried[m].append(
                        {"config": c, "error": str(e).splitlines()[0][:200] if str(e) else type(e).__name__}
                    )
                    continue
                ref = refs.setdefault(m, out)
                if out is not ref and not bool((out - ref).abs().max() <= 1e-2 * (ref.abs().max() + 1e-6)):
                    tried[m].append({"config": c, "error": "output differs from the default config's"})
                    continue
                tried[m].append({"config": c, "us": round(us, 2)})
        for m in batches:
            ok = [t for t in tried[m] if "us" in t]
            if not ok:
                per[str(m)] = {
                    "tried": len(tried[m]),
                    "failed": len(tried[m]),
                    "errors": sorted({t["error"] for t in tried[m]})[:3],
                }
                continue
            d = ok[0] if ok[0]["config"] == plan[m][0] else None
            b = min(ok, key=lambda t: t["us"])
            per[str(m)] = {
                "default_us": d["us"] if d else None,
                "best_us": b["us"],
                "best": b["config"],
                "tried": len(tried[m]),
                "failed": sum(1 for t in tried[m] if "error" in t),
            }
            best[str(m)] = {k: b["config"][k] for k in KEYS if k in b["config"]}
    except (Stop, KeyboardInterrupt):
        res.update(
            ok=False, reason="stopped: nothing written", per_batch=per, elapsed_s=round(time.monotonic() - t_start, 1)
        )
        print(json.dumps(res))
        return 130
    except ImportError as e:
        res.update(ok=False, reason=f"SGLang's fused-MoE kernel does not import here: {e}")
        print(json.dumps(res))
        return 3
    res.update(
        per_batch=per,
        config=best,
        elapsed_s=round(time.monotonic() - t_start, 1),
        stopped=stopped,
        tried=sum(v["tried"] for v in per.values()),
        planned=n,
    )
    if a.out and best:
        folder = os.path.dirname(os.path.abspath(a.out))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".perfscope-moe-", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(best, f, indent=4)
                f.write("\n")
            os.replace(tmp, a.out)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        res["written"] = a.out
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
