"""SGLang: perfscope configures its profiler per request (``/start_profile`` with a fresh folder made on
the host, ``num_steps``, activities, by-stage files on 0.4.7+); the profile stops by itself."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from perfscope.capture.engines.base import Engine, RemoteDir, Say, Server, version_tuple
from perfscope.capture.options import TraceOptions
from perfscope.capture.wait import expected_files
from perfscope.errors import InputError, PerfscopeError, RemoteError

if TYPE_CHECKING:
    from perfscope.remote.hostio import HostIO
    from perfscope.remote.sglang_api import SGLangClient

# how long a by-stage profile waits for requests to leave the server (perfscope's own, cut when the
# host-timing profile's load stopped, leave within a step or two)
IDLE_WAIT_S = 5.0


class SGLang(Engine):
    name = "sglang"
    summary = "sglang (/generate)"
    host_timing = True

    def by_stage(self, api: SGLangClient, opts: TraceOptions, server: Server, say: Say) -> bool:
        by_stage = opts.by_stage
        if by_stage is None:
            by_stage = version_tuple(server.version) >= (0, 4, 7)
        return by_stage and stage_profile_safe(api, opts, server.label, say)

    def expected_files(self, server: Server, by_stage: bool) -> int:
        return expected_files(server.info, by_stage)

    def profile(self, opts: TraceOptions, server: Server, by_stage: bool) -> dict:
        from perfscope.remote.sglang_api import profile_activities

        profile: dict = {
            "num_steps": opts.steps,
            "with_stack": opts.with_stack,
            "record_shapes": opts.record_shapes,
            "activities": profile_activities(server.info, server.gpu),
        }
        if opts.gpu_only:
            if not server.has_gpu:
                raise InputError(
                    f"--gpu-only: {server.label} reports no GPU (device {server.info.get('device')!r}): "
                    "nothing to record"
                )
            profile.update(activities=["GPU"], with_stack=False, record_shapes=False)
        if not by_stage and (not server.version or version_tuple(server.version) >= (0, 4, 10)):
            # start at the next forward step: SGLang then refuses (HTTP 500) while another profile
            # runs, where a plain /start_profile silently throws that one away and starts anew
            profile["start_step"] = 1
        if opts.profile_prefix:
            if server.version and version_tuple(server.version) < (0, 5, 10):
                raise RemoteError(f"--profile-prefix needs SGLang 0.5.10+; {server.label} runs {server.version}")
            profile["profile_prefix"] = opts.profile_prefix
        return profile

    def output_dir(self, io: HostIO, opts: TraceOptions, server: Server) -> RemoteDir:
        path = io.mkdtemp(opts.remote_dir)
        if server.proc.get("uid") is not None and server.proc.get("uid") != _my_uid(io):
            io.chmod(path, 0o777)  # the server runs as another user and must write here
        return RemoteDir(path, made=True)

    def refused(self, err: Exception, label: str) -> Exception | None:
        from perfscope.remote.sglang_api import HTTPStatusError

        if not (isinstance(err, HTTPStatusError) and err.status == 500):
            return None
        # SGLang 0.5.x turns a refused start into a bare 500 (its log has the reason): nothing of
        # ours was armed, and a /stop_profile would stop someone else's
        reply = " ".join((err.body or "").split())[:300]  # redacted with the message (errors.redact)
        said = f" saying {reply!r}" if reply and reply.lower() != "internal server error" else ""
        return HTTPStatusError(
            f"{label} refused /start_profile (HTTP 500){said}: SGLang answers so while a "
            "profile is already running (someone else's?) or when its profiler "
            "cannot start; nothing was armed, and perfscope left it alone",
            status=500,
            body=err.body,
            hint="see the server's log for the reason; try again when that profile ends",
        )


def stage_profile_safe(api: SGLangClient, opts: TraceOptions, label: str, say: Say) -> bool:
    """Whether a by-stage profile can start now. SGLang starts the DECODE file at the first decode batch
    after /start_profile and the EXTEND file at the first prefill; when a decode batch comes first (the
    server already serving requests) and a prefill arrives during the decode capture, that prefill
    starts a second torch profiler over the running one (SGLang 0.5.13 and 0.5.23 alike): the DECODE
    file holds whatever that one recorded, no EXTEND file is ever written, and the
    first is left to itself (SGLang 0.5.13 on an H200, the server still decoding the requests of the
    profile before: the DECODE file came, the EXTEND file never did, and the trace timed out). So a
    by-stage profile starts only on an idle server; otherwise ``--steps`` forward steps go into one
    file per rank (decode and the prefills between them; ``diagnose`` tells them apart). An explicit
    ``--by-stage`` on a busy server is refused. A server that does not report its load (no
    ``/v1/loads``) is profiled by stage as asked."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        try:
            n = api.requests_in_server()
        except PerfscopeError:
            n = None
        if n is None or n == 0:
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if opts.by_stage:
        raise InputError(
            f"--by-stage: {label} is serving {n} request(s); SGLang's by-stage profile then "
            "starts its DECODE file first and never writes the EXTEND one (a second profiler "
            "is started over the first)",
            hint="trace with --no-by-stage (the default picks it on a busy server), or when the server is idle",
        )
    say(
        f"{n} request(s) in the server: profiling {opts.steps} forward steps in one file per rank "
        "(a by-stage profile is safe on an idle SGLang only)"
    )
    return False


def _my_uid(io: HostIO) -> int | None:
    r = io.run(["id", "-u"])
    return int(r.stdout.strip()) if r.ok and r.stdout.strip().isdigit() else None
