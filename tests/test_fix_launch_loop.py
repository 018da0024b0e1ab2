"""The launch-flag loop a user runs, end to end, against live servers started from a launch script
the test writes: ``perfscope fix ID --launch-file F`` (diff, nothing changed), ``--apply
--restart-cmd CMD`` (backup, edit, restart, health, bench before/after; revert and restart again
when unhealthy or slower), ``--revert`` (byte-identical).

* real SGLang 0.5.23 on CPU (tests/real_engines.py; its pure-torch sgl_kernel stand-in is the only
  thing not SGLang's): chunked-prefill-interference sets --chunked-prefill-size and adds
  --enable-mixed-chunk, and the restarted server's /server_info reports both;
* perfscope's reproduction server: overlap-off on a launch script whose model grows when the flag is
  gone (a harness for "the fixed server is slower", written so on purpose): the change is reverted
  and the server restarted on the original script.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from clirun import run
from net import free_port
from paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # real engines started, fixed and restarted


def cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return run(*args, cwd=REPO, timeout=timeout)


def restart_script(work: Path, launch: Path, slow_unless: str = "") -> Path:
    """Stops the process group of the last start (SIGTERM, then SIGKILL), starts the launch script
    in a new session; returns at once (the server comes up in the background). ``slow_unless``: a
    line that, when the launch script no longer has it, makes the harness start a copy of the
    script with a 300 ms straggler rank added (the launch script itself stays one plain command:
    perfscope refuses words the shell expands into flags)."""
    p = work / "restart.sh"
    start = f'setsid sh "{launch}" </dev/null >/dev/null 2>&1 &\n'
    if slow_unless:
        start = (f'if grep -q -e "{slow_unless}" "{launch}"; then L="{launch}"; else L="{launch}.slow"; '
                 f'sed "s/--threads 1 /--threads 1 --tp-size 2 --straggler-rank 1 --straggler-ms 300 /" "{launch}" > "$L"; fi\n'
                 'setsid sh "$L" </dev/null >/dev/null 2>&1 &\n')
    p.write_text(
        "#!/bin/sh\n"
        f'P="{work}/pid"\n'
        'if [ -f "$P" ]; then\n'
        '  G=$(cat "$P"); kill -TERM "-$G" 2>/dev/null\n'
        '  i=0; while kill -0 "-$G" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done\n'
        '  kill -KILL "-$G" 2>/dev/null\n'
        "fi\n"
        + start +
        'echo $! > "$P"\n')
    return p


def stop(work: Path) -> None:
    pidf = work / "pid"
    if pidf.is_file():
        g = int(pidf.read_text().strip())
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                return
            time.sleep(3)


def healthy(url: str, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=3) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def server_info(url: str) -> dict:
    with urllib.request.urlopen(url + "/server_info", timeout=10) as r:
        return json.loads(r.read())


def test_real_sglang_chunked_prefill_loop(tmp_path):
    from real_engines import SGLANG_ENV, engine_python, write_model

    try:
        py = engine_python("sglang")
    except BaseException as e:  # real_engines skips (or fails under CI=true) when it is not installed
        raise e
    # vocab 32000: perfscope bench draws prompt ids from 100-10000 (any real tokenizer has them) when
    # /server_info does not say the vocab (SGLang does not); ids past the vocab crash SGLang's scheduler
    model = write_model(tmp_path / "model", vocab=32000)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launch = tmp_path / "serve.sh"
    env_lines = "".join(f"export {k}={v}\n" for k, v in SGLANG_ENV.items())
    launch.write_text(
        "#!/bin/sh\n"
        "# real SGLang 0.5.23 on CPU (the test's tiny model, random weights)\n"
        f"{env_lines}"
        "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1\n"
        f"exec {py} -m sglang.launch_server --model-path {model} --device cpu --load-format dummy \\\n"
        "  --skip-tokenizer-init --attention-backend torch_native --disable-overlap-schedule \\\n"
        "  --max-total-tokens 4096 --max-running-requests 4 \\\n"
        "  --chunked-prefill-size 1024 \\\n"
        f"  --host 127.0.0.1 --port {port} >> {tmp_path}/server.log 2>&1\n")
    original = launch.read_bytes()
    restart = restart_script(tmp_path, launch)
    st = ["--state-dir", str(tmp_path / "state"), "--url", url, "--port", str(port)]
    try:
        subprocess.run(["sh", str(restart)], check=True, timeout=30)
        assert healthy(url, 300), (tmp_path / "server.log").read_text()[-3000:]
        assert server_info(url)["chunked_prefill_size"] == 1024

        # without a launch file: the change and the command line of the process on the port
        r = cli("fix", "chunked-prefill-interference", *st, "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["outcome"] == "checked" and out["server_flags"]["--chunked-prefill-size"] == "1024"
        assert out["flag_changes"] == ["set --chunked-prefill-size 512", "add --enable-mixed-chunk"]
        assert out["server_command_line"][1:3] == ["-m", "sglang.launch_server"]
        assert launch.read_bytes() == original

        # the check: the diff of the launch file, nothing written
        r = cli("fix", "chunked-prefill-interference", "--launch-file", str(launch), *st)
        assert r.returncode == 0, r.stderr
        assert "\n-  --chunked-prefill-size 1024 \\\n" in r.stdout and "\n+  --chunked-prefill-size 512 \\\n" in r.stdout
        assert "\n+  --enable-mixed-chunk >> " in r.stdout  # a new continuation line; the redirection kept
        assert launch.read_bytes() == original

        # apply: backup, edit, restart, health, bench before/after (a loose --max-slowdown: the machine
        # is shared, and this test is about the flags reaching the real server)
        out_dir = tmp_path / "fix1"
        r = cli("fix", "chunked-prefill-interference", "--launch-file", str(launch), *st, "--apply",
                "--restart-cmd", f"sh {restart}", "--health-timeout", "300", "--out", str(out_dir),
                "--bench-input-len", "64", "--bench-output-len", "16", "--bench-requests", "2", "--bench-max-requests", "8",
                "--max-slowdown", "5", "--json")
        rep = json.loads(r.stdout)
        rec = json.loads((out_dir / "restart.json").read_text())
        # kept (exit 0), or undecided (exit 1): on a loaded 2-core box SGLang's CPU stream can deliver a
        # request's tokens in one burst (TPOT ~0.03 ms beside 5 ms ones), and a before/after whose bootstrap
        # interval spans --max-slowdown is neither kept nor reverted: the patch stays applied, as the
        # README says. Reverted or failed otherwise is a defect. (The keep/revert decision itself is held by
        # tests/test_noise_real.py and test_repro_slower_after_the_change_is_reverted_and_restarted.)
        why = r.stdout[-3000:] + r.stderr + (tmp_path / "server.log").read_text()[-3000:]
        assert (r.returncode, rec["decision"]) in ((0, "keep"), (1, "undecided")), why
        assert rec["healthy"] is True and not rec.get("reverted"), why
        assert rep["outcome"] == ("applied" if r.returncode == 0 else "failed"), why
        assert rec["tpot_ms_before"] > 0 and rec["tpot_ms_after"] > 0
        assert (out_dir / "before" / "bench.json").is_file() and (out_dir / "after" / "bench.json").is_file()
        info = server_info(url)
        assert info["chunked_prefill_size"] == 512 and info["enable_mixed_chunk"] is True  # the real server took them
        assert b"--enable-mixed-chunk" in launch.read_bytes()

        # applying again changes nothing; revert restores the bytes
        r = cli("fix", "chunked-prefill-interference", "--launch-file", str(launch), *st)
        assert r.returncode == 0 and "already-applied" in r.stdout
        # revert with --restart-cmd: the file restored, the server restarted on it (its flags the original)
        r = cli("fix", "chunked-prefill-interference", "--launch-file", str(launch), *st, "--revert",
                "--restart-cmd", f"sh {restart}", "--health-timeout", "300")
        assert r.returncode == 0 and "reverted" in r.stdout, r.stdout + r.stderr
        assert "answers /health: it runs the original flags" in r.stdout, r.stdout
        assert launch.read_bytes() == original
        info = server_info(url)
        assert info["chunked_prefill_size"] == 1024 and not info.get("enable_mixed_chunk"), info
    finally:
        stop(tmp_path)


def test_repro_slower_after_the_change_is_reverted_and_restarted(tmp_path):
    """The launch script is the harness: without --disable-overlap-schedule it starts the server
    with two TP ranks of which one sleeps 300 ms per forward (so the fixed server is slower, on purpose); perfscope must revert and restart."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launch = tmp_path / "serve.sh"
    launch.write_text(
        "#!/bin/sh\n"
        "# the test's harness (restart.sh) adds a straggler rank when the flag is gone\n"
        f"cd {REPO}\n"
        f"exec {sys.executable} -m examples.repro_server --port {port} --num-layers 2 --hidden-size 64 \\\n"
        "  --num-heads 2 --vocab-size 256 --max-total-tokens 16384 --threads 1 \\\n"
        "  --disable-overlap-schedule \\\n"
        f"  --max-running-requests 4 >> {tmp_path}/server.log 2>&1\n")
    original = launch.read_bytes()
    restart = restart_script(tmp_path, launch, slow_unless="^  --disable-overlap")
    st = ["--state-dir", str(tmp_path / "state"), "--url", url, "--port", str(port)]
    try:
        subprocess.run(["sh", str(restart)], check=True, timeout=30)
        assert healthy(url, 120), (tmp_path / "server.log").read_text()[-3000:]
        assert server_info(url)["num_hidden_layers"] == 2
        out_dir = tmp_path / "fix1"
        r = cli("fix", "overlap-off", "--launch-file", str(launch), *st, "--apply", "--restart-cmd", f"sh {restart}",
                "--health-timeout", "120", "--out", str(out_dir), "--bench-input-len", "32", "--bench-output-len", "16",
                "--bench-requests", "2", "--bench-max-requests", "6", "--max-slowdown", "0.1")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "slower with the patch" in r.stderr and "reverted byte for byte" in r.stderr
        rec = json.loads((out_dir / "restart.json").read_text())
        assert rec["slower"] is True and rec["reverted"] is True and rec["healthy_after_revert"] is True
        assert rec["tpot_ms_after"] > 1.1 * rec["tpot_ms_before"]
        assert launch.read_bytes() == original
        assert server_info(url)["num_hidden_layers"] == 2  # restarted on the original script
    finally:
        stop(tmp_path)
