"""pytest plugin: a real OpenSSH server on a loopback port, for the SSH tests.

Registered from tests/conftest.py (``pytest_plugins = ["tests.sshd"]``). Fixtures:

* ``sshd`` (session scope) -> :class:`SSHD`: Debian's ``/usr/sbin/sshd -D`` started with a
  generated config on a free 127.0.0.1 port, a generated ed25519 host key, a generated ed25519 user
  key authorised for the current user (root here: ``PermitRootLogin prohibit-password``), and a
  known_hosts file holding the host key. ``sshd.target(**kw)`` builds an
  :class:`perfscope.remote.ssh.SSHTarget` that connects to it.
* ``sshd_factory`` (session scope): ``sshd_factory()`` starts another one (e.g. a second host).

When sshd is missing the tests fail under CI (``CI=true``) and are skipped otherwise.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from net import free_port  # also imported from here by the SSH tests
from need import missing

SSHD_BIN = os.environ.get("PERFSCOPE_TEST_SSHD", "/usr/sbin/sshd")


def need_binary(path_or_name: str, what: str) -> str:
    """The binary's path, or fail (CI) / skip (elsewhere)."""
    found = path_or_name if os.path.isabs(path_or_name) and os.access(path_or_name, os.X_OK) else shutil.which(path_or_name)
    if found:
        return found
    msg = f"{what} ({path_or_name}) is not installed: apt-get install -y openssh-server (tests/install.sh does it)"
    missing(msg)


def keygen(path: Path, kind: str = "ed25519", comment: str = "perfscope-test") -> Path:
    """A fresh unencrypted key pair at path / path.pub."""
    ssh_keygen = need_binary("ssh-keygen", "ssh-keygen")
    for p in (path, path.with_name(path.name + ".pub")):
        if p.exists():
            p.unlink()
    subprocess.run([ssh_keygen, "-q", "-t", kind, "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


def public_line(path: Path) -> str:
    """'type base64' of a key pair (drops the comment)."""
    return " ".join(Path(str(path) + ".pub").read_text().split()[:2])


@dataclass
class SSHD:
    dir: Path
    port: int
    user: str
    user_key: Path
    host_key: Path
    known_hosts: Path
    log: Path
    proc: subprocess.Popen = field(repr=False)
    host: str = "127.0.0.1"

    @property
    def known_hosts_name(self) -> str:
        return f"[{self.host}]:{self.port}"

    @property
    def host_key_line(self) -> str:
        return f"{self.known_hosts_name} {public_line(self.host_key)}\n"

    def target(self, **kw):
        from perfscope.remote.ssh import parse_target

        kw.setdefault("user", self.user)
        kw.setdefault("identity", str(self.user_key))
        kw.setdefault("known_hosts", str(self.known_hosts))
        kw.setdefault("timeout", 10.0)
        kw.setdefault("ssh_config", "/nonexistent")  # the user's ~/.ssh/config must not leak in
        return parse_target(f"{self.host}:{self.port}", **kw)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_sshd(base: Path) -> SSHD:
    sshd_bin = need_binary(SSHD_BIN, "OpenSSH server")
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    host_key = keygen(base / "host_ed25519", comment="perfscope-test-host")
    user_key = keygen(base / "user_ed25519", comment="perfscope-test-user")
    auth = base / "authorized_keys"
    auth.write_text(Path(str(user_key) + ".pub").read_text())
    os.chmod(auth, 0o600)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    user = getpass.getuser()
    last_err = ""
    for _attempt in range(5):
        port = free_port()
        cfg = base / "sshd_config"
        log = base / "sshd.log"
        cfg.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"PidFile {base / 'sshd.pid'}",
                    f"AuthorizedKeysFile {auth}",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "UsePAM no",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "AllowTcpForwarding yes",
                    "AllowAgentForwarding no",
                    "X11Forwarding no",
                    "PrintMotd no",
                    "MaxStartups 100",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    "LogLevel VERBOSE",
                    f"AllowUsers {user}",
                    "",
                ]
            )
        )
        proc = subprocess.Popen(
            [sshd_bin, "-D", "-e", "-f", str(cfg), "-E", str(log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.settimeout(2)
                    if s.recv(64).startswith(b"SSH-"):
                        break
            except OSError:
                time.sleep(0.1)
        else:
            last_err = log.read_text(errors="replace") if log.exists() else ""
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            continue
        known = base / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {public_line(host_key)}\n")
        return SSHD(base, port, user, user_key, host_key, known, log, proc)
    pytest.fail(f"sshd did not start: {last_err[-2000:]}")


@pytest.fixture(scope="session")
def sshd_factory(tmp_path_factory):
    started: list[SSHD] = []

    def make() -> SSHD:
        s = start_sshd(tmp_path_factory.mktemp("sshd"))
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def sshd(sshd_factory) -> SSHD:
    return sshd_factory()


@pytest.fixture(autouse=False)
def no_agent(monkeypatch):
    """Hide any ssh-agent of the developer, so that only the keys a test names are tried."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
