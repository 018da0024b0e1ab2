"""vLLM emulation: ``python -m examples.repro_server --api vllm --torch-profiler-dir DIR``.

The same model and scheduler, behind the parts of vLLM's OpenAI-compatible server that perfscope
uses, shaped as vLLM serves them (``vllm/entrypoints/openai/api_server.py`` and the profile /
instrumentator routers; ``vllm/profiler``; worker code):

* ``POST /v1/completions``: ``prompt`` (text, token ids, or a list of one of those), ``max_tokens``,
  ``temperature``, ``ignore_eos``, ``stream``; ``stream_options.include_usage`` adds a last frame with
  ``usage`` and ``choices: []``, ``continuous_usage_stats`` a cumulative ``usage`` on every frame.
  SSE frames ``data: {json}``, then ``data: [DONE]``. Errors: ``{"object": "error", ...}``.
* ``GET /v1/models`` (id = served model name, ``root`` = model path, ``max_model_len``),
  ``GET /version``, ``GET /health``, ``GET /metrics`` (Prometheus text with the
  ``vllm:cache_config_info`` info gauge: ``block_size``, ``cache_dtype``, ``num_gpu_blocks``, ...).
* ``POST /start_profile`` / ``POST /stop_profile`` (no body, empty 200 reply) exist only when a torch
  profiler directory is set (``--torch-profiler-dir`` or ``VLLM_TORCH_PROFILER_DIR``), as in vLLM.
  Start profiles every forward until stop (no ``num_steps``); start while active and stop while
  inactive are ignored (no error), as vLLM's ``WorkerProfiler`` does. Stop writes the trace before
  it replies, through torch's ``tensorboard_trace_handler`` naming:
  ``{worker_name}.{time_ns}.pt.trace.json.gz`` in the directory (made if missing), written in place
  (the file grows while torch gzips it), with ``worker_name`` ``{hostname}_{pid}`` (vLLM up to
  0.10, torch's default) or ``{instance_id}-rank-{rank}`` (``--vllm-worker-name rank``; later vLLM).
  Shapes are recorded only with ``VLLM_TORCH_PROFILER_RECORD_SHAPES=1`` (vLLM's default is off);
  stacks with ``VLLM_TORCH_PROFILER_WITH_STACK`` (default on).

Deviation: token ids at or above the toy vocabulary are folded into it (vLLM refuses them; a real
model's vocabulary holds the ids perfscope sends). ``--api-key`` guards ``/v1/*`` only, as vLLM's middleware does; the profiler routes are open.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Optional

import torch

from .scheduler import Req
from .server import Handler, ReproHTTPServer, _HTTPError, detok

log = logging.getLogger("repro_server")

VLLM_COMPAT_VERSION = "0.11.0"


def _env_flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


def worker_name(style: str, rank: int = 0) -> str:
    if style == "rank":
        return f"{uuid.uuid4().hex[:5]}-rank-{rank}"
    return f"{socket.gethostname()}_{os.getpid()}"  # torch.profiler.tensorboard_trace_handler's default


class VLLMProfiler:
    """vLLM's torch worker profiler, with the interface the scheduler drives (init / stop_all /
    before_forward / after_forward; called on the scheduler thread)."""

    def __init__(self, device: torch.device, trace_dir: str, worker: str, *, record_shapes: bool,
                 with_stack: bool, use_gzip: bool = True):
        self.device = device
        self.trace_dir = Path(trace_dir).expanduser()
        self.worker = worker
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.use_gzip = use_gzip
        self.prof: Optional[torch.profiler.profile] = None
        self.files: list[str] = []

    def init(self, req: dict) -> str:
        if self.prof is not None:
            log.info("start_profile received when profiler is already active. Ignoring request.")
            return "ignored"
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=acts, record_shapes=self.record_shapes,
                                           with_stack=self.with_stack)
        self.prof.start()
        log.info("Profiler started. Traces will be saved to: %s", self.trace_dir)
        return "started"

    def stop_all(self) -> str:
        if self.prof is None:
            log.info("stop_profile received when profiler is not active. Ignoring request.")
            return "ignored"
        prof, self.prof = self.prof, None
        prof.stop()
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        name = f"{self.worker}.{time.time_ns()}.pt.trace.json" + (".gz" if self.use_gzip else "")
        path = self.trace_dir / name
        prof.export_chrome_trace(str(path))  # torch gzips into the final name: the file grows in place
        self.files.append(str(path))
        log.info("Profiler stopped. Trace: %s", path)
        return "stopped"

    def before_forward(self, mode) -> None:
        pass

    def after_forward(self) -> None:
        pass


class VLLMHandler(Handler):
    """The vLLM routes (see the module docstring); plumbing shared with the SGLang handler."""

    def _authorized(self, path: str) -> bool:
        key = self.server.api_key
        if not key or not path.startswith("/v1"):
            return True
        got = self.headers.get("Authorization", "")
        token = got[7:].strip() if got.lower().startswith("bearer ") else ""
        return hmac.compare_digest(token.encode(), key.encode())

    def _routes(self) -> dict:
        r = dict(VLLM_ROUTES)
        if getattr(self.server, "torch_profiler_dir", None):
            r.update(VLLM_PROFILE_ROUTES)
        return r

    # ------------------------------------------------------------------ info
    def version(self) -> None:
        self._send_json(200, {"version": VLLM_COMPAT_VERSION})

    def models(self) -> None:
        i = self.server.server_info_base
        self._send_json(200, {"object": "list", "data": [{
            "id": i["served_model_name"], "object": "model", "created": int(self.server.started), "owned_by": "vllm",
            "root": i["model_path"], "parent": None, "max_model_len": i["context_length"],
            "permission": [],
        }]})

    def metrics(self) -> None:
        i = self.server.server_info_base
        sch = self.server.scheduler
        labels = {"block_size": i.get("page_size", 1), "cache_dtype": "fp8_e4m3",
                  "num_gpu_blocks": i["max_total_num_tokens"] // max(int(i.get("page_size", 1)), 1),
                  "num_cpu_blocks": 0, "enable_prefix_caching": False, "gpu_memory_utilization": 0.9,
                  "kv_cache_size_tokens": i["max_total_num_tokens"]}
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        model = i["served_model_name"]
        text = (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{engine="0",{lab}}} 1.0\n'
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{model}"}} {float(len(sch.running))}\n'
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {float(sch.waiting.qsize())}\n'
        )
        self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ profiling
    def vllm_start_profile(self) -> None:
        self._body()  # vLLM takes no body; whatever is sent is ignored
        self.server.scheduler.call("start_profile", {}, timeout=120)
        self._send(200, b"", "application/json")

    def vllm_stop_profile(self) -> None:
        self._body()
        self.server.scheduler.call("stop_profile", {}, timeout=600)
        self._send(200, b"", "application/json")

    # ------------------------------------------------------------------ completions
    def completions(self) -> None:
        body = self._json_body()
        if not isinstance(body, dict):
            raise _HTTPError(400, "request body must be a JSON object")
        cfg = self.server.server_info_base
        model = body.get("model")
        if model is not None and model not in (cfg["served_model_name"], cfg["model_path"]):
            raise _HTTPError(404, f"The model `{model}` does not exist.")
        vocab = cfg["vocab_size"]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str) and prompt:
            ids = [1 + b % (vocab - 1) for b in prompt.encode("utf-8")]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            if any(t < 0 for t in prompt):
                raise _HTTPError(400, "Token ids must be non-negative")
            # a real model's vocabulary holds the ids clients send (perfscope: 100..10000); this toy
            # one is smaller, so ids are folded into it rather than refused
            ids = [t % vocab for t in prompt]
        else:
            raise _HTTPError(400, "prompt must be a non-empty string or list of token ids (one prompt)")
        try:
            max_new = int(body.get("max_tokens") if body.get("max_tokens") is not None else 16)
            temperature = float(body.get("temperature") if body.get("temperature") is not None else 1.0)
        except (TypeError, ValueError):
            raise _HTTPError(400, "max_tokens / temperature must be numbers") from None
        if max_new < 1:
            raise _HTTPError(400, "max_tokens must be at least 1")
        if len(ids) + max_new > cfg["context_length"]:
            raise _HTTPError(400, f"This model's maximum context length is {cfg['context_length']} tokens. "
                                  f"However, you requested {len(ids) + max_new} tokens.")
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats"))
        rid = f"cmpl-{uuid.uuid4().hex}"
        req = Req(rid=rid, input_ids=ids, max_new_tokens=max_new, temperature=temperature,
                  ignore_eos=bool(body.get("ignore_eos", False)))
        created = int(time.time())
        name = model or cfg["served_model_name"]
        self.server.scheduler.submit(req)
        stream = bool(body.get("stream", False))
        if stream:
            self._start_event_stream("text/event-stream; charset=utf-8")
        out: list[int] = []
        finish = None

        def usage() -> dict:
            return {"prompt_tokens": len(ids), "total_tokens": len(ids) + len(out), "completion_tokens": len(out)}

        def frame(choices: list, use: Optional[dict]) -> bytes:
            obj = {"id": rid, "object": "text_completion", "created": created, "model": name, "choices": choices}
            if include_usage or use is not None:
                obj["usage"] = use
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        try:
            while True:
                kind, payload = self._next_output(req)
                if kind == "error":
                    if stream:
                        self._chunk(b"data: " + json.dumps({"error": {"object": "error", "message": payload,
                                                                       "type": "InternalServerError",
                                                                       "param": None, "code": 500}}).encode()
                                    + b"\n\n")
                        break
                    raise _HTTPError(500, payload)
                tok, finish = payload
                out.append(tok)
                if stream:
                    ch = {"index": 0, "text": detok(tok), "logprobs": None, "finish_reason": finish,
                          "stop_reason": None}
                    self._chunk(frame([ch], usage() if continuous else None))
                if finish:
                    break
            if stream:
                if include_usage and finish:
                    self._chunk(frame([], usage()))
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            else:
                self._send_json(200, {
                    "id": rid, "object": "text_completion", "created": created, "model": name,
                    "choices": [{"index": 0, "text": "".join(detok(t) for t in out), "logprobs": None,
                                 "finish_reason": finish, "stop_reason": None, "prompt_logprobs": None}],
                    "usage": usage()})
        except (BrokenPipeError, ConnectionResetError):
            req.cancelled = True


VLLM_ROUTES = {
    ("GET", "/health"): Handler.health,
    ("GET", "/version"): VLLMHandler.version,
    ("GET", "/v1/models"): VLLMHandler.models,
    ("GET", "/metrics"): VLLMHandler.metrics,
    ("POST", "/v1/completions"): VLLMHandler.completions,
}
VLLM_PROFILE_ROUTES = {
    ("POST", "/start_profile"): VLLMHandler.vllm_start_profile,
    ("POST", "/stop_profile"): VLLMHandler.vllm_stop_profile,
}


def add_args(p) -> None:
    g = p.add_argument_group("vLLM emulation (--api vllm)")
    g.add_argument("--api", default="sglang", choices=["sglang", "vllm"],
                   help="HTTP API to speak: SGLang's (default) or vLLM's OpenAI server subset")
    g.add_argument("--torch-profiler-dir", default=os.environ.get("VLLM_TORCH_PROFILER_DIR") or None,
                   help="vLLM: where /stop_profile writes traces; the profile routes exist only when set "
                        "(env VLLM_TORCH_PROFILER_DIR)")
    g.add_argument("--vllm-worker-name", default="hostpid", choices=["hostpid", "rank"],
                   help="vLLM trace names: {hostname}_{pid}.{ns}.pt.trace.json.gz (hostpid) or "
                        "{instance}-rank-0.{ns}.pt.trace.json.gz (rank)")


def make_profiler(device: torch.device, args, rank: int) -> VLLMProfiler:
    """One worker's profiler (with ``--tp-size N``, every rank has one: one trace per worker)."""
    return VLLMProfiler(
        device, args.torch_profiler_dir, worker_name(args.vllm_worker_name, rank),
        record_shapes=_env_flag("VLLM_TORCH_PROFILER_RECORD_SHAPES", False),
        with_stack=_env_flag("VLLM_TORCH_PROFILER_WITH_STACK", True),
        use_gzip=_env_flag("VLLM_TORCH_PROFILER_USE_GZIP", True),
    )


def make_server(addr, sched, info: dict, args) -> ReproHTTPServer:
    """The vLLM-speaking HTTP server; swaps the scheduler's profiler for vLLM's behaviour."""
    if args.torch_profiler_dir:
        sched.profiler = make_profiler(sched.runner.device, args, rank=0)
    info.update({"api": "vllm", "torch_profiler_dir": args.torch_profiler_dir})
    httpd = ReproHTTPServer(addr, sched, info, api_key=args.api_key, handler_cls=VLLMHandler)
    httpd.torch_profiler_dir = args.torch_profiler_dir
    return httpd
