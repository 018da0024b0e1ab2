"""SSH connections that cannot be made as asked: a port that does not speak SSH, a ProxyCommand
(refused), ssh:// ProxyJump targets and jump loops. One line, no paramiko log.
"""

from __future__ import annotations

import threading

import pytest
from clirun import one_line, popen

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


def test_non_ssh_port_gives_one_line_and_no_paramiko_log(tmp_path):
    """Paramiko's logger printed tracebacks ("Error reading SSH protocol banner") for a silent
    or non-SSH port: its logger has a NullHandler, and perfscope says one line."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]

    def serve():
        for _ in range(3):
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.sendall(b"HTTP/1.0 400 nope\r\n\r\n" * 5)
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    p = popen(["trace", "--host", f"127.0.0.1:{port}", "--known-hosts", str(tmp_path / "kh"), "--connect-timeout", "3",
                  "--out", str(tmp_path / "o")])
    _, err = p.communicate(timeout=60)
    srv.close()
    assert p.returncode == 3
    assert "Exception (client)" not in err and "perfscope: error:" in one_line(err)


def test_proxycommand_is_refused_in_one_line_and_ssh_url_jumps_parse(tmp_path):
    """ProxyCommand was silently ignored (a straight connection to HostName), ssh:// ProxyJump
    misparsed, a ProxyJump loop built ~990 hops: ProxyCommand is refused in one line (also when
    the config does not parse), ssh:// parses, more than 16 hops are refused."""
    from perfscope.errors import RemoteError
    from perfscope.remote.ssh import parse_target

    cfg = tmp_path / "config"
    cfg.write_text("Host gpu\n  HostName 10.0.0.5\n  ProxyCommand nc -X 5 -x proxy:1080 %h %p\n"
                   "Host loopa\n  ProxyJump loopb\nHost loopb\n  ProxyJump loopa\n")
    with pytest.raises(RemoteError, match="ProxyCommand") as ei:
        parse_target("gpu", ssh_config=cfg)
    assert "\n" not in str(ei.value)
    t = parse_target("box", jump="ssh://alice@bastion:2222", ssh_config="/nonexistent")
    assert (t.jump[0].user, t.jump[0].host, t.jump[0].port) == ("alice", "bastion", 2222)
    with pytest.raises(RemoteError, match="loop"):
        parse_target("loopa", ssh_config=cfg)
