"""The real-engine fixtures themselves (tests/real_engines.py): a real SGLang 0.5.23 server starts
from the installed venv with the project's sgl_kernel stand-in, serves token ids, and stopping it
by its process group leaves none of its processes behind."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from real_engines import SGLANG_VERSION, http_status, start_sglang, write_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a real SGLang on CPU


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_real_sglang_starts_serves_and_stops_by_process_group(tmp_path):
    srv = start_sglang(write_model(tmp_path / "model"), "--max-running-requests", "4", log_dir=tmp_path)
    try:
        assert srv.cmd[-2:] == ["--max-running-requests", "4"] and str(srv.port) in srv.cmd
        assert os.getpgid(srv.pid) == srv.pid  # its own process group (setsid)
        info = _get(srv.url + "/server_info")
        assert info["version"] == SGLANG_VERSION and info["device"] == "cpu"
        assert info["max_running_requests"] == 4  # the extra flag reached the server
        out = _post(srv.url + "/generate", {"input_ids": [5, 6, 7, 8],
                                            "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
        assert len(out["output_ids"]) == 3 and all(0 <= t < 4096 for t in out["output_ids"])
        assert out["meta_info"]["completion_tokens"] == 3
        # the stand-in module, not a CUDA kernel package, served the server's two CPU ops
        assert "sgl_kernel_cpu" in srv.env["PYTHONPATH"]
        children = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == srv.pid]
        assert len(children) >= 2  # the HTTP server plus its scheduler (and detokenizer) processes
    finally:
        srv.stop()
    assert http_status(srv.url + "/health", timeout=3) is None
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == srv.pid]


def _pgid(pid: int):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
