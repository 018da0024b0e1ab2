"""The SSH transport's errors: all :class:`~perfscope.errors.RemoteError` (exit code 3)."""

from __future__ import annotations

from perfscope.errors import RemoteError


class HostUnreachable(RemoteError):
    """TCP connection to the SSH port failed, timed out, or the peer did not speak SSH."""


class AuthRefused(RemoteError):
    """The SSH server refused every key we offered."""


class HostKeyUnknown(RemoteError):
    """The host's key is not in known_hosts and accept-new was not asked for."""


class HostKeyChanged(RemoteError):
    """The host's key differs from the one in known_hosts: possibly an attack. Always refused."""


class ServerDown(RemoteError):
    """Nothing accepts connections on the forwarded port on the host."""


class CommandFailed(RemoteError):
    """A remote command exited non-zero (only with ``check=True``)."""
