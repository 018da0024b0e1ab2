"""`perfscope fix --apply --restart-cmd CMD` restarting a real SGLang 0.5.23 server (on CPU,
tests/real_engines.py) and re-measuring it: the restart, health and revert path against the real
thing, not the emulator.

What is patched: a scratch copy of real SGLang 0.5.23's own
`sglang/srt/layers/attention/flashinfer_mla_backend.py`, taken from the installed wheel (the
fp8-kv-cast fix's target; `--target-file`). The CPU server does not run that file (no MLA, no
FlashInfer on CPU), so the patch changes nothing it computes: what is tested is everything around
it, for real: the before measurement, the byte-exact backup, CMD stopping the real server by its
process group and starting it again on the same port, /health, the after measurement, and, when
CMD reports that the server would not start with the patch, the revert and the restart with the
original. (Launch-flag fixes, which change what a CPU server does, are issue 14's.)"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from paths import REPO
from perfscope.remote.sglang_api import SGLangClient
from real_engines import engine_python, start_sglang, write_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a real SGLang on CPU

MARKER = b"perfscope fp8-kv-cast"
OVERRIDES = ["--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer", "--gpu-cc", "9.0",
             "--flashinfer-version", "0.7.2", "--sglang-version", "0.5.23", "--strategy", "pages"]
BENCH = ["--bench-input-len", "16", "--bench-output-len", "8", "--bench-requests", "2", "--bench-max-requests", "8"]

# $1 "ok": restart as is. "broken": when the target carries the patch, the server is started with
# a launch flag value SGLang's argument parser rejects (a stand-in for a patch it cannot start
# with), and CMD reports that it died. (An unknown --attention-backend value did not do: with it
# the CPU server came back healthy in a try here.) Each call is logged with the target's state.
RESTART_SH = r"""#!/bin/sh
D=@DIR@
if grep -q 'perfscope fp8-kv-cast' "@TARGET@"; then state=patched; else state=original; fi
echo "$1 $state" >> "$D/calls.log"
if [ -f "$D/server.pid" ]; then
    pid=$(cat "$D/server.pid")
    # the server's process group (it leads it: setsid); dash's kill takes "-PGID" but not "--"
    kill -TERM "-$pid" 2>/dev/null
    i=0
    while kill -0 "-$pid" 2>/dev/null; do
        i=$((i + 1)); [ $i -eq 200 ] && kill -KILL "-$pid" 2>/dev/null; [ $i -ge 300 ] && break; sleep 0.1
    done
    rm -f "$D/server.pid"
fi
EXTRA=
[ "$state" = patched ] && [ "$1" = broken ] && EXTRA="--tp-size not-a-number"
cd "$D"
@ENV@ setsid nohup @CMD@ $EXTRA >> "$D/server.log" 2>&1 < /dev/null &
pid=$!
echo $pid > "$D/server.pid"
i=0
# a bad flag makes the server exit once SGLang has imported enough to parse it: 10-30 s on a loaded
# 2-core box, so that case waits up to 60 s (it ends as soon as the server does); a good start 10 s
n=20; [ -n "$EXTRA" ] && n=120
while [ $i -lt $n ]; do
    # exited (a zombie until this shell ends: kill -0 would still succeed, so ask ps)
    case "$(ps -o stat= -p "$pid" 2>/dev/null)" in
        ""|Z*) echo "the server exited at once (see $D/server.log)" >&2; exit 3;;
    esac
    i=$((i + 1)); sleep 0.5
done
"""


@pytest.fixture
def real_site(tmp_path):
    py = engine_python("sglang")
    src = py.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages" / "sglang" / "srt" / "layers" / "attention" / "flashinfer_mla_backend.py"
    target = tmp_path / "site" / "sglang" / "srt" / "layers" / "attention" / "flashinfer_mla_backend.py"
    target.parent.mkdir(parents=True)
    target.write_bytes(src.read_bytes())
    srv = start_sglang(write_model(tmp_path / "model"), log_dir=tmp_path)
    script = tmp_path / "restart.sh"
    env = " ".join(f"{k}='{v}'" for k, v in srv.env.items())
    script.write_text(RESTART_SH.replace("@DIR@", str(tmp_path)).replace("@TARGET@", str(target))
                      .replace("@ENV@", f"env {env}").replace("@CMD@", " ".join(srv.cmd)))
    (tmp_path / "server.pid").write_text(str(srv.pid))
    try:
        yield tmp_path, target, srv
    finally:
        pid = int((tmp_path / "server.pid").read_text()) if (tmp_path / "server.pid").exists() else srv.pid
        for p in {pid, srv.pid}:
            try:
                os.killpg(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        srv.proc.poll()


def _fix(d: Path, target: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "perfscope", "fix", "fp8-kv-cast", "--target-file", str(target), "--url", url,
           "--state-dir", str(d / "state"), *OVERRIDES, *BENCH, *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


def _calls(d: Path) -> list[str]:
    p = d / "calls.log"
    return p.read_text().split("\n")[:-1] if p.exists() else []


def test_fix_restarts_the_real_server_measures_and_reverts(real_site):
    d, target, srv = real_site
    original = target.read_bytes()
    client = SGLangClient(srv.url)

    # 1. CMD reports that the server does not start with the patch: reverted, restarted, exit 1
    r = _fix(d, target, srv.url, "--apply", "--restart-cmd", f"sh {d / 'restart.sh'} broken",
             "--health-timeout", "300", "--out", str(d / "run1"))
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("perfscope: error:")]
    assert len(errors) == 1 and "reverted byte for byte" in errors[0] and "it answers again" in errors[0], r.stderr
    assert "restart command exited 3" in errors[0]
    assert target.read_bytes() == original
    assert _calls(d) == ["broken patched", "broken original"]
    assert srv.proc.poll() is not None  # the first server was really stopped by CMD
    assert "not-a-number" in (d / "server.log").read_text()  # the real server really refused the flag
    rec = json.loads((d / "run1" / "restart.json").read_text())
    assert rec["healthy"] is False and rec["reverted"] is True and rec["healthy_after_revert"] is True
    assert rec["tpot_ms_before"] > 0
    client.wait_healthy(timeout=30)
    assert client.server_info()["version"] == "0.5.23"

    # 2. a restart that comes back healthy: measured before and after on the real server, kept
    # (the patch changes nothing a CPU server runs: TPOT before and after differ by noise only, which
    # on a busy 2-core machine can pass the 10% default of --max-slowdown)
    r = _fix(d, target, srv.url, "--apply", "--restart-cmd", f"sh {d / 'restart.sh'} ok",
             "--health-timeout", "300", "--max-slowdown", "5", "--out", str(d / "run2"), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["outcome"] == "applied"
    assert _calls(d)[-1] == "ok patched"
    assert MARKER in target.read_bytes()
    rec = json.loads((d / "run2" / "restart.json").read_text())
    assert rec["healthy"] is True and rec["reverted"] is None
    before = json.loads((d / "run2" / "before" / "bench.json").read_text())
    after = json.loads((d / "run2" / "after" / "bench.json").read_text())
    # rounds of 2 until the keep-or-revert decision had its interval (3 a side at least, 8 at most)
    assert 3 <= before["requests"] <= 8 and 3 <= after["requests"] <= 8, (before["requests"], after["requests"])
    assert not before["failed"] and not after["failed"] and rec["decision"] == "keep", rec.get("change")
    assert before["server"]["version"] == after["server"]["version"] == "0.5.23"
    new_pid = int((d / "server.pid").read_text())
    assert new_pid != srv.pid and os.getpgid(new_pid) == new_pid  # a new real server, its own group

    # 3. revert: byte for byte
    r = _fix(d, target, srv.url, "--revert")
    assert r.returncode == 0, r.stderr[-2000:]
    assert hashlib.sha256(target.read_bytes()).hexdigest() == hashlib.sha256(original).hexdigest()
