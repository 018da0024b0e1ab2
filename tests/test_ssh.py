"""perfscope.remote.ssh against a real OpenSSH server on loopback (tests/sshd.py)."""

from __future__ import annotations

import hashlib
import http.server
import os
import socket
import threading
import urllib.request

import pytest

from perfscope.remote.ssh import (
    AuthRefused,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    ServerDown,
    connect,
    parse_target,
)
from perfscope.errors import EXIT_REMOTE, RemoteError
from sshd import free_port, keygen, public_line

pytestmark = pytest.mark.usefixtures("no_agent")


def test_connect_run_quotes_every_argument(sshd):
    with connect(sshd.target()) as s:
        weird = "a b; echo pwned $(id) 'q' \"dq\""
        r = s.run(["printf", "%s", weird])
        assert r.ok and r.stdout == weird
        r = s.run(["sh", "-c", "exit 7"])
        assert r.rc == 7


def test_unknown_host_key_is_refused(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with pytest.raises(HostKeyUnknown) as ei:
        connect(sshd.target(known_hosts=str(kh)))
    msg = str(ei.value)
    assert "not in" in msg and "SHA256:" in msg and "--accept-new-host-key" in msg
    assert ei.value.exit_code == EXIT_REMOTE
    assert kh.read_text() == ""  # nothing recorded


def test_accept_new_records_the_key_then_it_is_known(sshd, tmp_path):
    kh = tmp_path / "ssh" / "known_hosts"  # folder does not exist yet
    with connect(sshd.target(known_hosts=str(kh), accept_new=True)) as s:
        assert s.run(["true"]).ok
    assert kh.read_text() == sshd.host_key_line
    # known now: plain strict connection works, and nothing is appended twice
    with connect(sshd.target(known_hosts=str(kh))) as s:
        assert s.run(["true"]).ok
    assert kh.read_text() == sshd.host_key_line


def test_accept_new_keeps_other_lines(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    other = "# my hosts\nexample.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb5ZpCfTlQmZ4mBi0JcZXn1v7F4y0JrDqRX6P2mGQ5f"
    kh.write_text(other)  # no trailing newline
    os.chmod(kh, 0o644)
    with connect(sshd.target(known_hosts=str(kh), accept_new=True)):
        pass
    assert kh.read_text() == other + "\n" + sshd.host_key_line
    assert (kh.stat().st_mode & 0o777) == 0o644


@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_host_key_is_always_refused(sshd, tmp_path, accept_new):
    other = keygen(tmp_path / "other_host")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{sshd.known_hosts_name} {public_line(other)}\n")
    before = kh.read_text()
    with pytest.raises(HostKeyChanged) as ei:
        connect(sshd.target(known_hosts=str(kh), accept_new=accept_new))
    assert "attack" in str(ei.value)
    assert kh.read_text() == before


def test_known_under_another_key_type_is_refused_by_accept_new(sshd, tmp_path):
    other = keygen(tmp_path / "other_rsa", kind="rsa")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{sshd.known_hosts_name} {public_line(other)}\n")
    with pytest.raises(HostKeyChanged):
        connect(sshd.target(known_hosts=str(kh), accept_new=True))


def test_wrong_user_key_is_refused(sshd, tmp_path):
    wrong = keygen(tmp_path / "wrong_user")
    with pytest.raises(AuthRefused) as ei:
        connect(sshd.target(identity=str(wrong)))
    assert "refused" in str(ei.value) and str(wrong) in str(ei.value)


def test_missing_identity_file(sshd, tmp_path):
    # a file the user named that is not there is unusable input (exit 2), not a remote failure
    from perfscope.errors import InputError

    with pytest.raises(InputError, match="does not exist"):
        connect(sshd.target(identity=str(tmp_path / "nope")))


def test_passphrase_key_says_use_the_agent(sshd, tmp_path):
    import subprocess

    k = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(k)], check=True)
    with pytest.raises(AuthRefused, match="ssh-agent"):
        connect(sshd.target(identity=str(k)))


def test_unreachable_port(sshd):
    port = free_port()  # nothing listens there
    t = parse_target(f"127.0.0.1:{port}", identity=str(sshd.user_key), known_hosts=str(sshd.known_hosts),
                     timeout=3, ssh_config="/nonexistent")
    with pytest.raises(HostUnreachable, match="unreachable"):
        connect(t)


def test_not_an_ssh_server(sshd):
    # a TCP port that accepts and says nothing: the banner timeout must end it
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        t = parse_target(f"127.0.0.1:{port}", identity=str(sshd.user_key), known_hosts=str(sshd.known_hosts),
                         timeout=1.5, ssh_config="/nonexistent")
        with pytest.raises(HostUnreachable, match="banner|handshake"):
            connect(t)
    finally:
        srv.close()


def test_unresolvable_host(sshd):
    t = parse_target("no-such-host.invalid", identity=str(sshd.user_key), known_hosts=str(sshd.known_hosts),
                     timeout=3, ssh_config="/nonexistent")
    with pytest.raises(HostUnreachable, match="resolve|unreachable"):
        connect(t)


def test_parse_target_spec_and_ssh_config(tmp_path):
    t = parse_target("alice@gpu1:2222", ssh_config="/nonexistent")
    assert (t.user, t.host, t.port, t.label) == ("alice", "gpu1", 2222, "alice@gpu1:2222")
    assert t.known_hosts_name == "[gpu1]:2222"
    t = parse_target("bob@gpu1", user="carol", port=23, ssh_config="/nonexistent")
    assert (t.user, t.port) == ("carol", 23)
    key = tmp_path / "id"
    key.write_text("x")
    cfg = tmp_path / "config"
    cfg.write_text(f"Host box\n  HostName 10.1.2.3\n  User dave\n  Port 2200\n  IdentityFile {key}\n  ProxyJump jh1,eve@jh2:2201\n")
    t = parse_target("box", ssh_config=cfg)
    assert (t.host, t.user, t.port, t.identity) == ("10.1.2.3", "dave", 2200, str(key))
    assert [h.label for h in t.jump] == ["jh1", "eve@jh2:2201"]
    from perfscope.errors import InputError

    with pytest.raises(InputError):  # a host spec that cannot be one is unusable input (exit 2)
        parse_target("a b@c", ssh_config="/nonexistent")


def test_jump_host_chain(sshd):
    # hop through the same sshd: the target connection runs inside a direct-tcpip channel of the
    # hop's connection; the hop's key is checked too and it is offered --identity
    t = sshd.target(jump=f"{sshd.user}@127.0.0.1:{sshd.port}")
    assert [h.identity for h in t.jump] == [str(sshd.user_key)]
    with connect(t) as s:
        assert s.run(["echo", "hi"]).stdout == "hi\n"


def test_jump_host_cannot_reach_next(sshd):
    t = parse_target(f"127.0.0.1:{free_port()}", identity=str(sshd.user_key), known_hosts=str(sshd.known_hosts),
                     jump=f"{sshd.user}@127.0.0.1:{sshd.port}", timeout=5, ssh_config="/nonexistent")
    with pytest.raises(HostUnreachable, match="jump host"):
        connect(t)


def test_jump_host_key_is_checked(sshd, tmp_path):
    kh = tmp_path / "kh"
    kh.write_text("")
    t = sshd.target(jump=f"127.0.0.1:{sshd.port}", known_hosts=str(kh))
    with pytest.raises(HostKeyUnknown):
        connect(t)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_forward_reaches_remote_loopback_only(sshd):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    th = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        with connect(sshd.target()) as s, s.forward(httpd.server_address[1]) as fwd:
            assert fwd.url.startswith("http://127.0.0.1:")
            # the forwarder listens on loopback only
            lst = socket.socket()
            assert fwd._listener.getsockname()[0] == "127.0.0.1"
            lst.close()
            # several concurrent requests through one forwarder
            results = []

            def get(i):
                with urllib.request.urlopen(f"{fwd.url}/x{i}", timeout=10) as r:
                    results.append(r.read().decode())

            ths = [threading.Thread(target=get, args=(i,)) for i in range(8)]
            [t.start() for t in ths]
            [t.join() for t in ths]
            assert sorted(results) == sorted(f"hello /x{i}" for i in range(8))
    finally:
        httpd.shutdown()


def test_forward_to_nothing_is_server_down(sshd):
    with connect(sshd.target()) as s:
        with pytest.raises(ServerDown, match="nothing answers on 127.0.0.1:"):
            s.forward(free_port())


def test_files_roundtrip_sha256_and_atomic_write(sshd, tmp_path):
    src = tmp_path / "remote" / "data.bin"
    src.parent.mkdir()
    data = os.urandom(3 * (1 << 20) + 17)
    src.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    seen = []
    with connect(sshd.target()) as s:
        assert s.sha256(str(src)) == want
        dst = tmp_path / "local" / "copy.bin"
        assert s.download(str(src), dst, expected_sha256=want, progress=lambda d, t: seen.append((d, t))) == want
        assert dst.read_bytes() == data and seen[-1] == (len(data), len(data))
        # a wrong expected hash: no file is left behind
        bad = tmp_path / "local" / "bad.bin"
        with pytest.raises(RemoteError, match="damaged"):
            s.download(str(src), bad, expected_sha256="0" * 64)
        assert not bad.exists() and not list(bad.parent.glob(".bad.bin*"))
        # atomic write keeps the mode
        tgt = tmp_path / "remote" / "conf.py"
        tgt.write_text("old")
        os.chmod(tgt, 0o640)
        s.write_bytes_atomic(str(tgt), b"new")
        assert tgt.read_text() == "new" and (tgt.stat().st_mode & 0o777) == 0o640
        assert s.read_bytes(str(tgt)) == b"new"
        assert [e.filename for e in s.listdir(str(src.parent))] and not [
            p for p in src.parent.iterdir() if p.name.startswith(".")
        ]
        with pytest.raises(RemoteError, match="does not exist"):
            s.read_bytes(str(tmp_path / "missing"))


def test_accept_new_never_records_a_name_ssh_would_not_write(sshd, tmp_path):
    """ssh's check_host_key goes read-only for a host name with any of @?*#[]|'"\\ (a pattern in
    known_hosts); so does perfscope. No such name resolves, so the policy is called directly with
    the real host key; the connect path itself is covered by test_hostkeys.py's table."""
    import paramiko

    from perfscope.remote.ssh.hostkeys import KnownHostsPolicy, load_lines

    key = paramiko.Ed25519Key.from_private_key_file(str(sshd.host_key))
    kh = tmp_path / "kh"
    for host, recorded in (("gpu*1", False), ("gpu#1", False), ("gpu1", True)):
        kh.write_text("")
        t = parse_target(f"{host}:2222", ssh_config="/nonexistent", known_hosts=str(kh), accept_new=True)
        pol = KnownHostsPolicy(t, load_lines([kh]), kh, True)
        if recorded:
            pol.missing_host_key(None, host, key)
            assert kh.read_text() == f"[{host}]:2222 ssh-ed25519 {key.get_base64()}\n"
        else:
            with pytest.raises(HostKeyUnknown, match="never recorded"):
                pol.missing_host_key(None, host, key)
            assert kh.read_text() == ""
