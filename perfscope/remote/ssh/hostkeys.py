"""Host-key checking as OpenSSH decides it: known_hosts files, refuse unknown keys or record them
(accept-new), fingerprints.

paramiko's own known_hosts reader matches host names literally, so a host pinned with a pattern
(``[10.0.0.*]:2222``, ``*.cluster``, ``!bastion,*``) looked unknown to it and ``accept-new``
recorded a *changed* key. perfscope therefore reads known_hosts itself, with OpenSSH's rules
(sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT", ssh(1) StrictHostKeyChecking):

* the name looked up is ``host`` on port 22, else ``[host]:port`` (lower-cased, as ssh does);
  patterns are comma-separated, ``*`` and ``?`` wildcards, case-insensitive, ``!pattern`` negates
  (a negated match rules the line out whatever else matches); a host field that starts with ``|``
  is one hashed name ``|1|salt|hash`` (HMAC-SHA1), never a member of a list;
* every file is read (``/etc/ssh/ssh_known_hosts`` and ``~/.ssh/known_hosts``; or ``--known-hosts``
  alone; or the ssh config's ``UserKnownHostsFile``/``GlobalKnownHostsFile`` lists for the host),
  and a new key is written to the first user file; lines that do not parse are skipped, as ssh does.

The decision is OpenSSH 9.2's ``check_host_key`` (sshconnect.c) over ``check_key_in_hostkeys``
(hostfile.c), checked against the real ``ssh -o BatchMode=yes`` in tests/test_hostkeys.py:

* of the plain lines matching the name, one with the offered key: OK; else any plain line (of
  any key type, ssh does not tell types apart here): CHANGED, refused in every mode; else NEW;
* a matching ``@revoked`` line with the offered key overrides OK/CHANGED/NEW: refused;
* ``@cert-authority`` lines never decide a plain key (paramiko offers no certificates), so a host
  with only a CA line is NEW to ssh; perfscope refuses it in every mode (with accept-new ssh would
  record the plain key: trust-on-first-use that bypasses the CA the user pinned; the one deliberate
  difference, asserted as such in the test);
* NEW on a port other than 22: ssh looks again under the bare ``host`` name, quietly; the key found
  there (OK, and not @revoked there) accepts; anything else there (another key, a revoked one,
  nothing) leaves it NEW;
* NEW: refused (:class:`HostKeyUnknown`) with StrictHostKeyChecking=yes, or recorded under the
  looked-up name (``[host]:port``), unhashed, in the first user file with accept-new.

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

from perfscope.remote.ssh.errors import HostKeyChanged, HostKeyUnknown
from perfscope.remote.ssh.target import SSHTarget


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
        return blob[4 : 4 + n].decode("ascii")
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


def _hashed(field: str, name: str) -> bool:
    """ssh's match_maybe_hashed for a host field starting with ``|``: the whole field is one
    ``|1|salt|hash`` (a list after it, or a bad salt, matches nothing)."""
    parts = field.split("|")
    if len(parts) != 4 or parts[0] or parts[1] != "1":
        return False
    try:
        salt, want = base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(salt) != 20:
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


def match_host(patterns: str, name: str) -> int:
    """1 if ``name`` matches the host field ``patterns``, -1 if a negated pattern matches (the line
    never applies), 0 if none does."""
    name_l = name.lower()
    if patterns.startswith("|"):
        return 1 if _hashed(patterns, name_l) else 0
    found = False
    for pat in patterns.split(","):
        neg = pat.startswith("!")
        if neg:
            pat = pat[1:]
        if _wild(pat.lower(), name_l):
            if neg:
                return -1
            found = True
    return 1 if found else 0


@dataclass
class Verdict:
    status: str  # "ok", "unknown", "changed", "revoked"
    line: KnownLine | None = None
    known_types: tuple[str, ...] = ()
    name: str = ""  # the name the decision was made under
    ca: KnownLine | None = None  # a @cert-authority line for the host (only to explain "unknown")


def _check(lines: list[KnownLine], name: str, blob: bytes) -> Verdict:
    """ssh's check_key_in_hostkeys for a plain key: OK, CHANGED, NEW ("unknown"), REVOKED."""
    matching = [ln for ln in lines if match_host(ln.patterns, name) == 1]
    plain = [ln for ln in matching if not ln.marker]
    ca = next((ln for ln in matching if ln.marker == "@cert-authority"), None)
    v = Verdict("unknown", name=name, ca=ca)
    hit = next((ln for ln in plain if ln.blob == blob), None)
    if hit is not None:
        v = Verdict("ok", hit, name=name)
    elif plain:
        v = Verdict("changed", plain[-1], tuple(sorted({ln.keytype for ln in plain})), name=name)
    rev = next((ln for ln in matching if ln.marker == "@revoked" and ln.blob == blob), None)
    if rev is not None:
        v = Verdict("revoked", rev, name=name)
    return v


def decide(lines: list[KnownLine], name: str, keytype: str, blob: bytes, bare: str | None = None) -> Verdict:
    """OpenSSH's decision for the key (``keytype``, ``blob``) offered by the host looked up as
    ``name``; ``bare`` is the host without the port (given where the port is not 22): a NEW key
    is looked up again under it, as ssh's check_host_key does."""
    v = _check(lines, name, blob)
    if v.status == "unknown" and bare is not None and bare != name:
        b = _check(lines, bare, blob)
        if b.status == "ok":
            return b
    return v


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


_UNRECORDABLE = "@?*#[]|'\"\\"


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Every host key reaches this policy (the client's own host-key tables are left empty) and is
    decided by :func:`decide`; with ``accept_new`` an unknown host's key is recorded."""

    def __init__(self, target: SSHTarget, lines: list[KnownLine], write_to: Path, accept_new: bool):
        self.target, self.lines, self.write_to, self.accept_new = target, lines, write_to, accept_new

    def missing_host_key(self, client, hostname, key):
        name = self.target.known_hosts_name.lower()
        bare = self.target.host.lower() if self.target.port != 22 else None
        blob = key.asbytes()
        keytype = _blob_type(blob) or key.get_name()
        v = decide(self.lines, name, keytype, blob, bare)
        offered = f"{keytype} {_fp(blob)}"
        changed_hint = "if the host was really reinstalled, remove the old line with ssh-keygen -R"
        if v.status == "ok":
            return
        if v.status == "revoked":
            raise HostKeyChanged(f"host key of {name} ({offered}) is marked @revoked in {v.line.where}: refused")
        if v.status == "changed":
            if keytype in v.known_types:
                has = f"{v.line.where} has {v.line.keytype} {_fp(v.line.blob)}"
            else:
                has = f"{v.line.where} records {', '.join(v.known_types)} for it"
            raise HostKeyChanged(
                f"host key of {name} CHANGED: it offers {offered}, {has}; this may be an attack "
                "(someone intercepting the connection), so it is refused",
                hint=changed_hint,
            )
        ca = (
            f" ({v.ca.where} trusts a certificate authority for it, but the host offers a plain key)"
            if v.ca is not None
            else ""
        )
        if v.ca is not None:
            # Deliberately stricter than ssh: with accept-new, ssh records a plain key for a host its
            # known_hosts vouches for by a CA. perfscope cannot check host certificates (paramiko offers
            # none), so trust-on-first-use would bypass the CA the user pinned: fail closed, in every mode.
            raise HostKeyUnknown(
                f"host key of {name} cannot be checked ({offered}){ca}: refused",
                hint="add the host's plain key to known_hosts yourself, after checking its fingerprint",
            )
        if not self.accept_new:
            raise HostKeyUnknown(
                f"host key of {name} is not in {self.write_to} ({offered}){ca}",
                hint="check the fingerprint, then add it to known_hosts or pass --accept-new-host-key",
            )
        if any(c in self.target.host for c in _UNRECORDABLE):
            raise HostKeyUnknown(  # ssh's check_host_key will not write such a name either
                f"host key of {name} is not in {self.write_to} ({offered}), and a host name with any of "
                f"{_UNRECORDABLE} is never recorded",
                hint="add the key to known_hosts yourself",
            )
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
