"""Where ``perfscope trace`` reaches a server (:class:`Endpoint`): over SSH (the HTTP API through a
loopback port forward, the host's files over SFTP) or at a URL on this machine; and the first thing
it reads there, the server's configuration."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlparse

from perfscope.errors import PerfscopeError, RemoteError
from perfscope.remote.hostio import HostIO, LocalHost, SSHHost
from perfscope.remote.sglang_api import SGLangClient
from perfscope.remote.ssh import ServerDown, SSHTarget, connect


@dataclass
class Endpoint:
    """Where to trace: an SSH target (server on its loopback ``port``), or a URL on this machine."""

    target: SSHTarget | None = None
    url: str | None = None
    port: int | None = None  # the server's HTTP port on the host (None: TraceOptions.port)

    @property
    def label(self) -> str:
        if self.target is not None:
            return self.target.label
        return urlparse(self.url or "").netloc or "local"


def url_port(url: str) -> int | None:
    """The port of ``url`` (80 / 443 by scheme when it names none); None for a malformed one."""
    try:
        u = urlparse(url if "://" in url else "http://" + url)
        return u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None


@contextlib.contextmanager
def host_io(ep: Endpoint, port: int) -> Iterator[tuple[HostIO, str]]:
    """(the server's host, the base URL of its HTTP API) for as long as the block runs."""
    if ep.target is None:
        yield LocalHost(), (ep.url or "").rstrip("/")
        return
    session = connect(ep.target)
    try:
        with session.forward(port) as fwd:
            yield SSHHost(session), fwd.url
    finally:
        session.close()


def server_info(api: SGLangClient, label: str) -> dict:
    """The server's configuration (/server_info, or what the engine's client builds in its place)."""
    try:
        info = api.server_info()
    except ServerDown:
        raise
    except PerfscopeError as e:
        raise RemoteError(f"cannot read the server configuration on {label}: {e}") from None
    if not isinstance(info, dict):
        raise RemoteError(f"the server on {label} answered /server_info with something that is not a JSON object")
    return info
