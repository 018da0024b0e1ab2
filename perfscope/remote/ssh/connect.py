"""Connecting: host-key policy, authentication, jump hops, and one-line errors for every failure."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import paramiko

from perfscope.errors import InputError
from perfscope.remote.ssh.errors import AuthRefused, HostKeyChanged, HostKeyUnknown, HostUnreachable
from perfscope.remote.ssh.hostkeys import KnownHostsPolicy, _known_hosts_files, fingerprint, load_lines, prefer_known
from perfscope.remote.ssh.session import SSHSession
from perfscope.remote.ssh.target import SSHTarget


def _connect_one(target: SSHTarget, sock=None, via: str | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()  # its own host-key tables stay empty: KnownHostsPolicy decides
    read, write_to = _known_hosts_files(target)
    lines = load_lines(read)
    client.set_missing_host_key_policy(KnownHostsPolicy(target, lines, write_to, target.accept_new))
    kw = dict(
        hostname=target.host,
        port=target.port,
        username=target.user,
        timeout=target.timeout,
        banner_timeout=target.timeout,
        auth_timeout=target.timeout,
        channel_timeout=target.timeout,
        sock=sock,
        transport_factory=prefer_known(lines, target.known_hosts_name),
        allow_agent=True,
        look_for_keys=target.identity is None,
    )
    if target.identity:
        if not Path(target.identity).is_file():
            raise InputError(f"identity file {target.identity} does not exist")
        kw["key_filename"] = target.identity
    where = target.label + (f" via {via}" if via else "")
    try:
        client.connect(**kw)
    except (HostKeyUnknown, HostKeyChanged):
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        raise HostKeyChanged(
            f"host key of {target.known_hosts_name} CHANGED: it offers {e.key.get_name()} "
            f"{fingerprint(e.key)}, known_hosts has {e.expected_key.get_name()} {fingerprint(e.expected_key)}; "
            "this may be an attack (someone intercepting the connection), so it is refused",
            hint="if the host was really reinstalled, remove the old line with ssh-keygen -R",
        ) from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise AuthRefused(
            f"identity {target.identity or '(default key)'} is passphrase-protected",
            hint="load it into ssh-agent (ssh-add) and run again",
        ) from None
    except paramiko.AuthenticationException:
        client.close()
        who = target.user or "the current user"
        keys = target.identity or "ssh-agent and ~/.ssh keys"
        raise AuthRefused(f"SSH authentication to {where} refused for {who} (tried {keys})") from None
    except socket.gaierror as e:
        client.close()
        raise HostUnreachable(f"cannot resolve {target.host}: {e.strerror or e}") from None
    except (socket.timeout, TimeoutError):
        client.close()
        raise HostUnreachable(f"{where} unreachable: no answer within {target.timeout:g}s") from None
    except paramiko.ssh_exception.NoValidConnectionsError as e:
        client.close()
        reason = "; ".join(sorted({os.strerror(x.errno) if x.errno else str(x) for x in e.errors.values()}))
        raise HostUnreachable(f"{where} unreachable: {reason or e}") from None
    except (paramiko.SSHException, EOFError) as e:
        client.close()
        text = str(e) or type(e).__name__
        if "banner" in text.lower():
            text = f"no SSH banner within {target.timeout:g}s (is this an SSH port?)"
        raise HostUnreachable(f"{where}: SSH handshake failed: {text}") from None
    except OSError as e:
        client.close()
        raise HostUnreachable(f"{where} unreachable: {e.strerror or e}") from None
    t = client.get_transport()
    if t is not None:
        t.set_keepalive(15)
    return client


def connect(target: SSHTarget) -> SSHSession:
    """Connect (through the jump hops, if any) and authenticate. Raises :class:`HostUnreachable`,
    :class:`AuthRefused`, :class:`HostKeyUnknown` or :class:`HostKeyChanged`, all
    :class:`~perfscope.errors.RemoteError` (exit code 3), with one-line messages."""
    hops: list[paramiko.SSHClient] = []
    sock = None
    via = None
    try:
        for i, hop in enumerate(target.jump):
            c = _connect_one(hop, sock=sock, via=via)
            hops.append(c)
            nxt = target.jump[i + 1] if i + 1 < len(target.jump) else target
            sock = _tunnel(c, hop, nxt, target.timeout)
            via = hop.label if via is None else f"{via},{hop.label}"
        client = _connect_one(target, sock=sock, via=via)
    except BaseException:
        for c in reversed(hops):
            c.close()
        raise
    return SSHSession(target, client, hops)


def _tunnel(client: paramiko.SSHClient, hop: SSHTarget, nxt: SSHTarget, timeout: float) -> paramiko.Channel:
    """A direct-tcpip channel from ``hop`` to the next host's SSH port: the next connection's sock."""
    try:
        return client.get_transport().open_channel(
            "direct-tcpip", (nxt.host, nxt.port), ("127.0.0.1", 0), timeout=timeout
        )
    except paramiko.ChannelException as e:
        raise HostUnreachable(
            f"jump host {hop.label} cannot reach {nxt.host}:{nxt.port} ({e.text or 'connect failed'})"
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise HostUnreachable(f"jump host {hop.label} cannot reach {nxt.host}:{nxt.port}: {e}") from None
