"""The SGLang HTTP client (:class:`SGLangClient`): the base URL it parses, the requests it bounds, the
endpoints perfscope uses, the SSE frames of a streamed /generate."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional
from urllib.parse import urlsplit

from perfscope.errors import InputError, RemoteError, StreamStall
from perfscope.remote.httpbound import Deadline, read_capped, readline_capped
from perfscope.remote.sglang_api.errors import HTTPStatusError, ServerDown, Unauthorized, message_of
from perfscope.remote.sglang_api.profiling import PROFILE_FIELDS
from perfscope.util import limits

_ERROR_BODY_BYTES = 64 * 1024


def parse_base_url(url: str) -> tuple[str, str, int, str]:
    """``http://h:p/prefix`` | ``h:p`` | ``h`` -> (scheme, host, port, path prefix)."""
    if not url or not isinstance(url, str):
        raise InputError("no server URL given")
    u = url.strip()
    if "://" not in u:
        u = "http://" + u
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https"):
        raise InputError(f"server URL {url!r}: only http:// and https:// are supported")
    if not parts.hostname:
        raise InputError(f"server URL {url!r} has no host")
    if parts.username or parts.password:
        raise InputError("the server URL must not carry credentials; pass the API key separately")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InputError(f"server URL {url!r} has a bad port") from None
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


@dataclass
class StreamFrame:
    """One SSE ``data:`` frame of a streamed /generate, with the time it arrived."""

    t: float  # time.perf_counter() when the frame was read
    data: dict


class SGLangClient:
    """``SGLangClient("http://127.0.0.1:30000", api_key=...)``. Thread-safe (no shared connection)."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 30.0):
        self.scheme, self.host, self.port, self.prefix = parse_base_url(base_url)
        self.timeout = float(timeout)
        self._api_key = api_key or None
        self._info_path: Optional[str] = None

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"

    def __repr__(self) -> str:  # never shows the key
        return f"SGLangClient({self.base_url!r}, api_key={'***' if self._api_key else None})"

    # ------------------------------------------------------------------ transport
    def _conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        t = self.timeout if timeout is None else timeout
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=t, context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=t)

    def _headers(self, body: Optional[bytes]) -> dict:
        h = {"Accept": "*/*", "User-Agent": "perfscope"}
        if body is not None:
            h["Content-Type"] = "application/json"
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def _open(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None, stream: bool = False):
        """Send the request; returns (connection, response, deadline). The deadline bounds the whole
        request (``stream``: each line of the stream) at the timeout, however slowly bytes arrive."""
        data = None if body is None else json.dumps(body).encode()
        t = self.timeout if timeout is None else timeout
        conn = self._conn(t)
        where = f"{method} {self.base_url}{path}"
        watch = None
        ok = False
        try:
            conn.connect()  # bounded by the socket timeout; the deadline covers the rest
            watch = Deadline(conn.sock, limits.http_deadline(t))
            conn.request(method, self.prefix + path, body=data, headers=self._headers(data))
            resp = conn.getresponse()
            ok = True
        except ConnectionRefusedError:
            conn.close()
            raise ServerDown(
                f"nothing listens at {self.base_url} (connection refused): is the server running?"
            ) from None
        except (socket.timeout, TimeoutError):
            conn.close()
            raise RemoteError(f"{where} timed out after {conn.timeout:g}s") from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if watch is not None and watch.fired:
                raise watch.error(where, "reply") from None
            if isinstance(e, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
                raise ServerDown(f"the server at {self.base_url} closed the connection ({type(e).__name__})") from None
            raise RemoteError(f"{where} failed: {type(e).__name__}: {e}") from None
        finally:
            if watch is not None and not ok:
                watch.done()
        if resp.status >= 400:
            try:
                raw = resp.read(_ERROR_BODY_BYTES)  # enough for a message, never the whole of an endless body
            except (OSError, http.client.HTTPException):
                raw = b""
            watch.done()
            conn.close()
            msg = message_of(raw) or resp.reason
            cls = Unauthorized if resp.status in (401, 403) else HTTPStatusError
            hint = " (wrong or missing API key)" if cls is Unauthorized else ""
            raise cls(
                f"{method} {path} -> HTTP {resp.status}{hint}: {msg}",
                status=resp.status,
                body=raw.decode("utf-8", "replace"),
            )
        return conn, resp, watch

    def request(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None) -> bytes:
        """The reply body; bounded in size (``PERFSCOPE_MAX_REPLY_MB``) and in total time (the timeout)."""
        conn, resp, watch = self._open(method, path, body, timeout)
        where = f"{method} {path}"
        try:
            data = read_capped(resp, where)
        except (socket.timeout, TimeoutError):
            raise RemoteError(f"{method} {path}: timed out reading the reply") from None
        except (OSError, http.client.HTTPException) as e:
            if watch.fired:
                raise watch.error(where) from None
            raise RemoteError(f"{method} {path}: reply cut short ({type(e).__name__})") from None
        finally:
            watch.done()
            conn.close()
        if watch.fired:
            raise watch.error(where)
        return data

    def request_json(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        from perfscope.util import jsonio

        raw = self.request(method, path, body, timeout)
        try:
            json.loads(raw)
        except (ValueError, RecursionError):
            if raw.lstrip()[:1] not in (b"{", b"["):
                raise RemoteError(f"{method} {path}: the reply is not JSON: {raw[:120]!r}") from None
        return jsonio.loads(raw, f"{method} {path} reply", error=RemoteError)

    # ------------------------------------------------------------------ endpoints
    def health(self, timeout: Optional[float] = None) -> bool:
        """True when /health answers 2xx."""
        try:
            self.request("GET", "/health", timeout=timeout)
            return True
        except RemoteError:
            return False

    def wait_healthy(self, timeout: float = 60.0, interval: float = 0.25) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.health(timeout=min(5.0, timeout)):
                return
            if time.monotonic() > deadline:
                raise ServerDown(f"the server at {self.base_url} did not become healthy within {timeout:g}s")
            time.sleep(interval)

    def server_info(self) -> dict:
        """Server args + ``version``: ``/server_info`` (0.5.10+), falling back to ``/get_server_info``."""
        paths = [self._info_path] if self._info_path else ["/server_info", "/get_server_info"]
        last: Optional[HTTPStatusError] = None
        for p in paths:
            try:
                info = self.request_json("GET", p)
            except HTTPStatusError as e:
                if e.status in (404, 405) and p != paths[-1]:
                    last = e
                    continue
                raise
            if not isinstance(info, dict):
                raise RemoteError(f"GET {p}: expected a JSON object, got {type(info).__name__}")
            self._info_path = p
            return info
        raise last or RemoteError("no server info endpoint answered")

    def requests_in_server(self, timeout: float = 10.0) -> Optional[int]:
        """Requests running or waiting in the server now, from ``/v1/loads`` (SGLang 0.5.x), summed over
        its DP ranks; None when it does not say (an older server, another reply). SGLang publishes that
        snapshot at each prefill, when it goes idle and every 15 decode steps: a request just prefilled
        is not listed yet, but its tokens are in use (``num_used_tokens``), so a rank with tokens in use
        counts at least one request (an idle server's radix cache holds none: they are evictable)."""
        try:
            got = self.request_json("GET", "/v1/loads?include=core", timeout=timeout)
        except HTTPStatusError as e:
            if e.status in (400, 404, 405):
                return None
            raise
        loads = got.get("loads") if isinstance(got, dict) else None
        if not isinstance(loads, list) or not loads:
            return None

        def count(v) -> Optional[int]:
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        n = 0
        for d in loads:
            if not isinstance(d, dict):
                return None
            reqs = [count(d.get(k)) for k in ("num_running_reqs", "num_waiting_reqs")]
            if None in reqs:
                return None
            used = count(d.get("num_used_tokens")) or 0
            n += max(sum(r for r in reqs if r is not None), 1 if used else 0)
        return n

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
        """Arm the profiler. Only the fields given are sent (older servers reject unknown ones).
        Returns the server's reply text; 0.4.7+ replies before any trace is written.
        ``request_timeout``: how long to wait for the reply (default: 120 s or the client's).
        ``MEM`` (CUDA memory history) is refused unless ``server_has_gpu``: on a host without a GPU
        it kills a real SGLang server."""
        if activities and any(str(a).upper() == "MEM" for a in activities) and not server_has_gpu:
            raise InputError(
                "not sending activities MEM: the server reports no GPU, and recording CUDA "
                "memory history there kills an SGLang server"
            )
        body = {
            "output_dir": output_dir,
            "num_steps": num_steps,
            "activities": activities,
            "with_stack": with_stack,
            "record_shapes": record_shapes,
            "profile_by_stage": profile_by_stage,
            "profile_prefix": profile_prefix,
            **extra,
        }
        unknown = sorted(set(body) - set(PROFILE_FIELDS))
        if unknown:
            raise InputError(f"unknown /start_profile fields: {unknown}")
        body = {k: v for k, v in body.items() if v is not None}
        wait = request_timeout if request_timeout is not None else max(self.timeout, 120.0)
        return self.request("POST", "/start_profile", body or None, timeout=wait).decode("utf-8", "replace").strip()

    def stop_profile(self, request_timeout: Optional[float] = None) -> str:
        """Stop and write the traces (the server may take long to export: generous timeout, or
        ``request_timeout``). An error when no profile runs (SGLang 0.4.10+): :class:`HTTPStatusError`."""
        wait = request_timeout if request_timeout is not None else max(self.timeout, 600.0)
        return self.request("POST", "/stop_profile", None, timeout=wait).decode("utf-8", "replace").strip()

    def generate(self, payload: dict, timeout: Optional[float] = None) -> dict:
        """Non-streamed /generate: the final JSON object."""
        body = dict(payload, stream=False)
        return self.request_json("POST", "/generate", body, timeout=timeout)

    def generate_stream(
        self, payload: dict, timeout: Optional[float] = None, stop: Optional[Any] = None
    ) -> Iterator[StreamFrame]:
        """Streamed /generate: yields a :class:`StreamFrame` per ``data:`` frame as it arrives and
        returns at ``data: [DONE]``. ``timeout`` bounds each line of the stream (not the whole stream). ``stop``
        (a ``threading.Event``) abandons the stream between frames, closing the connection."""
        return self.stream_sse("/generate", dict(payload, stream=True), timeout=timeout, stop=stop)

    def stream_sse(
        self, path: str, body: Any, timeout: Optional[float] = None, stop: Optional[Any] = None
    ) -> Iterator[StreamFrame]:
        """POST ``body`` to ``path`` and yield its SSE ``data:`` frames until ``data: [DONE]``
        (shared with the vLLM client's /v1/completions)."""
        conn, resp, watch = self._open("POST", path, body, timeout, stream=True)
        cap = limits.max_reply_bytes()
        where = f"POST {path}"
        try:
            buf: list[bytes] = []
            held = 0
            while True:
                if stop is not None and stop.is_set():
                    return
                try:
                    line = readline_capped(resp, where, cap)
                except (socket.timeout, TimeoutError):
                    raise StreamStall(f"POST {path}: no stream data for {conn.timeout:g}s") from None
                except (OSError, http.client.HTTPException) as e:
                    if watch.fired:
                        raise watch.error(where, "complete stream line") from None
                    raise RemoteError(f"POST {path}: stream cut short ({type(e).__name__})") from None
                if watch.fired:
                    raise watch.error(where, "complete stream line")
                watch.extend()
                held += len(line)
                if held > cap:
                    raise RemoteError(
                        f"{where}: " + limits.too_big("a stream frame", cap, "PERFSCOPE_MAX_REPLY_MB", "MB")
                    )
                t = time.perf_counter()
                if not line:
                    raise RemoteError(f"POST {path}: the stream ended without data: [DONE]")
                line = line.rstrip(b"\r\n")
                if line:
                    buf.append(line)
                    continue
                held = 0
                if not buf:
                    continue
                data = b"\n".join(x[5:].lstrip() if x.startswith(b"data:") else b"" for x in buf).strip()
                buf = []
                if not data:
                    continue
                if data == b"[DONE]":
                    return
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise RemoteError(f"POST {path}: a stream frame is not JSON: {data[:120]!r}") from None
                if isinstance(obj, dict) and obj.get("error"):
                    err = obj["error"]
                    raise RemoteError(f"POST {path}: {err.get('message') if isinstance(err, dict) else err}")
                yield StreamFrame(t, obj)
        finally:
            watch.done()
            conn.close()
