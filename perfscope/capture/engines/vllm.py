"""vLLM: its torch profiler is configured at server start (``--profiler-config`` / VLLM_TORCH_PROFILER_DIR,
given here as ``--profile-dir``); perfscope arms it, lets the load stream about ``--steps`` decode
steps, stops it, and keeps the op tables vLLM writes beside the traces."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from perfscope.capture.engines.base import Engine, RemoteDir, Say, Server
from perfscope.capture.options import TraceOptions
from perfscope.capture.wait import wait_vllm_steps
from perfscope.errors import InputError, RemoteError

if TYPE_CHECKING:
    from perfscope.capture.load import TraceLoad
    from perfscope.remote.hostio import HostIO, RemoteFile
    from perfscope.remote.sglang_api import SGLangClient

TABLES_DIR = "profiler_tables"  # in the run folder: the op tables of this profile


class VLLM(Engine):
    name = "vllm"
    summary = "vllm (/v1/completions)"

    def client(self, url: str, *, api_key: str | None = None, timeout: float = 30.0) -> SGLangClient:
        from perfscope.remote.vllm_api import VLLMClient

        return VLLMClient(url, api_key=api_key, timeout=timeout)

    def check_options(self, opts: TraceOptions) -> None:
        if not opts.profile_dir:
            raise InputError(
                "--engine vllm needs --profile-dir: the server's torch profiler directory "
                "(its --profiler-config torch_profiler_dir, or VLLM_TORCH_PROFILER_DIR)"
            )
        if opts.gpu_only:
            raise InputError("--gpu-only is for SGLang (vLLM's profiler activities are set at its launch)")
        if opts.profile_prefix:
            raise InputError("--profile-prefix is for SGLang (vLLM names its files itself)")
        if not (opts.with_stack and opts.record_shapes):
            raise InputError(
                "--no-stack and --no-shapes are for SGLang: vLLM's profiler records what its launch set "
                "(--profiler-config.torch_profiler_with_stack=false, torch_profiler_record_shapes)"
            )

    def profile(self, opts: TraceOptions, server: Server, by_stage: bool) -> dict:
        # configured at server start: what it records is not perfscope's to say
        return {
            "num_steps": opts.steps,
            "stopped_by": "perfscope",
            "with_stack": None,
            "record_shapes": None,
            "activities": None,
        }

    def output_dir(self, io: HostIO, opts: TraceOptions, server: Server) -> RemoteDir:
        assert opts.profile_dir  # check_options
        folder = RemoteDir(opts.profile_dir, made=False)
        try:  # traces already there are not this run's; vLLM makes the folder at its first trace
            folder.baseline = {f.name for f in io.list_traces(folder.path)}
            folder.before = {f.name: (f.size, f.mtime) for f in io.list_traces(folder.path, is_table)}
        except RemoteError as e:
            if "does not exist" not in str(e):
                raise
        return folder

    def start(self, api: SGLangClient, profile: dict, *, wait_s: float, server: Server) -> None:
        api.start_profile(request_timeout=wait_s)

    def after_load(
        self, load: TraceLoad, api: SGLangClient, opts: TraceOptions, cancel: threading.Event, label: str, say: Say
    ) -> None:
        n = wait_vllm_steps(load, opts, cancel, label)
        say(f"{n} tokens streamed while profiling: stopping the profiler (vLLM writes its traces now)")
        load.stop_sent = True
        api.stop_profile()

    def extras(
        self, io: HostIO, folder: RemoteDir, out_dir: Path, got: list[RemoteFile], opts: TraceOptions, say: Say
    ) -> dict:
        tables = fetch_tables(
            io, folder.path, folder.before, out_dir, [f.name for f in got], wait_s=min(30.0, opts.timeout), say=say
        )
        return {"profiler_tables": tables} if tables else {}


def is_table(name: str) -> bool:
    """vLLM's torch profiler writes each process's op table (key_averages) as *profiler_out.txt."""
    return name.endswith("profiler_out.txt") and not name.startswith(".")


def fetch_tables(
    io: HostIO,
    folder: str,
    baseline: dict,
    out_dir: Path,
    traces: Sequence[str] = (),
    wait_s: float = 0.0,
    say: Say | None = None,
) -> list[str]:
    """Copy the op tables vLLM wrote with this profile (new or rewritten since it was armed) to
    ``out_dir/profiler_tables/``; returns their paths relative to ``out_dir``. vLLM rewrites them
    in place at every stop, so a table whose size and time are unchanged is not this run's. A worker
    may write its table after its trace: wait up to ``wait_s`` for ``rank<N>.profiler_out.txt`` of
    each ``rank<N>.*`` trace (bounded; what is there then is taken)."""
    want = {f"rank{m.group(1)}.profiler_out.txt" for m in (re.match(r"rank(\d+)\.", n) for n in traces) if m}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            found = [f for f in io.list_traces(folder, is_table) if baseline.get(f.name) != (f.size, f.mtime)]
        except RemoteError:
            return []
        if all(any(f.name.endswith(w) for f in found) for w in want) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    lost = sorted(w for w in want if not any(f.name.endswith(w) for f in found))
    if lost and say is not None:  # vLLM: a worker whose key_averages() failed ("Failed to stop profiler") writes none
        say(
            f"note: vLLM wrote no {', '.join(lost)} within {wait_s:g}s (its log says why, e.g. 'Failed to stop "
            "profiler'); the traces are complete"
        )
    got = []
    for f in found:
        local = out_dir / TABLES_DIR / f.name
        io.fetch(f.path, local, "", None)
        got.append(f"{TABLES_DIR}/{f.name}")
    return got
