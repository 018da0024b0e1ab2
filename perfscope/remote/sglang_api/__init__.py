"""A small HTTP client for the parts of SGLang's server API that perfscope uses.

Works against any base URL (``http://host:port``, ``host:port``, or the local end of an SSH port
forward). Standard library only (``http.client``): one connection per call, so a client can be
shared by many threads. The Bearer API key is sent in a header and never appears in a message,
a log line or ``repr``.

Endpoints, as SGLang serves them (field-facts §1):

* ``/server_info`` (0.5.10+), else ``/get_server_info`` (all versions): flattened server args
  plus ``version``;
* ``/start_profile`` / ``/stop_profile`` (GET or POST; a JSON ``ProfileReqInput`` body). 0.4.7+
  replies at once, so callers poll the output folder; stopping when none runs is an error;
* ``/generate`` with ``stream: true``: SSE ``data: {json}`` frames, then ``data: [DONE]``.

The package, one job a module: ``errors`` (what a failed exchange raises, an error reply's message),
``profiling`` (what perfscope asks the profiler to record, and the note a GPU trace leaves),
``client`` (:class:`SGLangClient`, the base URL it parses, the stream frames it yields).
"""

from perfscope.remote.sglang_api.client import SGLangClient, StreamFrame, parse_base_url
from perfscope.remote.sglang_api.errors import HTTPStatusError, ServerDown, Unauthorized
from perfscope.remote.sglang_api.profiling import (
    GPU_TRACE_AFTER_NOTE,
    PROFILE_FIELDS,
    gpu_trace_after_note,
    profile_activities,
    server_has_gpu,
)

__all__ = [
    "GPU_TRACE_AFTER_NOTE",
    "PROFILE_FIELDS",
    "HTTPStatusError",
    "SGLangClient",
    "ServerDown",
    "StreamFrame",
    "Unauthorized",
    "gpu_trace_after_note",
    "parse_base_url",
    "profile_activities",
    "server_has_gpu",
]
