"""The options every command that reaches a live server shares (``trace``, ``bench``): how to reach it
over SSH (:class:`SSHOptions` and its options), which engine serves it (``ENGINE``, :func:`engine`), its URL
when no SSH is needed (:func:`server_url`). The options are ``typer.Option`` singletons the commands
declare as parameter defaults, so every command spells and documents them the same way."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import typer

from perfscope.capture import engines
from perfscope.capture.engines import Engine
from perfscope.errors import InputError

if TYPE_CHECKING:  # paramiko and the rest of the transport load when a command reaches a host
    from perfscope.remote.ssh import SSHTarget

HOST_METAVAR = "[USER@]HOST[:SSHPORT]"


# the SSH options: module-level singletons (typer reads them, never changes them), one spelling and
# help for every command
SSH_USER: Any = typer.Option(None, "--ssh-user", help="SSH user (default: from HOST, ~/.ssh/config, or you).")
SSH_PORT: Any = typer.Option(None, "--ssh-port", help="SSH port (default 22).")
IDENTITY: Any = typer.Option(None, "--identity", "-i", help="Private key file (default: ssh-agent and ~/.ssh keys).")
JUMP: Any = typer.Option(None, "--jump", "-J", metavar="[USER@]HOST[:PORT][,...]", help="Jump host(s), like ssh -J.")
KNOWN_HOSTS: Any = typer.Option(
    None,
    "--known-hosts",
    help="known_hosts file to check host keys against (default ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts).",
)
ACCEPT_NEW_HOST_KEY: Any = typer.Option(
    False,
    "--accept-new-host-key",
    help="Record the key of a host never seen before (OpenSSH accept-new). A changed key is refused regardless.",
)
CONNECT_TIMEOUT: Any = typer.Option(10.0, "--connect-timeout", min=1, help="SSH connect/auth timeout, seconds.")


@dataclass(frozen=True)
class SSHOptions:
    """The SSH options of one command line, applied to each ``--host`` it names."""

    user: str | None = None
    port: int | None = None
    identity: Path | None = None
    jump: str | None = None
    known_hosts: Path | None = None
    accept_new: bool = False
    timeout: float = 10.0

    def target(self, host: str) -> SSHTarget:
        """``host`` (``[USER@]HOST[:SSHPORT]`` or a ~/.ssh/config alias) with these options."""
        from perfscope.remote.ssh import parse_target

        return parse_target(
            host,
            user=self.user,
            port=self.port,
            identity=str(self.identity) if self.identity else None,
            jump=self.jump,
            known_hosts=str(self.known_hosts) if self.known_hosts else None,
            accept_new=self.accept_new,
            timeout=self.timeout,
        )


# --engine: one of the registered engines (perfscope.capture.engines), SGLang by default
ENGINE: Any = typer.Option(
    engines.DEFAULT,
    "--engine",
    metavar="|".join(engines.choices()),
    help="The serving engine: " + ", ".join(e.summary for e in engines.ENGINES.values()) + ".",
)


def engine(name: str) -> Engine:
    """The engine ``--engine`` names; InputError (exit 2) listing the choices for any other."""
    return engines.get(name)


def server_url(url: str) -> str:
    """``--url`` checked: http(s), a host, no credentials (the key goes by --api-key-env); a bare
    ``HOST:PORT`` gets ``http://``."""
    full = url if "://" in url else "http://" + url
    try:
        u = urlparse(full)
        u.port  # noqa: B018 - raises ValueError for a port that is no number or out of range
    except ValueError:
        raise InputError(f"--url {url!r}: expected http://HOST:PORT") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise InputError(f"--url {url!r}: expected http://HOST:PORT")
    if u.username or u.password:
        raise InputError("--url must not carry credentials; use --api-key-env")
    return full


def is_local(url: str) -> bool:
    """Whether ``url`` names this machine (localhost, a loopback address)."""
    host = urlparse(url).hostname or ""
    if host in ("localhost", "") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
