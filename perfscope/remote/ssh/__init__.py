"""SSH transport for perfscope: connect with host-key checking, run quoted commands, forward a port.

Public surface (used by ``perfscope trace`` and by ``perfscope fix --host``)::

    target  = parse_target("user@gpu-box:22", identity="~/.ssh/id_ed25519", jump="bastion")
    with connect(target) as s:                  # -> SSHSession; errors are RemoteError subclasses
        r = s.run(["cat", "/etc/os-release"])   # argv list, every item shlex-quoted; -> CommandResult
        with s.forward(30000) as fwd:           # 127.0.0.1:<ephemeral> here -> 127.0.0.1:30000 there
            fwd.url                             # "http://127.0.0.1:<port>": any HTTP client works
        data = s.read_bytes("/path")            # SFTP
        s.write_bytes_atomic("/path", data)     # SFTP, temp file + posix-rename, keeps the mode
        s.sha256("/path")                       # computed on the host (sha256sum, else python3)
        s.download("/remote", "local", expected_sha256=..., progress=cb)   # atomic, verified

Security rules, as OpenSSH applies them:

* Host keys are checked against known_hosts (``~/.ssh/known_hosts`` and
  ``/etc/ssh/ssh_known_hosts``, or ``--known-hosts PATH`` alone). An unknown key is refused
  (:class:`HostKeyUnknown`) unless ``accept_new`` is set, which records it (like
  ``StrictHostKeyChecking=accept-new``), written atomically. A key that differs from the recorded
  one is always refused (:class:`HostKeyChanged`), whatever ``accept_new`` says. The decision is
  OpenSSH 9.2's, bare-name fallback on a non-22 port included (``hostkeys`` says the rule).
* Authentication: the given identity file, else ssh-agent and the default keys in ``~/.ssh``.
  Passwords are never asked for.
* A port forward listens on 127.0.0.1 only; the server's port is reached through a
  ``direct-tcpip`` channel to the *remote* loopback, so nothing is opened to the network.
* A jump host (``-J``-style, comma-separated chain) is reached first; the next hop's connection
  runs inside a ``direct-tcpip`` channel of the previous one, and every hop's key is checked.

Modules, one per concern: ``errors``, ``target`` (:func:`parse_target`), ``hostkeys`` (known_hosts,
accept-new, fingerprints), ``commands`` (quoting), ``forward`` (:class:`LocalForward`), ``session``
(:class:`SSHSession`), ``connect`` (:func:`connect`, jump hops). Import from this package.
"""

from __future__ import annotations

from perfscope.remote.ssh.commands import CommandResult, quote_argv
from perfscope.remote.ssh.connect import connect
from perfscope.remote.ssh.errors import (
    AuthRefused,
    CommandFailed,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    ServerDown,
)
from perfscope.errors import RemoteError  # noqa: F401  re-exported: perfscope.remote.hostio imports it from here
from perfscope.remote.ssh.forward import LocalForward
from perfscope.remote.ssh.hostkeys import fingerprint
from perfscope.remote.ssh.session import SSHSession
from perfscope.remote.ssh.target import DEFAULT_CONNECT_TIMEOUT, SSHTarget, parse_target  # noqa: F401

__all__ = [
    "SSHTarget",
    "SSHSession",
    "CommandResult",
    "LocalForward",
    "parse_target",
    "connect",
    "quote_argv",
    "fingerprint",
    "HostUnreachable",
    "AuthRefused",
    "HostKeyUnknown",
    "HostKeyChanged",
    "ServerDown",
    "CommandFailed",
]
