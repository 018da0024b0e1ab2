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
  one is always refused (:class:`HostKeyChanged`), whatever ``accept_new`` says.
* Authentication: the given identity file, else ssh-agent and the default keys in ``~/.ssh``.
  Passwords are never asked for.
* A port forward listens on 127.0.0.1 only; the server's port is reached through a
  ``direct-tcpip`` channel to the *remote* loopback, so nothing is opened to the network.
* A jump host (``-J``-style, comma-separated chain) is reached first; the next hop's connection
  runs inside a ``direct-tcpip`` channel of the previous one, and every hop's key is checked.
"""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import re
import select
import shlex
import socket
import stat as stat_mod
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import paramiko

from perfscope.errors import RemoteError

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

DEFAULT_CONNECT_TIMEOUT = 10.0


# --------------------------------------------------------------------------------------- errors


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


# --------------------------------------------------------------------------------------- target


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to connect. Build it with :func:`parse_target`."""

    host: str
    user: str | None = None
    port: int = 22
    identity: str | None = None
    jump: tuple["SSHTarget", ...] = ()  # hops, the first one is connected to first
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts + /etc/ssh/ssh_known_hosts
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


def _split_spec(spec: str) -> tuple[str | None, str, int | None]:
    m = _SPEC.match(spec.strip())
    if not m:
        raise RemoteError(f"bad host {spec!r}: expected [user@]host[:port]")
    host = m.group("host").strip("[]")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not (0 < port < 65536):
        raise RemoteError(f"bad port in {spec!r}")
    return m.group("user"), host, port


def _ssh_config(path: str | os.PathLike | None) -> paramiko.SSHConfig | None:
    p = Path(path).expanduser() if path else Path("~/.ssh/config").expanduser()
    if not p.is_file():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(p))
    except Exception:  # a config paramiko cannot parse must not stop us: OpenSSH still reads it
        return None


def parse_target(
    spec: str,
    *,
    user: str | None = None,
    port: int | None = None,
    identity: str | None = None,
    jump: str | None = None,
    known_hosts: str | None = None,
    accept_new: bool = False,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ssh_config: str | os.PathLike | None = None,
    _use_config: bool = True,
) -> SSHTarget:
    """``[user@]host[:port]`` plus options -> :class:`SSHTarget`.

    Explicit options win over the spec, which wins over ``~/.ssh/config`` (``HostName``, ``User``,
    ``Port``, ``IdentityFile``, ``ProxyJump`` are honoured). ``jump`` is ``[user@]host[:port]``,
    or several separated by commas, connected in order.
    """
    s_user, s_host, s_port = _split_spec(spec)
    cfg = _ssh_config(ssh_config) if _use_config else None
    c = cfg.lookup(s_host) if cfg else {}
    host = c.get("hostname", s_host)
    user = user or s_user or c.get("user")
    port = port or s_port or (int(c["port"]) if "port" in c else 22)
    if identity is None and c.get("identityfile"):
        # only an IdentityFile written for this host, not ssh's default list
        files = [f for f in c["identityfile"] if Path(f).expanduser().is_file()]
        identity = files[0] if files else None
    if jump is None and c.get("proxyjump") and c["proxyjump"].lower() != "none":
        jump = c["proxyjump"]
    hops: list[SSHTarget] = []
    if jump:
        for part in jump.split(","):
            part = part.strip()
            if part:
                hop = parse_target(
                    part, known_hosts=known_hosts, accept_new=accept_new, timeout=timeout,
                    ssh_config=ssh_config, _use_config=_use_config,
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
        accept_new=accept_new,
        timeout=float(timeout),
    )


# ------------------------------------------------------------------------------------ host keys


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


_KNOWN_HOSTS_LOCK = threading.Lock()


def _known_hosts_files(target: SSHTarget) -> tuple[list[Path], Path]:
    """(files to read, the file to write a new key to)."""
    if target.known_hosts:
        p = Path(target.known_hosts)
        return [p], p
    user = Path("~/.ssh/known_hosts").expanduser()
    return [Path("/etc/ssh/ssh_known_hosts"), user], user


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def __init__(self, target: SSHTarget, write_to: Path):
        self.target = target
        self.write_to = write_to

    def missing_host_key(self, client, hostname, key):
        raise HostKeyUnknown(
            f"host key of {self.target.known_hosts_name} is not in {self.write_to} "
            f"({key.get_name()} {fingerprint(key)})",
            hint="check the fingerprint, then add it to known_hosts or pass --accept-new-host-key",
        )


class _AcceptNew(_RefuseUnknown):
    """OpenSSH's accept-new: record an unknown host's key; a *changed* key never reaches here
    (paramiko raises BadHostKeyException first), and a host already known under another key type
    is refused as changed."""

    def __init__(self, target: SSHTarget, write_to: Path, known: paramiko.HostKeys):
        super().__init__(target, write_to)
        self.known = known

    def missing_host_key(self, client, hostname, key):
        if self.known.lookup(hostname):
            raise HostKeyChanged(
                f"host key of {hostname} changed: it now offers {key.get_name()} {fingerprint(key)}, "
                f"but another key is recorded in {self.write_to}; this may be an attack "
                "(someone intercepting the connection), so it is refused",
                hint="if the host was really reinstalled, remove the old line with ssh-keygen -R",
            )
        _append_known_host(self.write_to, hostname, key)


def _append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    from perfscope.util.files import atomic_write_bytes

    line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
    with _KNOWN_HOSTS_LOCK:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = path.read_bytes() if path.exists() else b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        atomic_write_bytes(path, old + line, mode=None if path.exists() else 0o600)


# ------------------------------------------------------------------------------------- commands


def quote_argv(argv: Sequence[str] | str) -> str:
    """One shell command line with every argument quoted. A plain ``str`` is taken as already
    written shell (use it only for fixed text, never with user or server input)."""
    if isinstance(argv, str):
        return argv
    return " ".join(shlex.quote(str(a)) for a in argv)


@dataclass
class CommandResult:
    argv: str
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


# -------------------------------------------------------------------------------------- forward


class LocalForward:
    """127.0.0.1:<ephemeral> on this machine -> ``remote_host:remote_port`` as the SSH host sees
    it, one ``direct-tcpip`` channel per accepted connection. Use as a context manager."""

    def __init__(self, transport: paramiko.Transport, remote_port: int, remote_host: str = "127.0.0.1",
                 *, label: str = "", timeout: float = DEFAULT_CONNECT_TIMEOUT):
        self._transport = transport
        self.remote_host = remote_host
        self.remote_port = int(remote_port)
        self._label = label or "the host"
        self._timeout = timeout
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.5)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._pairs: set[tuple[socket.socket, paramiko.Channel]] = set()
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._accept_loop, name=f"fwd-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _open(self, origin=("127.0.0.1", 0)) -> paramiko.Channel:
        try:
            return self._transport.open_channel(
                "direct-tcpip", (self.remote_host, self.remote_port), origin, timeout=self._timeout
            )
        except paramiko.ChannelException as e:
            where = f"{self.remote_host}:{self.remote_port} on {self._label}"
            if e.code == 1:  # administratively prohibited
                raise RemoteError(
                    f"the SSH server on {self._label} forbids port forwarding, so {where} cannot be reached",
                    hint="set AllowTcpForwarding local (or yes) in its sshd_config",
                ) from None
            raise ServerDown(
                f"nothing answers on {where}: is the inference server running, and on this --port?"
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise RemoteError(f"SSH connection to {self._label} lost while opening a channel: {e}") from None

    def check(self) -> None:
        """Raise :class:`ServerDown` if nothing listens on the remote port (opens and closes one
        channel)."""
        self._open().close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            threading.Thread(target=self._serve, args=(client, addr), daemon=True).start()

    def _serve(self, client: socket.socket, addr) -> None:
        try:
            chan = self._open(addr)
        except RemoteError as e:
            self.last_error = str(e)
            client.close()
            return
        pair = (client, chan)
        with self._lock:
            self._pairs.add(pair)
        try:
            client.setblocking(True)
            while not self._closed.is_set():
                r, _, _ = select.select([client, chan], [], [], 0.5)
                if client in r:
                    data = client.recv(65536)
                    if not data:
                        chan.shutdown_write()
                        # keep reading the reply until the remote side closes
                        while not self._closed.is_set():
                            data = chan.recv(65536)
                            if not data:
                                break
                            client.sendall(data)
                        break
                    chan.sendall(data)
                if chan in r:
                    data = chan.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for c in (chan, client):
                try:
                    c.close()
                except Exception:
                    pass

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            pairs = list(self._pairs)
        for client, chan in pairs:
            for c in (chan, client):
                try:
                    c.close()
                except Exception:
                    pass
        self._thread.join(timeout=2)

    def __enter__(self) -> "LocalForward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -------------------------------------------------------------------------------------- session


class SSHSession:
    """One authenticated connection (plus its jump hops). Thread-safe for commands and channels;
    SFTP calls are serialised. Close it (or use ``with``)."""

    def __init__(self, target: SSHTarget, client: paramiko.SSHClient, hops: list[paramiko.SSHClient]):
        self.target = target
        self._client = client
        self._hops = hops
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.RLock()
        self._forwards: list[LocalForward] = []

    @property
    def transport(self) -> paramiko.Transport:
        t = self._client.get_transport()
        if t is None or not t.is_active():
            raise RemoteError(f"SSH connection to {self.target.label} is closed")
        return t

    # commands ------------------------------------------------------------------------------
    def run(self, argv: Sequence[str] | str, *, timeout: float = 60.0, check: bool = False,
            input: bytes | None = None) -> CommandResult:
        """Run a command on the host. ``argv`` items are each shlex-quoted (a ``str`` is sent as
        is: only for fixed text). Output is decoded as UTF-8 with replacement."""
        line = quote_argv(argv)
        try:
            chan = self.transport.open_session(timeout=self.target.timeout)
            chan.settimeout(timeout)
            chan.exec_command(line)
            if input is not None:
                chan.sendall(input)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:
                if chan.recv_ready():
                    out += chan.recv(65536)
                    continue
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    continue
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    chan.close()
                    raise RemoteError(f"command on {self.target.label} timed out after {timeout:g}s: {line[:120]}")
                select.select([chan], [], [], 0.2)
            rc = chan.recv_exit_status()
            chan.close()
        except RemoteError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError(f"SSH command on {self.target.label} failed: {e}") from None
        res = CommandResult(line, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        if check and rc != 0:
            msg = (res.stderr.strip() or res.stdout.strip()).splitlines()
            raise CommandFailed(
                f"on {self.target.label}: `{line[:120]}` exited {rc}" + (f": {msg[-1][:200]}" if msg else "")
            )
        return res

    # port forwarding -----------------------------------------------------------------------
    def forward(self, remote_port: int, remote_host: str = "127.0.0.1", *, check: bool = True) -> LocalForward:
        """Start a local forwarder to ``remote_host:remote_port`` as seen from the host (default
        its loopback). With ``check`` it first proves something listens there (:class:`ServerDown`)."""
        fwd = LocalForward(self.transport, remote_port, remote_host, label=self.target.label,
                           timeout=self.target.timeout)
        self._forwards.append(fwd)
        if check:
            try:
                fwd.check()
            except BaseException:
                fwd.close()
                raise
        return fwd

    # files ---------------------------------------------------------------------------------
    def sftp(self) -> paramiko.SFTPClient:
        with self._sftp_lock:
            if self._sftp is None:
                try:
                    self._sftp = self._client.open_sftp()
                    ch = self._sftp.get_channel()
                    if ch is not None:
                        ch.settimeout(max(self.target.timeout, 30.0))
                except (paramiko.SSHException, OSError, EOFError) as e:
                    raise RemoteError(f"SFTP is not available on {self.target.label}: {e}") from None
            return self._sftp

    def listdir(self, path: str) -> list[paramiko.SFTPAttributes]:
        """Entries of a remote folder (name, size, mtime, mode)."""
        with self._sftp_lock:
            try:
                return self.sftp().listdir_attr(path)
            except FileNotFoundError:
                raise RemoteError(f"{path} does not exist on {self.target.label}") from None
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"cannot list {path} on {self.target.label}: {e}") from None

    def read_bytes(self, path: str) -> bytes:
        with self._sftp_lock:
            try:
                with self.sftp().open(path, "rb") as f:
                    f.prefetch()
                    return f.read()
            except FileNotFoundError:
                raise RemoteError(f"{path} does not exist on {self.target.label}") from None
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"cannot read {path} on {self.target.label}: {e}") from None

    def write_bytes_atomic(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write a remote file via a temporary file in the same folder and an atomic rename;
        the old file's permission bits are kept (or set to ``mode``)."""
        d, name = posixpath.split(path)
        tmp = posixpath.join(d, f".{name}.perfscope-{os.getpid()}-{threading.get_ident()}.tmp")
        with self._sftp_lock:
            sftp = self.sftp()
            try:
                if mode is None:
                    try:
                        mode = stat_mod.S_IMODE(sftp.stat(path).st_mode or 0) or None
                    except FileNotFoundError:
                        mode = None
                with sftp.open(tmp, "wb") as f:
                    f.set_pipelined(True)
                    f.write(data)
                if mode is not None:
                    sftp.chmod(tmp, mode)
                try:
                    sftp.posix_rename(tmp, path)
                except (IOError, paramiko.SSHException):
                    sftp.rename(tmp, path)  # servers without the posix-rename extension
            except BaseException as e:
                try:
                    sftp.remove(tmp)
                except Exception:
                    pass
                if isinstance(e, (OSError, paramiko.SSHException)):
                    raise RemoteError(f"cannot write {path} on {self.target.label}: {e}") from None
                raise

    def sha256(self, path: str) -> str:
        """sha256 of a remote file, computed on the host."""
        r = self.run(["sha256sum", "--", path], timeout=600)
        if r.ok and re.match(r"^[0-9a-f]{64}\b", r.stdout):
            return r.stdout[:64]
        script = ("import hashlib,sys\nh=hashlib.sha256()\nf=open(sys.argv[1],'rb')\n"
                  "for b in iter(lambda: f.read(1<<20), b''): h.update(b)\nprint(h.hexdigest())")
        r2 = self.run(["python3", "-c", script, path], timeout=600)
        if r2.ok and re.match(r"^[0-9a-f]{64}$", r2.stdout.strip()):
            return r2.stdout.strip()
        why = (r.stderr.strip() or r2.stderr.strip() or "no sha256sum or python3").splitlines()[-1]
        raise RemoteError(f"cannot hash {path} on {self.target.label}: {why[:200]}")

    def download(self, remote: str, local: str | os.PathLike, *, expected_sha256: str | None = None,
                 progress: Callable[[int, int], None] | None = None) -> str:
        """Copy a remote file here atomically (temp file + rename) and return its sha256. With
        ``expected_sha256`` a mismatch deletes the copy and raises :class:`RemoteError`.
        ``progress(done_bytes, total_bytes)`` is called as data arrives."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.part")
        h = hashlib.sha256()
        try:
            with self._sftp_lock:
                sftp = self.sftp()
                total = sftp.stat(remote).st_size or 0
                done = 0
                with sftp.open(remote, "rb") as src, open(tmp, "wb") as dst:
                    src.prefetch(total)
                    while True:
                        block = src.read(1 << 20)
                        if not block:
                            break
                        dst.write(block)
                        h.update(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
                    dst.flush()
                    os.fsync(dst.fileno())
            digest = h.hexdigest()
            if expected_sha256 and digest != expected_sha256:
                raise RemoteError(
                    f"{remote} from {self.target.label} arrived damaged: sha256 {digest[:12]}... "
                    f"but the host has {expected_sha256[:12]}..."
                )
            os.replace(tmp, local)
            return digest
        except FileNotFoundError:
            raise RemoteError(f"{remote} does not exist on {self.target.label}") from None
        except (paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"copying {remote} from {self.target.label} failed: {e}") from None
        finally:
            if tmp.exists():
                tmp.unlink()

    def remove(self, paths: Iterable[str], folder: str | None = None) -> None:
        """Delete files (and then the folder, if empty) over SFTP; errors are ignored."""
        with self._sftp_lock:
            sftp = self.sftp()
            for p in paths:
                try:
                    sftp.remove(p)
                except Exception:
                    pass
            if folder:
                try:
                    sftp.rmdir(folder)
                except Exception:
                    pass

    # lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        for f in self._forwards:
            f.close()
        self._forwards.clear()
        with self._sftp_lock:
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except Exception:
                    pass
                self._sftp = None
        for c in [self._client, *reversed(self._hops)]:
            try:
                c.close()
            except Exception:
                pass

    def __enter__(self) -> "SSHSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -------------------------------------------------------------------------------------- connect


def _connect_one(target: SSHTarget, sock=None, via: str | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    read, write_to = _known_hosts_files(target)
    known = paramiko.HostKeys()
    for p in read:
        if p.is_file():
            try:
                known.load(str(p))
                client.get_host_keys().load(str(p))
            except (OSError, paramiko.SSHException) as e:
                raise RemoteError(f"cannot read known_hosts {p}: {e}") from None
    client.set_missing_host_key_policy(
        _AcceptNew(target, write_to, known) if target.accept_new else _RefuseUnknown(target, write_to)
    )
    kw = dict(
        hostname=target.host,
        port=target.port,
        username=target.user,
        timeout=target.timeout,
        banner_timeout=target.timeout,
        auth_timeout=target.timeout,
        channel_timeout=target.timeout,
        sock=sock,
        allow_agent=True,
        look_for_keys=target.identity is None,
    )
    if target.identity:
        if not Path(target.identity).is_file():
            raise AuthRefused(f"identity file {target.identity} does not exist")
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
