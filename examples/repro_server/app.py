"""Command line and wiring: build the model, the scheduler and the HTTP server, then serve."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

PRESETS = {
    # small enough for a 2-core CPU, big enough that the whole-pool cast dominates the step
    "cpu": dict(num_layers=4, hidden_size=256, num_heads=4, vocab_size=1024, max_total_tokens=32_768,
                context_length=4096),
    # DeepSeek-like per-GPU shapes (TP8 of 128 heads), the pool measured on H200 (field-facts §4)
    "cuda": dict(num_layers=60, hidden_size=7168, num_heads=16, vocab_size=32_000, max_total_tokens=495_000,
                 context_length=8192),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.repro_server",
                                description="MLA decode server over a paged FP8 KV pool (SGLang API subset).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed on stdout)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--kv-strategy", default="source", choices=["source", "pool", "pages", "fp8"],
                   help="source: mla_attention.py as it reads now (what a fix patches); "
                        "pool/pages/fp8: fixed variants for side-by-side benchmarking")
    p.add_argument("--num-layers", type=int)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--max-total-tokens", type=int, help="KV pool size in tokens (SGLang's max_total_num_tokens)")
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--cuda-graph", action="store_true", help="capture decode in CUDA graphs (--device cuda)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=16)
    p.add_argument("--disable-overlap-schedule", action="store_true",
                   help="run the normal loop (build, run, wait, read back, stream) instead of SGLang's overlap "
                        "scheduler, which launches step N+1 before reading step N's tokens (on by default on CUDA)")
    p.add_argument("--enable-overlap-schedule", action="store_true",
                   help="the overlap loop also on CPU (where nothing overlaps: the same code path runs in order)")
    p.add_argument("--attention-backend", default="flashinfer", help="reported in /server_info")
    p.add_argument("--flashinfer-backend", default="auto", help="FlashInfer MLA backend: auto, fa2, fa3")
    p.add_argument("--no-flashinfer", action="store_true", help="use the torch MLA wrapper even on CUDA")
    p.add_argument("--api-key", default=os.environ.get("REPRO_API_KEY"),
                   help="Bearer key required on every endpoint but /health (env REPRO_API_KEY)")
    p.add_argument("--admin-api-key", default=os.environ.get("REPRO_ADMIN_API_KEY"),
                   help="Bearer key required on /start_profile and /stop_profile (env REPRO_ADMIN_API_KEY)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-path", default=None, help="name reported as model_path")
    p.add_argument("--log-level", default="info")
    from .tp import add_tp_args  # --tp-size & co. (tp.py)
    from .vllm_api import add_args as add_vllm_args  # --api vllm & co. (vllm_api.py)

    add_tp_args(p)
    add_vllm_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[repro %(asctime)s] %(message)s", stream=sys.stderr)
    log = logging.getLogger("repro_server")
    tp = None
    if args.tp_size > 1:  # tensor parallelism: tp.py (rank 0 continues here, the other ranks loop there)
        from . import tp as tp_mod

        if args.tp_rank:
            return tp_mod.worker_main(args, PRESETS)
        tp = tp_mod.launch(args, list(sys.argv[1:] if argv is None else argv), PRESETS)

    import torch

    from .kv_variants import strategy_of_source
    from .model import ModelRunner, config_from_args
    from .scheduler import Scheduler
    from .server import ReproHTTPServer

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, pick = config_from_args(args, PRESETS)
    max_total = pick("max_total_tokens")
    context_length = pick("context_length")
    t0 = time.time()
    use_fi = False if args.no_flashinfer else None
    if args.disable_overlap_schedule and args.enable_overlap_schedule:
        raise SystemExit("--disable-overlap-schedule and --enable-overlap-schedule contradict each other")
    overlap = not args.disable_overlap_schedule and (args.device.startswith("cuda") or args.enable_overlap_schedule)
    if tp and overlap:
        log.info("overlap schedule: off with --tp-size > 1 (the ranks run the normal loop)")
        overlap = False
    runner = (tp.runner_cls if tp else ModelRunner)(cfg, max_total_tokens=max_total, device=args.device, kv_strategy=args.kv_strategy,
                         flashinfer_backend=args.flashinfer_backend, use_flashinfer=use_fi, seed=args.seed)
    sched = (tp.scheduler_cls if tp else Scheduler)(runner, max_running_requests=args.max_running_requests, cuda_graph=args.cuda_graph,
                      cuda_graph_max_bs=args.cuda_graph_max_bs, max_context=context_length, seed=args.seed,
                      overlap=overlap)
    device_name = torch.cuda.get_device_name(runner.device) if runner.device.type == "cuda" else "cpu"
    wbytes = cfg.weight_bytes_per_layer()
    model_config = {
        "num_hidden_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads, "kv_lora_rank": cfg.kv_lora_rank,
        "qk_rope_head_dim": cfg.qk_rope_head_dim, "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "v_head_dim": cfg.v_head_dim, "vocab_size": cfg.vocab_size, "context_length": context_length,
        "kv_cache_dim": cfg.kv_lora_rank + cfg.qk_rope_head_dim,
        "weight_bytes_per_layer": wbytes, "weight_bytes": wbytes * cfg.num_hidden_layers,
        "architectures": ["ReproMLAForCausalLM"],
    }
    info = {
        # flattened server args, named as SGLang names them
        "model_path": args.model_path or f"perfscope-repro/mla-fp8-{cfg.num_hidden_layers}l-{cfg.hidden_size}h",
        "tokenizer_path": None, "served_model_name": "repro-mla",
        "host": args.host, "port": args.port, "device": runner.device.type,
        "dtype": "bfloat16", "quantization": None, "kv_cache_dtype": "fp8_e4m3",
        "attention_backend": args.attention_backend, "decode_attention_backend": args.attention_backend,
        "prefill_attention_backend": args.attention_backend, "sampling_backend": "pytorch",
        "tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1, "nnodes": 1, "enable_dp_attention": False,
        "page_size": 1, "status": "ready",
        "disable_cuda_graph": not args.cuda_graph, "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "disable_custom_all_reduce": True, "disable_overlap_schedule": not sched.overlap, "disable_radix_cache": True,
        "chunked_prefill_size": -1, "max_running_requests": args.max_running_requests,
        "max_total_num_tokens": max_total, "context_length": context_length, "random_seed": args.seed,
        "enable_metrics": False, "api_key_set": bool(args.api_key), "admin_api_key_set": bool(args.admin_api_key),
        # the model shape (not in SGLang's /server_info; perfscope's floor model reads it when present)
        **model_config, "model_config": model_config,
        # what this server is, and what its attention code does
        "engine": "perfscope-repro", "kv_strategy_flag": args.kv_strategy,
        "kv_pool_rows": max_total + 1, "kv_pool_bytes_per_layer": runner.token_to_kv_pool.bytes_per_layer(),
        "flashinfer": runner.use_flashinfer, "device_name": device_name, "torch_version": torch.__version__,
    }
    if tp:
        tp.update_info(info, runner)
    if runner.use_flashinfer:
        import flashinfer

        info["flashinfer_version"] = getattr(flashinfer, "__version__", "?")
    if args.api == "vllm":
        from .vllm_api import make_server

        httpd = make_server((args.host, args.port), sched, info, args)
    else:
        httpd = ReproHTTPServer((args.host, args.port), sched, info, api_key=args.api_key,
                                admin_api_key=args.admin_api_key)
    port = httpd.server_address[1]
    info["port"] = port
    sched.start()
    log.info("model ready in %.1fs: %d layers, hidden %d, %d heads, pool %d tokens (%.0f MB/layer FP8), "
             "kv strategy %s (%s), device %s%s, overlap schedule %s", time.time() - t0, cfg.num_hidden_layers, cfg.hidden_size,
             cfg.num_attention_heads, max_total, runner.token_to_kv_pool.bytes_per_layer() / 1e6, args.kv_strategy,
             strategy_of_source() if args.kv_strategy == "source" else "fixed variant", device_name,
             ", FlashInfer" if runner.use_flashinfer else "", "on" if sched.overlap else "off")
    print(f"repro_server listening on http://{args.host}:{port}", flush=True)
    print("The server is fired up and ready to roll!", flush=True)

    def _term(signum, frame):
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _term)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        sched.shutdown()
        httpd.server_close()
    return 0
