"""Start the real reproduction server (examples/repro_server) on CPU, on a free loopback port.

Import the fixtures into a test module (``from reproserver import repro, start_repro``). The
server prints ``repro_server listening on http://127.0.0.1:PORT`` once it serves (it binds port 0,
so there is no race for a free port)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import need

from perfscope.demo import read_server_url

REPO = Path(__file__).resolve().parents[1]
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "2", "--max-total-tokens", "4000",
        "--vocab-size", "256", "--threads", "1"]


@contextlib.contextmanager
def start_repro(*extra: str, env: dict | None = None, log_dir: Path | None = None,
                timeout: float = 120.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yields (base URL, process); stops the process (SIGTERM, then kill) on exit."""
    need.module("torch")
    log = (log_dir or Path(os.environ.get("TMPDIR", "/tmp"))) / f"repro-{os.getpid()}-{time.monotonic_ns()}.log"
    proc = subprocess.Popen([sys.executable, "-m", "examples.repro_server", "--port", "0", *TINY, *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True,
                            env={**os.environ, **(env or {})})
    url = read_server_url(proc, timeout)
    if url is None:
        proc.kill()
        pytest.fail(f"repro server did not start: {log.read_text()[-3000:]}")
    try:
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def repro(tmp_path_factory) -> Iterator[str]:
    """Base URL of a tiny repro server (no API key), shared by a test module."""
    with start_repro(log_dir=tmp_path_factory.mktemp("repro")) as (url, _):
        yield url
