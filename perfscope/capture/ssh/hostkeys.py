"""Host-key checking as OpenSSH decides it: known_hosts files, refuse unknown keys or record them
(accept-new), fingerprints.

paramiko's own known_hosts reader matches host names literally, so a host pinned with a pattern
(``[10.0.0.*]:2222``, ``*.cluster``, ``!bastion,*``) looked unknown to it and ``accept-new``
recorded a *changed* key. perfscope therefore reads known_hosts itself, with OpenSSH's rules
(sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT", ssh(1) StrictHostKeyChecking):

* the name looked up is ``host`` on port 22, else ``[host]:port``; patterns are comma-separated,
  ``*`` and ``?`` wildcards, case-insensitive, ``!pattern`` negates (a negated match rules the line
  out whatever else matches), ``|1|salt|hash`` is a hashed name (HMAC-SHA1);
* every file is read (``/etc/ssh/ssh_known_hosts`` and ``~/.ssh/known_hosts``; or ``--known-hosts``
  alone; or the ssh config's ``UserKnownHostsFile``/``GlobalKnownHostsFile`` lists for the host),
  and a new key is written to the first user file; lines that do not parse are skipped, as ssh does;
* the offered key equal to a matching ``@revoked`` line: refused (:class:`HostKeyChanged`);
* equal to a matching plain line: accepted;
* a matching plain line of the same key type but another key: CHANGED, always refused;
* matching lines only of other key types: refused as changed (perfscope is stricter than ssh here);
* a matching ``@cert-authority`` line and no plain key: refused in one line (perfscope does not
  check host certificates; failing closed);
* nothing matches: unknown -> refused (:class:`HostKeyUnknown`), or recorded with accept-new.

The key algorithms already known for the host are offered first in the handshake, as ssh does, so
a host pinned by its RSA key is asked for that key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from perfscope.capture.ssh.errors import HostKeyChanged, HostKeyUnknown
from perfscope.capture.ssh.target import SSHTarget


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key."""
    return _fp(key.asbytes())


def _fp(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


_KNOWN_HOSTS_LOCK = threading.Lock()


def _known_hosts_files(target: SSHTarget) -> tuple[list[Path], Path]:
    """(files to read, the file to write a new key to)."""
    if target.known_hosts:
        p = Path(target.known_hosts)
        return [p, *(Path(k) for k in target.known_hosts_also)], p
    user = Path("~/.ssh/known_hosts").expanduser()
    return [Path("/etc/ssh/ssh_known_hosts"), user], user


@dataclass(frozen=True)
class KnownLine:
    file: str
    lineno: int
    marker: str  # "", "@revoked", "@cert-authority"
    patterns: str
    keytype: str
    blob: bytes

    @property
    def where(self) -> str:
        return f"{self.file}:{self.lineno}"


def _blob_type(blob: bytes) -> str:
    """The key type named inside an SSH public-key blob."""
    try:
        (n,) = struct.unpack(">I", blob[:4])
        return blob[4:4 + n].decode("ascii")
    except (struct.error, UnicodeDecodeError):
        return ""


def parse_known_hosts(data: bytes, name: str = "known_hosts") -> list[KnownLine]:
    """Every usable line of a known_hosts file (comments, blanks and broken lines skipped)."""
    out = []
    for i, raw in enumerate(data.splitlines(), 1):
        line = raw.decode("utf-8", "replace").strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        marker = ""
        if parts[0].startswith("@"):
            marker, parts = parts[0], parts[1:]
            if marker not in ("@revoked", "@cert-authority"):
                continue  # ssh skips unknown markers
        if len(parts) < 3:
            continue
        try:
            blob = base64.b64decode(parts[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        if not blob or _blob_type(blob) != parts[1]:
            continue
        out.append(KnownLine(name, i, marker, parts[0], parts[1], blob))
    return out


def _wild(pattern: str, name: str) -> bool:
    """OpenSSH's match_pattern: ``*`` any run, ``?`` one character, nothing else special."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.S) is not None


def _hashed(pattern: str, name: str) -> bool:
    parts = pattern.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


def match_host(patterns: str, name: str) -> int:
    """1 if ``name`` matches the comma-separated ``patterns``, -1 if a negated pattern matches
    (the line never applies), 0 if none does."""
    name_l = name.lower()
    found = False
    for pat in patterns.split(","):
        neg = pat.startswith("!")
        if neg:
            pat = pat[1:]
        if not pat:
            continue
        hit = _hashed(pat, name) if pat.startswith("|") else _wild(pat.lower(), name_l)
        if hit:
            if neg:
                return -1
            found = True
    return 1 if found else 0


@dataclass
class Verdict:
    status: str  # "ok", "unknown", "changed", "revoked", "other-type", "cert-authority"
    line: KnownLine | None = None
    known_types: tuple[str, ...] = ()


def decide(lines: list[KnownLine], name: str, keytype: str, blob: bytes) -> Verdict:
    """OpenSSH's decision for the key (``keytype``, ``blob``) offered by the host called ``name``."""
    matching = [ln for ln in lines if match_host(ln.patterns, name) == 1]
    for ln in matching:
        if ln.marker == "@revoked" and ln.blob == blob:
            return Verdict("revoked", ln)
    plain = [ln for ln in matching if not ln.marker]
    for ln in plain:
        if ln.blob == blob:
            return Verdict("ok", ln)
    same = [ln for ln in plain if _blob_type(ln.blob) == keytype]
    if same:
        return Verdict("changed", same[0])
    if plain:
        return Verdict("other-type", plain[0], tuple(sorted({ln.keytype for ln in plain})))
    ca = [ln for ln in matching if ln.marker == "@cert-authority"]
    if ca:
        return Verdict("cert-authority", ca[0])
    return Verdict("unknown")


def load_lines(paths: list[Path]) -> list[KnownLine]:
    from perfscope.errors import RemoteError

    lines: list[KnownLine] = []
    for p in paths:
        try:
            if not p.is_file():
                continue
            lines.extend(parse_known_hosts(p.read_bytes(), str(p)))
        except OSError as e:
            raise RemoteError(f"cannot read known_hosts {p}: {e.strerror or e}") from None
    return lines


_ALGS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


def prefer_known(lines: list[KnownLine], name: str):
    """A paramiko ``transport_factory`` that offers the host-key algorithms known for ``name``
    first (as ssh orders them), so the key compared is the one known_hosts has."""
    known = [ln.keytype for ln in lines if not ln.marker and match_host(ln.patterns, name) == 1]

    def factory(*a, **kw):
        t = paramiko.Transport(*a, **kw)
        if known:
            opts = t.get_security_options()
            first = [alg for k in known for alg in _ALGS.get(k, (k,)) if alg in opts.key_types]
            if first:
                opts.key_types = tuple(dict.fromkeys(first + [k for k in opts.key_types if k not in first]))
        return t

    return factory


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Every host key reaches this policy (the client's own host-key tables are left empty) and is
    decided by :func:`decide`; with ``accept_new`` an unknown host's key is recorded."""

    def __init__(self, target: SSHTarget, lines: list[KnownLine], write_to: Path, accept_new: bool):
        self.target, self.lines, self.write_to, self.accept_new = target, lines, write_to, accept_new

    def missing_host_key(self, client, hostname, key):
        name = self.target.known_hosts_name
        blob = key.asbytes()
        keytype = _blob_type(blob) or key.get_name()
        v = decide(self.lines, name, keytype, blob)
        offered = f"{keytype} {_fp(blob)}"
        changed_hint = "if the host was really reinstalled, remove the old line with ssh-keygen -R"
        if v.status == "ok":
            return
        if v.status == "revoked":
            raise HostKeyChanged(f"host key of {name} ({offered}) is marked @revoked in {v.line.where}: refused")
        if v.status == "changed":
            raise HostKeyChanged(
                f"host key of {name} CHANGED: it offers {offered}, {v.line.where} has {v.line.keytype} "
                f"{_fp(v.line.blob)}; this may be an attack (someone intercepting the connection), so it is refused",
                hint=changed_hint)
        if v.status == "other-type":
            raise HostKeyChanged(
                f"host key of {name} changed: it now offers {offered}, but {v.line.where} records "
                f"{', '.join(v.known_types)} for it; this may be an attack (someone intercepting the connection), "
                "so it is refused", hint=changed_hint)
        if v.status == "cert-authority":
            raise HostKeyUnknown(
                f"{v.line.where} trusts a certificate authority for {name}, but perfscope does not check host "
                f"certificates, and the plain key it offers ({offered}) is not listed: refused",
                hint="add the host's own key line to known_hosts")
        if not self.accept_new:
            raise HostKeyUnknown(
                f"host key of {name} is not in {self.write_to} ({offered})",
                hint="check the fingerprint, then add it to known_hosts or pass --accept-new-host-key")
        _append_known_host(self.write_to, name, key)


def _append_known_host(path: Path, hostname: str, key: paramiko.PKey) -> None:
    from perfscope.util.files import atomic_write_bytes

    line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
    with _KNOWN_HOSTS_LOCK:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = path.read_bytes() if path.exists() else b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        atomic_write_bytes(path, old + line, mode=None if path.exists() else 0o600)
