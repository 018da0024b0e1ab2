"""What ``perfscope trace`` asks of a serving engine (:class:`Engine`): its HTTP client, the options it
takes, where its profiler writes, what it records, how a profile starts and ends, and what else the
run folder keeps of it. The trace flow (:mod:`perfscope.capture.host`) calls these and nothing
engine-specific; an engine is one module beside this one, registered in ``engines/__init__.py``."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from perfscope.capture.options import TraceOptions

if TYPE_CHECKING:  # the transport is imported where it is used: the CLI starts without paramiko
    from perfscope.capture.load import TraceLoad
    from perfscope.remote.hostio import HostIO, RemoteFile
    from perfscope.remote.sglang_api import SGLangClient

Say = Callable[[str], None]


def version_tuple(v: str | None) -> tuple[int, ...]:
    """``"0.5.10.post1+cu12"`` -> (0, 5, 10, 1); () when unknown."""
    if not v:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:4])


@dataclass
class Server:
    """What the tracer learnt of one server before profiling it."""

    label: str  # the host (or URL) as the user named it
    info: dict  # /server_info, in SGLang's field names (the vLLM client translates)
    version: str  # the engine's version as the server reports it; "" when unknown
    gpu: list  # nvidia-smi's GPUs on its host
    has_gpu: bool  # the server runs on a GPU (perfscope.remote.sglang_api.server_has_gpu)
    proc: dict = field(default_factory=dict)  # the server's process on its host (HostIO.server_process)


@dataclass
class RemoteDir:
    """The folder the profiler writes to for this run: ``made`` by perfscope (removed after the copy),
    or the engine's own (only this run's files removed). ``baseline``: trace names already there, not
    this run's; ``before``: what the engine needs to tell its other files of this run apart."""

    path: str
    made: bool
    baseline: set[str] = field(default_factory=set)
    before: dict = field(default_factory=dict)


class Engine:
    """One serving engine. Subclasses set ``name`` and ``summary`` and override what differs; the
    defaults describe an engine whose profiler perfscope configures per request, writing into a fresh
    folder perfscope makes, one file per run, stopping by itself after ``num_steps``."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""  # one line for --help: what its bench and trace call
    # a short GPU-only profile before the full one, for the host's own time per step (TraceOptions.host_timing)
    host_timing: ClassVar[bool] = False

    def client(self, url: str, *, api_key: str | None = None, timeout: float = 30.0) -> SGLangClient:
        """The engine's HTTP client (server info, profiler, streamed generate)."""
        from perfscope.remote.sglang_api import SGLangClient

        return SGLangClient(url, api_key=api_key, timeout=timeout)

    def check_options(self, opts: TraceOptions) -> None:
        """Raise InputError for an option this engine cannot honour (before anything is contacted)."""

    def by_stage(self, api: SGLangClient, opts: TraceOptions, server: Server, say: Say) -> bool:
        """Whether this profile writes one file per stage (prefill, decode); as asked by default."""
        return bool(opts.by_stage)

    def expected_files(self, server: Server, by_stage: bool) -> int:
        """Trace files one profile writes on this host."""
        return 1

    def profile(self, opts: TraceOptions, server: Server, by_stage: bool) -> dict:
        """What the profiler is asked to record (written to run.json's ``profile``; the tracer adds
        ``output_dir`` first and ``profile_by_stage``). Raises for a server that cannot honour ``opts``."""
        return {"num_steps": opts.steps}

    def output_dir(self, io: HostIO, opts: TraceOptions, server: Server) -> RemoteDir:
        """The folder the profiler writes this run's traces to (made here: a fresh one under --remote-dir)."""
        return RemoteDir(io.mkdtemp(opts.remote_dir), made=True)

    def start(self, api: SGLangClient, profile: dict, *, wait_s: float, server: Server) -> None:
        """Arm the profiler (``/start_profile``), waiting at most ``wait_s`` for the reply."""
        api.start_profile(**profile, request_timeout=wait_s, server_has_gpu=server.has_gpu)

    def refused(self, err: Exception, label: str) -> Exception | None:
        """An error meaning the server refused to start and nothing of this run was armed (so no
        /stop_profile may be sent: it would stop someone else's profile), said for the user; None
        for any other error."""
        return None

    def after_load(
        self, load: TraceLoad, api: SGLangClient, opts: TraceOptions, cancel: threading.Event, label: str, say: Say
    ) -> None:
        """Once the load streams under the armed profiler: what ends the profile (nothing: ``num_steps``)."""

    def extras(
        self, io: HostIO, folder: RemoteDir, out_dir: Path, got: list[RemoteFile], opts: TraceOptions, say: Say
    ) -> dict:
        """Other files of this profile copied into the run folder, as run.json entries (``extra``)."""
        return {}
