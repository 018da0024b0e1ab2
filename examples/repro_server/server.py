"""The HTTP side: the subset of SGLang's API that perfscope uses, on stdlib ``http.server``.

Endpoints (shapes as in SGLang 0.5.x ``srt/entrypoints/http_server.py``):

* ``POST /generate`` ``{"text"|"input_ids", "sampling_params": {"max_new_tokens", "temperature",
  "ignore_eos"}, "stream": bool}``; streaming is SSE ``data: {json}`` frames, then ``data: [DONE]``.
* ``GET|POST /start_profile`` (ProfileReqInput fields), replying at once (0.4.7+): the trace is
  written when ``num_steps`` forwards have run, so clients poll for the file.
* ``GET|POST /stop_profile``: writes the trace and replies; an error when none is running.
* ``GET /server_info`` and the deprecated ``GET /get_server_info``: flattened server args,
  ``version``, plus the model shape a floor model needs.
* ``GET /health``, ``GET /get_model_info``, ``GET /v1/loads`` (requests running and waiting).

``--api-key`` guards every endpoint but /health (SGLang's legacy behaviour); ``--admin-api-key``
(0.5.23) guards the profiling endpoints. Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import json
import logging
import queue
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import urlsplit

from .scheduler import ProfileError, Req, Scheduler

log = logging.getLogger("repro_server")

SGLANG_COMPAT_VERSION = "0.5.23"
ADMIN_PATHS = {"/start_profile", "/stop_profile"}
PROFILE_FIELDS = {"output_dir", "num_steps", "activities", "with_stack", "record_shapes", "profile_by_stage",
                  "profile_prefix", "profile_id", "start_step", "merge_profiles", "profile_stages"}


def detok(token_id: int) -> str:
    return f" t{token_id}"


class ReproHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, scheduler: Scheduler, server_info: dict, api_key: Optional[str] = None,
                 admin_api_key: Optional[str] = None, handler_cls: Optional[type] = None):
        super().__init__(addr, handler_cls or Handler)  # handler_cls: vllm_api.VLLMHandler for --api vllm
        self.scheduler = scheduler
        self.server_info_base = server_info
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.started = time.time()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ReproHTTPServer

    def log_message(self, fmt, *args):  # quiet access log; never prints headers
        log.debug("%s %s", self.address_string(), fmt % args)

    # ------------------------------------------------------------------ plumbing
    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _json_body(self) -> Any:
        raw = self._body()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise _HTTPError(400, f"request body is not JSON: {e.msg}") from None

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _refused(self, e: Exception) -> None:
        """SGLang 0.5.23 turns a refused profiler request into an uncaught RuntimeError: a bare
        HTTP 500 ``Internal Server Error``, the reason only in its log."""
        log.error("RuntimeError: %s", e)
        self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        self._send_json(status, {"object": "error", "message": message,
                                 "type": HTTPStatus(status).phrase.replace(" ", ""), "param": None, "code": status})

    def _authorized(self, path: str) -> bool:
        if path == "/health" or path == "/health_generate":
            return True
        got = self.headers.get("Authorization", "")
        token = got[7:].strip() if got.lower().startswith("bearer ") else ""
        srv = self.server
        keys = []
        if path in ADMIN_PATHS and srv.admin_api_key:
            keys = [srv.admin_api_key]
        elif srv.api_key:
            keys = [srv.api_key] + ([srv.admin_api_key] if srv.admin_api_key else [])
        if not keys:
            return True
        return any(hmac.compare_digest(token.encode(), k.encode()) for k in keys)

    def _route(self) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        try:
            if not self._authorized(path):
                self._send_json(401, {"error": "Unauthorized"})
                return
            routes = self._routes()
            fn = routes.get((self.command if self.command != "PUT" else "POST", path))
            if fn is None:
                if any(p == path for (_, p) in routes):
                    self._error(405, f"method {self.command} not allowed on {path}")
                else:
                    self._error(404, f"no endpoint {path}")
                return
            fn(self)
        except _HTTPError as e:
            self._error(e.status, e.message)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_POST = do_PUT = _route

    def _start_event_stream(self, content_type: str) -> None:
        """Headers of a chunked server-sent-events reply (SGLang's /generate, vLLM's /v1/completions)."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    @staticmethod
    def _next_output(req, timeout: float = 600) -> tuple:
        """The next (kind, payload) the scheduler produced for ``req``."""
        try:
            return req.out.get(timeout=timeout)
        except queue.Empty:
            return "error", "timed out waiting for the scheduler"

    def _routes(self) -> dict:
        return ROUTES

    # ------------------------------------------------------------------ endpoints
    def health(self) -> None:
        sch = self.server.scheduler
        if sch.error is not None:
            self._error(503, f"scheduler died: {sch.error}")
        else:
            self._send(200, b"", "text/plain")

    def server_info(self) -> None:
        sch = self.server.scheduler
        info = dict(self.server.server_info_base)
        from .kv_variants import strategy_of_source

        steps = [s for s in sch.step_times if s[0] == "DECODE"][-20:]
        info.update({
            "kv_strategy": strategy_of_source() if info.get("kv_strategy_flag") == "source" else info.get("kv_strategy_flag"),
            "startup_time": self.server.started,
            # one dict per DP rank, as SGLang 0.5.23 (its scheduler's state; the emulator's own
            # extras after the keys real SGLang has)
            "internal_states": [{
                "world_size": info.get("tp_size", 1),
                "effective_max_running_requests_per_dp": info.get("max_running_requests"),
                "last_gen_throughput": round(sum(s[1] for s in steps) / sum(s[2] for s in steps), 3) if steps else 0.0,
                "memory_usage": {"weight": round(info.get("weight_bytes", 0) / 2**30, 3),
                                 "kvcache": round(info.get("kv_pool_bytes_per_layer", 0)
                                                  * info.get("num_hidden_layers", 1) / 2**30, 3),
                                 "token_capacity": info.get("max_total_num_tokens"), "graph": {}},
                "decode_cuda_graph_bs": list(range(1, info["cuda_graph_max_bs"] + 1))
                if not info.get("disable_cuda_graph") else [],
                "num_running_reqs": len(sch.running),
                "num_waiting_reqs": sch.waiting.qsize(),
                "available_kv_tokens": sch.runner.allocator.available_size(),
                "last_decode_step_ms": [round(s[2] * 1e3, 3) for s in steps],
            }],
            "version": SGLANG_COMPAT_VERSION,
        })
        self._send_json(200, info)

    def loads(self) -> None:
        """``GET /v1/loads``: SGLang 0.5.x's load report, its core section (one entry per DP rank)."""
        sch = self.server.scheduler
        info = self.server.server_info_base
        self._send_json(200, {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                              "version": SGLANG_COMPAT_VERSION,
                              "loads": [{"dp_rank": 0, "num_running_reqs": len(sch.running),
                                         "num_waiting_reqs": sch.waiting.qsize(),
                                         "num_used_tokens": info["max_total_num_tokens"]
                                         - sch.runner.allocator.available_size(),
                                         "max_total_num_tokens": info["max_total_num_tokens"]}]})

    def model_info(self) -> None:
        i = self.server.server_info_base
        self._send_json(200, {"model_path": i["model_path"], "served_model_name": i["served_model_name"],
                              "tokenizer_path": i["tokenizer_path"], "is_generation": True,
                              "preferred_sampling_params": None, "weight_version": "default",
                              "load_format": "dummy", "model_type": "deepseek_v3",
                              "architectures": i["model_config"]["architectures"]})

    def start_profile(self) -> None:
        body = self._json_body() or {}
        if not isinstance(body, dict):
            raise _HTTPError(400, "ProfileReqInput must be a JSON object")
        unknown = set(body) - PROFILE_FIELDS
        if unknown:
            raise _HTTPError(400, f"unknown ProfileReqInput fields: {sorted(unknown)}")
        try:
            self.server.scheduler.call("start_profile", body, timeout=120)
        except ProfileError as e:
            self._refused(e)
            return
        self._send(200, b"Start profiling.\n", "text/plain; charset=utf-8")

    def stop_profile(self) -> None:
        try:
            self.server.scheduler.call("stop_profile", {}, timeout=600)
        except ProfileError as e:
            self._refused(e)
            return
        self._send(200, b"Stop profiling. This will take some time.\n", "text/plain; charset=utf-8")

    def generate(self) -> None:
        body = self._json_body()
        if not isinstance(body, dict):
            raise _HTTPError(400, "request body must be a JSON object")
        cfg = self.server.server_info_base
        vocab = cfg["vocab_size"]
        if body.get("input_ids") is not None:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise _HTTPError(400, "input_ids must be a non-empty list of token ids (one request)")
            if any(t < 0 or t >= vocab for t in ids):
                raise _HTTPError(400, f"input_ids must be in [0, {vocab})")
        elif isinstance(body.get("text"), str) and body["text"]:
            ids = [1 + b % (vocab - 1) for b in body["text"].encode("utf-8")]
        else:
            raise _HTTPError(400, "give `text` (a string) or `input_ids` (a list of ints)")
        sp = body.get("sampling_params") or {}
        try:
            max_new = int(sp.get("max_new_tokens", 128))
            temperature = float(sp.get("temperature", 1.0))
        except (TypeError, ValueError):
            raise _HTTPError(400, "max_new_tokens / temperature must be numbers") from None
        if max_new < 1:
            raise _HTTPError(400, "max_new_tokens must be >= 1")
        if len(ids) + max_new > cfg["context_length"]:
            raise _HTTPError(400, f"input + max_new_tokens exceeds context_length {cfg['context_length']}")
        req = Req(rid=body.get("rid") or uuid.uuid4().hex, input_ids=ids, max_new_tokens=max_new,
                  temperature=temperature, ignore_eos=bool(sp.get("ignore_eos", False)))
        t0 = time.time()
        self.server.scheduler.submit(req)
        stream = bool(body.get("stream", False))
        if stream:
            self._start_event_stream("text/event-stream")
        out_ids: list[int] = []
        finish = None
        try:
            while True:
                kind, payload = self._next_output(req)
                if kind == "error":
                    if stream:
                        self._chunk(b"data: " + json.dumps({"error": {"message": payload, "code": 500}}).encode()
                                    + b"\n\n")
                        break
                    raise _HTTPError(500, payload)
                if kind == "token":
                    tok, finish = payload
                    out_ids.append(tok)
                    if stream:
                        self._chunk(b"data: " + json.dumps(self._frame(req, out_ids, finish, t0)).encode() + b"\n\n")
                    if finish:
                        break
            if stream:
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            else:
                self._send_json(200, self._frame(req, out_ids, finish, t0))
        except (BrokenPipeError, ConnectionResetError):
            req.cancelled = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    @staticmethod
    def _frame(req: Req, out_ids: list[int], finish: Optional[str], t0: float) -> dict:
        fr = None
        if finish == "length":
            fr = {"type": "length", "length": len(out_ids)}
        elif finish == "stop":
            fr = {"type": "stop", "matched": Scheduler.EOS_ID}
        meta = {"id": req.rid, "finish_reason": fr, "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(out_ids), "cached_tokens": 0}
        if finish:
            meta["e2e_latency"] = time.time() - t0
        return {"text": "".join(detok(t) for t in out_ids), "output_ids": list(out_ids), "meta_info": meta,
                "index": 0}


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


ROUTES = {
    ("GET", "/health"): Handler.health,
    ("GET", "/health_generate"): Handler.health,
    ("GET", "/server_info"): Handler.server_info,
    ("GET", "/get_server_info"): Handler.server_info,
    ("GET", "/get_model_info"): Handler.model_info,
    ("GET", "/v1/loads"): Handler.loads,
    ("GET", "/model_info"): Handler.model_info,
    ("GET", "/start_profile"): Handler.start_profile,
    ("POST", "/start_profile"): Handler.start_profile,
    ("GET", "/stop_profile"): Handler.stop_profile,
    ("POST", "/stop_profile"): Handler.stop_profile,
    ("POST", "/generate"): Handler.generate,
}
