"""What a new user meets first, on a fresh clone, against the real SGLang 0.5.23 on CPU
(tests/real_engines.py): a launch-flag fix checked without --launch-file and without /server_info
(``perfscope fix ID --port P``, the README's form with --host dropped) reads the flags the running
server was really started with, not the ones the finding would imply."""

from __future__ import annotations

import subprocess
import sys

from paths import H200, REPO


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfscope", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_launch_fix_check_reads_the_running_servers_command_line(sglang_server):
    srv = sglang_server
    assert "--disable-overlap-schedule" in srv.cmd and "--disable-cuda-graph" not in srv.cmd
    # eager-decode, checked against an eager trace: the server on the port has no
    # --disable-cuda-graph, so there is nothing to remove (it used to propose removing it, "assuming
    # the launch command has --disable-cuda-graph as the finding implies", while printing the
    # command line that shows it has not)
    r = cli("fix", "eager-decode", "--trace", H200 / "mla_fp8_eager.json.gz", "--port", srv.port)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "remove --disable-cuda-graph" not in r.stdout, r.stdout
    assert "already runs with what eager-decode sets" in r.stdout, r.stdout
    assert f"read from the command line of the process on port {srv.port}" in r.stdout, r.stdout
    # overlap-off: the flag is on that command line, so the change is to remove it
    r = cli("fix", "overlap-off", "--port", srv.port)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "remove --disable-overlap-schedule" in r.stdout and "nothing changed" in r.stdout, r.stdout
    assert srv.healthy()
