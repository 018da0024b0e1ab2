"""The parts of vLLM's OpenAI-compatible server that perfscope uses, behind the same interface as
:class:`perfscope.remote.sglang_api.SGLangClient`, so the load driver, ``trace`` and ``bench`` work
unchanged (``client_for(engine, url, ...)`` picks the class).

vLLM differs from SGLang (vLLM's ``api_server.py``, ``vllm/profiler``, worker code):

* no ``/server_info``: the config is put together from ``GET /v1/models`` (served name, ``root`` =
  model path, ``max_model_len``), ``GET /version`` and, where served, the ``vllm:cache_config_info``
  info gauge of ``GET /metrics`` (``cache_dtype``, ``block_size``, ``num_gpu_blocks``), mapped to
  SGLang's field names (``kv_cache_dtype``, ``page_size``, ``max_total_num_tokens``, ...);
* ``POST /start_profile`` / ``POST /stop_profile`` take no body and exist only when the server was
  started with a torch profiler directory; the server profiles until stop (no ``num_steps``), and
  stop replies once the workers wrote their traces there
  (``{worker_name}.{time_ns}.pt.trace.json.gz``, one per worker). Start while active and stop while
  inactive are silently ignored;
* the load goes to ``POST /v1/completions`` with ``stream: true``; its SSE frames are turned into
  SGLang-shaped frames (``text``, ``meta_info.completion_tokens`` cumulative, ``finish_reason``), the
  token count taken from ``usage`` (``stream_options.continuous_usage_stats``) when the server sends
  it, else one per frame that carries text.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Optional

from perfscope.errors import RemoteError
from perfscope.remote.sglang_api import HTTPStatusError, SGLangClient, StreamFrame

_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config(metrics_text: str) -> dict:
    """Labels of the first ``vllm:cache_config_info`` sample in a Prometheus text page ({} if none)."""
    m = _INFO.search(metrics_text or "")
    return dict(_LABEL.findall(m.group("labels"))) if m else {}


def _int(v: Any) -> Optional[int]:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


class VLLMClient(SGLangClient):
    """``VLLMClient("http://127.0.0.1:8000", api_key=...)``. Thread-safe (no shared connection)."""

    engine = "vllm"

    def __repr__(self) -> str:
        return f"VLLMClient({self.base_url!r}, api_key={'***' if self._api_key else None})"

    def server_info(self) -> dict:
        """A server-info dict in SGLang's field names, from /v1/models, /version and /metrics."""
        models = self.request_json("GET", "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise RemoteError("GET /v1/models: no model listed (is this a vLLM server?)")
        m = data[0]
        info: dict = {"engine": "vllm", "served_model_name": m.get("id"), "model_path": m.get("root") or m.get("id")}
        if m.get("max_model_len") is not None:
            info["context_length"] = m["max_model_len"]
        if len(data) > 1:
            info["served_models"] = [d.get("id") for d in data if isinstance(d, dict)]
        try:
            v = self.request_json("GET", "/version")
            if isinstance(v, dict) and v.get("version"):
                info["version"] = str(v["version"])
        except HTTPStatusError:
            pass
        try:
            cache = parse_cache_config(
                self.request("GET", "/metrics", timeout=min(self.timeout, 15.0)).decode("utf-8", "replace")
            )
        except RemoteError:  # /metrics off or not reachable: the config stays partial
            cache = {}
        if cache:
            info["cache_config"] = cache
            if cache.get("cache_dtype"):
                info["kv_cache_dtype"] = cache["cache_dtype"]
            bs, blocks = _int(cache.get("block_size")), _int(cache.get("num_gpu_blocks"))
            if bs:
                info["page_size"] = bs
            tokens = _int(cache.get("kv_cache_size_tokens")) or (bs * blocks if bs and blocks else None)
            if tokens:
                info["max_total_num_tokens"] = tokens
        return info

    def start_profile(
        self,
        output_dir: Optional[str] = None,
        num_steps: Optional[int] = None,
        activities: Optional[list] = None,
        with_stack: Optional[bool] = None,
        record_shapes: Optional[bool] = None,
        profile_by_stage: Optional[bool] = None,
        profile_prefix: Optional[str] = None,
        request_timeout: Optional[float] = None,
        server_has_gpu: bool = False,
        **extra: Any,
    ) -> str:
        """POST /start_profile (no body: vLLM's profiler is configured at server start, so every
        argument but ``request_timeout`` is ignored). A 404 means the server runs without a torch
        profiler directory."""
        try:
            wait = request_timeout if request_timeout is not None else max(self.timeout, 120.0)
            return self.request("POST", "/start_profile", None, timeout=wait).decode("utf-8", "replace").strip()
        except HTTPStatusError as e:
            if e.status in (404, 405):
                raise RemoteError(
                    "this vLLM server has no /start_profile: start it with a torch profiler directory "
                    '(VLLM_TORCH_PROFILER_DIR=DIR, or --profiler-config \'{"profiler": "torch", '
                    '"torch_profiler_dir": "DIR"}\') and pass the same DIR as --profile-dir'
                ) from None
            raise

    def stop_profile(self, request_timeout: Optional[float] = None) -> str:
        """POST /stop_profile: replies once the workers wrote their traces (can take minutes, or
        at most ``request_timeout`` s)."""
        wait = request_timeout if request_timeout is not None else max(self.timeout, 600.0)
        return self.request("POST", "/stop_profile", None, timeout=wait).decode("utf-8", "replace").strip()

    def generate(self, payload: dict, timeout: Optional[float] = None) -> dict:
        body = _completion_body(payload, self._model(), stream=False)
        out = self.request_json("POST", "/v1/completions", body, timeout=timeout)
        ch = (out.get("choices") or [{}])[0] if isinstance(out, dict) else {}
        usage = out.get("usage") or {}
        return {
            "text": ch.get("text", ""),
            "meta_info": {
                "completion_tokens": usage.get("completion_tokens"),
                "prompt_tokens": usage.get("prompt_tokens"),
                "finish_reason": ch.get("finish_reason"),
            },
        }

    def _model(self) -> Optional[str]:
        if not hasattr(self, "_model_name"):
            try:
                d = self.request_json("GET", "/v1/models").get("data") or [{}]
                self._model_name = d[0].get("id")
            except (RemoteError, AttributeError):
                self._model_name = None
        return self._model_name

    def generate_stream(
        self, payload: dict, timeout: Optional[float] = None, stop: Optional[Any] = None
    ) -> Iterator[StreamFrame]:
        """Streamed /v1/completions for an SGLang-style ``payload`` (``input_ids`` or ``text``,
        ``sampling_params``); yields SGLang-shaped frames (see the module docstring)."""
        body = _completion_body(payload, self._model(), stream=True)
        tokens = 0
        for fr in self.stream_sse("/v1/completions", body, timeout=timeout, stop=stop):
            d = fr.data
            choices = d.get("choices") or []
            usage = d.get("usage") if isinstance(d.get("usage"), dict) else None
            ch = choices[0] if choices and isinstance(choices[0], dict) else None
            if ch is None:  # the include_usage summary frame: no new token
                if usage and isinstance(usage.get("completion_tokens"), int):
                    tokens = max(tokens, usage["completion_tokens"])
                yield StreamFrame(fr.t, {"text": "", "meta_info": {"completion_tokens": tokens}})
                continue
            n = usage.get("completion_tokens") if usage else None
            if isinstance(n, int):
                tokens = max(tokens, n)
            elif ch.get("text") or ch.get("finish_reason") is None:
                tokens += 1
            meta: dict[str, Any] = {"completion_tokens": tokens}
            if ch.get("finish_reason"):
                meta["finish_reason"] = {"type": ch["finish_reason"]}
            yield StreamFrame(fr.t, {"text": ch.get("text", ""), "meta_info": meta})


def _completion_body(payload: dict, model: Optional[str], *, stream: bool) -> dict:
    sp = payload.get("sampling_params") or {}
    prompt = payload.get("input_ids") if payload.get("input_ids") is not None else payload.get("text", "")
    body: dict = {
        "prompt": prompt,
        "max_tokens": sp.get("max_new_tokens", 16),
        "temperature": sp.get("temperature", 0.0),
        "ignore_eos": bool(sp.get("ignore_eos", False)),
        "stream": stream,
    }
    if model:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return body


def client_for(engine: str, url: str, api_key: Optional[str] = None, timeout: float = 30.0) -> SGLangClient:
    """The HTTP client for ``engine`` ("sglang" or "vllm")."""
    return (VLLMClient if engine == "vllm" else SGLangClient)(url, api_key=api_key, timeout=timeout)
