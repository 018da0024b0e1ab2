"""Host-key checking as OpenSSH does it: known_hosts files, refuse unknown keys or record them
(accept-new), fingerprints."""

from __future__ import annotations

import base64
import hashlib
import threading
from pathlib import Path

import paramiko

from perfscope.capture.ssh.errors import HostKeyChanged, HostKeyUnknown
from perfscope.capture.ssh.target import SSHTarget


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
