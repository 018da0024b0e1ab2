"""Where and how to connect: :class:`SSHTarget` and :func:`parse_target` (spec, options,
``~/.ssh/config``, jump hops)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import paramiko

from perfscope.errors import InputError, RemoteError

DEFAULT_CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to connect. Build it with :func:`parse_target`."""

    host: str
    user: str | None = None
    port: int = 22
    identity: str | None = None
    jump: tuple["SSHTarget", ...] = ()  # hops, the first one is connected to first
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts + /etc/ssh/ssh_known_hosts
    # more files read (not written), as OpenSSH reads every UserKnownHostsFile/GlobalKnownHostsFile
    known_hosts_also: tuple[str, ...] = ()
    accept_new: bool = False
    timeout: float = DEFAULT_CONNECT_TIMEOUT  # TCP connect, banner, auth and channel-open timeouts

    @property
    def label(self) -> str:
        """``user@host:port`` as a user would type it (no secrets are in a target)."""
        u = f"{self.user}@" if self.user else ""
        p = f":{self.port}" if self.port != 22 else ""
        return f"{u}{self.host}{p}"

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is recorded under, as OpenSSH writes it."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


_SPEC = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s\[\]]+)(?::(?P<port>\d+))?$")


def _strip_ssh_url(spec: str) -> str:
    """ProxyJump also takes ``ssh://[user@]host[:port]`` (ssh_config(5))."""
    s = spec.strip()
    return s[len("ssh://") :].rstrip("/") if s.lower().startswith("ssh://") else s


def _split_spec(spec: str) -> tuple[str | None, str, int | None]:
    m = _SPEC.match(spec.strip())
    if not m:
        raise InputError(f"bad host {spec!r}: expected [user@]host[:port]")
    host = m.group("host").strip("[]")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not (0 < port < 65536):
        raise InputError(f"bad port in {spec!r}: expected 1-65535")
    return m.group("user"), host, port


def _ssh_config(path: str | os.PathLike | None) -> paramiko.SSHConfig | None:
    p = Path(path).expanduser() if path else Path("~/.ssh/config").expanduser()
    if not p.is_file():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(p))
    except Exception:  # a config paramiko cannot parse must not stop us: OpenSSH still reads it
        try:
            text = p.read_text(errors="replace")
        except OSError:
            return None
        if re.search(r"^\s*proxycommand\b", text, re.I | re.M):  # never connect directly instead
            raise RemoteError(
                f"{p} has a ProxyCommand and cannot be read here: perfscope does not run "
                "ProxyCommand; use ProxyJump or --jump"
            ) from None
        return None


def parse_target(
    spec: str,
    *,
    user: str | None = None,
    port: int | None = None,
    identity: str | None = None,
    jump: str | None = None,
    known_hosts: str | list[str] | tuple[str, ...] | None = None,
    accept_new: bool = False,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ssh_config: str | os.PathLike | None = None,
    _use_config: bool = True,
    _hops: int = 0,
) -> SSHTarget:
    """``[user@]host[:port]`` plus options -> :class:`SSHTarget`.

    Explicit options win over the spec, which wins over ``~/.ssh/config`` (``HostName``, ``User``,
    ``Port``, ``IdentityFile``, ``ProxyJump`` are honoured). ``jump`` is ``[user@]host[:port]``,
    or several separated by commas, connected in order.
    """
    if _hops > 16:
        raise RemoteError(f"more than 16 jump hops reaching {spec!r}: is ProxyJump a loop in the ssh config?")
    s_user, s_host, s_port = _split_spec(_strip_ssh_url(spec))
    cfg = _ssh_config(ssh_config) if _use_config else None
    c = cfg.lookup(s_host) if cfg else {}
    if c.get("proxycommand") and c["proxycommand"].strip().lower() != "none" and not jump:
        raise RemoteError(
            f"the ssh config gives {s_host} a ProxyCommand ({c['proxycommand'][:80]}), which "
            "perfscope does not run; it will not connect directly instead: use ProxyJump or --jump"
        )
    host = c.get("hostname", s_host)
    user = user or s_user or c.get("user")
    port = port or s_port or (int(c["port"]) if "port" in c else 22)
    if identity is None and c.get("identityfile"):
        # only an IdentityFile written for this host, not ssh's default list
        files = [f for f in c["identityfile"] if Path(f).expanduser().is_file()]
        identity = files[0] if files else None
    also: tuple[str, ...] = ()
    kh_arg = known_hosts  # what the hops get: their own ssh config decides when it is None
    if isinstance(known_hosts, (list, tuple)):  # several files: the first is written to, all are read
        files = [str(k) for k in known_hosts if k]
        known_hosts, also = (files[0] if files else None), tuple(files[1:])
    elif known_hosts is None and (c.get("userknownhostsfile") or c.get("globalknownhostsfile")):
        # the ssh config's files for this host, as ssh reads them (the first user file is written to)
        users = [f for f in (c.get("userknownhostsfile") or "").split() if f.lower() != "none"]
        globs = [
            f for f in (c.get("globalknownhostsfile") or "/etc/ssh/ssh_known_hosts").split() if f.lower() != "none"
        ]
        if not users:
            users = ["~/.ssh/known_hosts"]
        known_hosts, also = users[0], tuple(users[1:] + globs)
    if jump is None and c.get("proxyjump") and c["proxyjump"].lower() != "none":
        jump = c["proxyjump"]
    hops: list[SSHTarget] = []
    if jump:
        for part in jump.split(","):
            part = part.strip()
            if part:
                hop = parse_target(
                    part,
                    known_hosts=kh_arg,
                    accept_new=accept_new,
                    timeout=timeout,
                    ssh_config=ssh_config,
                    _use_config=_use_config,
                    _hops=_hops + 1 + len(hops),
                )
                if hop.identity is None and identity:
                    # unlike ssh -J, hops also try --identity (their own IdentityFile wins)
                    hop = replace(hop, identity=str(Path(identity).expanduser()))
                hops.extend(hop.jump)  # a hop's own ProxyJump comes before it
                hops.append(replace(hop, jump=()))
    return SSHTarget(
        host=host,
        user=user,
        port=int(port),
        identity=str(Path(identity).expanduser()) if identity else None,
        jump=tuple(hops),
        known_hosts=str(Path(known_hosts).expanduser()) if known_hosts else None,
        known_hosts_also=tuple(str(Path(k).expanduser()) for k in also),
        accept_new=accept_new,
        timeout=float(timeout),
    )
