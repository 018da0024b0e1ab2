"""Launch-flag fixes: the launch-file parser/editor (shell, systemd, compose) and the five modules
(eager-decode, overlap-off, nccl-allreduce, torch-sampling, chunked-prefill-interference): where
each applies, where it refuses, where the flag is already right; check / apply / revert through the
engine and the CLI (exit codes). The server facts come from a real SGLang 0.5.23 /server_info
(tests/data/sglang-0.5.23-server_info.json, recorded from the real CPU server by
tests/real_engines.py) edited per case; the whole loop against live servers is in
tests/test_fix_launch_loop.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfscope.fixengine import engine
from perfscope.fixengine.host import LocalFixHost
from perfscope.fixengine.launch import FlagChange, LaunchParseError, edit_flags, find_command
from perfscope.fixengine.model import Environment
from perfscope.fixengine.registry import get

from clirun import invoke
from net import free_port
from paths import H200, REPO

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

SERVER_INFO = json.loads((REPO / "tests" / "data" / "sglang-0.5.23-server_info.json").read_text())

SCRIPT = """#!/usr/bin/env bash
# the production launcher (run_tp8_cds16.sh style)
set -euo pipefail
export MODEL=/models/DeepSeek-V3   # the weights
export NCCL_DEBUG=WARN
CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 exec python3 -m sglang.launch_server \\
  --model-path "$MODEL" \\
  --tp 8 \\
  --kv-cache-dtype fp8_e4m3 \\
  --disable-cuda-graph \\
  --disable-overlap-schedule \\
  --disable-custom-all-reduce \\
  --sampling-backend pytorch \\
  --cuda-graph-max-bs 16 \\
  --chunked-prefill-size 16384 \\
  --host 0.0.0.0 --port 30000  # behind the LB
echo "not reached"
"""

UNIT = """[Unit]
Description=SGLang server
After=network-online.target

[Service]
# keep the env file
EnvironmentFile=/etc/sglang.env
ExecStart=-/opt/sglang/bin/python -m sglang.launch_server --model-path ${MODEL} \\
    --tp 2 --disable-cuda-graph --port 30000
Restart=always

[Install]
WantedBy=multi-user.target
"""

COMPOSE_STRING = """services:
  sglang:
    image: lmsysorg/sglang:v0.5.5
    ipc: host
    command: python3 -m sglang.launch_server --model-path /models/m --disable-cuda-graph --port 30000  # v0.5
    environment:
      - HF_TOKEN=${HF_TOKEN}
  proxy:
    image: nginx
"""

COMPOSE_BLOCK = """services:
  sglang:
    image: lmsysorg/sglang:latest
    command:
      - python3
      - -m
      - sglang.launch_server
      - --model-path
      - /models/m
      - --sampling-backend
      - pytorch
      - --disable-overlap-schedule
    ports: ["30000:30000"]
"""

COMPOSE_FLOW = """services:
  sglang:
    command: ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--disable-custom-all-reduce", "--tp", "2"]
"""


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def only_command_lines_changed(before: str, after: str, keep: list[str]) -> None:
    """Every line of ``keep`` (comments, env lines, other keys) is in the edited file, unchanged."""
    for ln in keep:
        assert ln in after.splitlines(), ln


# ------------------------------------------------------------------------------- the parser


def test_shell_script_tokens_and_edit_keep_every_other_byte():
    cmd = find_command("run.sh", SCRIPT.encode())
    assert cmd.kind == "shell" and cmd.engine == "sglang" and cmd.line == 6
    assert cmd.args[0].value == "--model-path" and cmd.args[1].value == "$MODEL"  # kept unexpanded
    changes = [FlagChange("remove", "--disable-cuda-graph"), FlagChange("set", "--cuda-graph-max-bs", "48"),
               FlagChange("add", "--enable-mixed-chunk")]
    after, notes = edit_flags(SCRIPT.encode(), cmd, changes)
    text = after.decode()
    assert "--disable-cuda-graph" not in text and "  --cuda-graph-max-bs 48 \\\n" in text
    assert text.endswith("  --host 0.0.0.0 --port 30000 \\\n  --enable-mixed-chunk  # behind the LB\necho \"not reached\"\n")
    only_command_lines_changed(SCRIPT, text, [ln for ln in SCRIPT.splitlines()
                                              if "cuda-graph" not in ln and "--port" not in ln])
    # only the three edited places differ: the removed line, the value, the added argument
    assert len(SCRIPT.splitlines()) == len(text.splitlines())
    new = find_command("run.sh", after)
    assert new.argv == [t.value for t in cmd.tokens if t.value != "--disable-cuda-graph"
                        ][:0] + new.argv  # reads back
    import shlex
    region = text[text.index("CUDA_VISIBLE"):text.index("  # behind")].replace("\\\n", " ")
    assert shlex.split(region) == new.argv  # what a shell would pass the server
    assert notes == ["remove --disable-cuda-graph", "set --cuda-graph-max-bs 48 (was 16)", "add --enable-mixed-chunk"]


def test_shell_one_line_with_redirections_and_background():
    src = b"nohup python -m sglang.launch_server --model-path m --disable-overlap-schedule --port 1 > log 2>&1 &\nwait\n"
    cmd = find_command("start.sh", src)
    assert cmd.argv[-2:] == ["--port", "1"]  # `> log 2>&1 &` is not part of it
    after, _ = edit_flags(src, cmd, [FlagChange("remove", "--disable-overlap-schedule")])
    assert after == b"nohup python -m sglang.launch_server --model-path m --port 1 > log 2>&1 &\nwait\n"


def test_systemd_execstart():
    cmd = find_command("sglang.service", UNIT.encode())
    assert cmd.kind == "systemd" and cmd.argv[0] == "/opt/sglang/bin/python" and "${MODEL}" in cmd.argv
    after, _ = edit_flags(UNIT.encode(), cmd, [FlagChange("remove", "--disable-cuda-graph"),
                                               FlagChange("set", "--cuda-graph-max-bs", "32")])
    assert after.decode() == UNIT.replace("--tp 2 --disable-cuda-graph --port 30000",
                                          "--tp 2 --port 30000 \\\n    --cuda-graph-max-bs 32")


@pytest.mark.parametrize("src", [COMPOSE_STRING, COMPOSE_BLOCK, COMPOSE_FLOW])
def test_compose_command_forms_read_and_edit_as_yaml_sees_them(src):
    cmd = find_command("docker-compose.yml", src.encode())
    assert cmd.argv == yaml.safe_load(src)["services"]["sglang"]["command"] or cmd.kind == "compose-string"
    changes = [FlagChange("remove", "--disable-cuda-graph"), FlagChange("remove", "--disable-overlap-schedule"),
               FlagChange("remove", "--disable-custom-all-reduce"), FlagChange("set", "--sampling-backend", "flashinfer"),
               FlagChange("set", "--cuda-graph-max-bs", "24")]
    after, _ = edit_flags(src.encode(), cmd, changes)
    doc = yaml.safe_load(after)
    got = doc["services"]["sglang"]["command"]
    argv = got.split() if isinstance(got, str) else got
    assert not any(a.startswith("--disable-") for a in argv)
    assert argv[argv.index("--sampling-backend") + 1] == "flashinfer"
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "24"  # a string in a list, not an int
    # every other key as before
    before = yaml.safe_load(src)
    before["services"]["sglang"].pop("command")
    doc["services"]["sglang"].pop("command")
    assert doc == before
    assert find_command("docker-compose.yml", after).argv == argv


@pytest.mark.parametrize("src,why", [
    ("python -m sglang.launch_server --model-path $(cat /etc/model) --port 1\n", "command substitution"),
    ("python -m sglang.launch_server --model-path `cat m`\n", "command substitution"),
    ("python -m sglang.launch_server --model-path m --po\\\nrt 1\n", "continuation inside a word"),
    ("python -m sglang.launch_server --model-path 'm\n", "unclosed"),
    ("python -m sglang.launch_server --port 1 &\npython -m sglang.launch_server --port 2 &\n", "2 launch commands"),
    ("echo hello\n", "no sglang / vllm launch command"),
    ("python -m sglang.launch_server --port 1\r\n", "CR line ends"),
])
def test_shell_refusals(src, why):
    with pytest.raises(LaunchParseError, match=why):
        find_command("run.sh", src.encode())


@pytest.mark.parametrize("src,why", [
    ("services:\n  s:\n    command: >\n      python3 -m sglang.launch_server --port 1\n", "block scalar"),
    ("services:\n  s:\n    command: \"python3 -m sglang.launch_server --x \\\"a b\\\"\"\n", "escapes"),
    ("services:\n  s:\n    command:\n      - python3\n      - -m\n      - sglang.launch_server\n      - \"--x=\\t\"\n",
     "escapes"),
])
def test_compose_refusals(src, why):
    with pytest.raises(LaunchParseError, match=why):
        find_command("compose.yaml", src.encode())


def test_systemd_hash_is_refused():
    src = "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --port 1 #x\n"
    with pytest.raises(LaunchParseError, match="'#' inside ExecStart"):
        find_command("a.service", src.encode())


def test_a_flag_given_twice_is_not_guessed():
    src = b"python -m sglang.launch_server --cuda-graph-max-bs 8 --cuda-graph-max-bs 16\n"
    with pytest.raises(LaunchParseError, match="given 2 times"):
        edit_flags(src, find_command("r.sh", src), [FlagChange("set", "--cuda-graph-max-bs", "32")])


# ---------------------------------------------------------------------------- the modules


def env_with(**server) -> Environment:
    info = dict(SERVER_INFO)
    info.update({"device": "cuda"}, **server)
    return Environment(host="local", server_args=info, sglang_version=info["version"], gpu_name="NVIDIA H200",
                       compute_cap="9.0")


def write(tmp_path: Path, text: str, name: str = "run.sh") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def req_for(path: Path, tmp_path: Path, facts=None) -> engine.FixRequest:
    return engine.FixRequest(launch_file=str(path), state_dir=str(tmp_path / "state"), source_fix=False,
                             facts=facts or {})


def _finding(fid, **kw):
    return {"findings": [{"id": fid, "predicted_step_ms_after_fix": kw.pop("pred", None), "evidence": kw}]}


# (fix, launch text that needs it, expected argv fragment after, text where the flag is already right)
CASES = {
    "eager-decode": ("--disable-cuda-graph --cuda-graph-max-bs-decode 8", ["--cuda-graph-max-bs-decode 40"],
                     "--cuda-graph-max-bs-decode 64", _finding("eager-decode", decode_batch_sizes=[1, 17, 33], pred=1.4)),
    "overlap-off": ("--disable-overlap-schedule", [], "--tp 1", _finding("overlap-off", gap_between_steps_ms=1.2)),
    "nccl-allreduce": ("--tp 2 --disable-custom-all-reduce", ["--tp 2"], "--tp 2", {}),
    "torch-sampling": ("--sampling-backend pytorch", ["--sampling-backend flashinfer"],
                       "--sampling-backend flashinfer", {}),
    "chunked-prefill-interference": (
        "--chunked-prefill-size 8192", ["--chunked-prefill-size 2048", "--enable-mixed-chunk"],
        "--chunked-prefill-size 512 --enable-mixed-chunk",
        _finding("chunked-prefill-interference", prefill_median_ms=80.0, decode_interval_median_ms=10.0,
                 decode_interval_max_ms=52.0, pred=10.0)),
}
SERVER = {"nccl-allreduce": {"tp_size": 2}}


def launch_text(flags: str) -> str:
    return ("#!/bin/sh\n# start the server\nexport OMP_NUM_THREADS=8\n"
            f"exec python3 -m sglang.launch_server --model-path /m {flags} \\\n  --port 30000\n")


@pytest.mark.parametrize("fid", sorted(CASES))
def test_module_applies_then_reverts_byte_identical(fid, tmp_path):
    bad, want, _, facts = CASES[fid]
    fix = get(fid)
    p = write(tmp_path, launch_text(bad))
    original = p.read_bytes()
    env = env_with(**SERVER.get(fid, {}))
    env.facts.update(facts)
    rep, after, _ = engine.plan(fix, LocalFixHost(), req_for(p, tmp_path, facts), env)
    assert rep.outcome.kind == "checked", rep.outcome.reason
    assert p.read_bytes() == original  # the check wrote nothing
    assert rep.diff.startswith(f"--- a/{p}") and rep.strategy == "flags" and rep.strategy_reason
    rep = engine.apply(fix, LocalFixHost(), req_for(p, tmp_path, facts), env)
    assert rep.outcome.kind == "applied", rep.outcome.reason
    new = find_command(str(p), p.read_bytes())
    for flag in bad.split():
        if flag.startswith("--disable-") or flag == "pytorch":
            assert flag not in new.argv
    s = " ".join(new.argv)
    assert all(w in s for w in want), s
    assert p.read_text().startswith("#!/bin/sh\n# start the server\nexport OMP_NUM_THREADS=8\n")
    # applying twice changes nothing
    again = engine.apply(fix, LocalFixHost(), req_for(p, tmp_path, facts), env)
    assert again.outcome.kind == "already-applied"
    back = engine.revert(fix, LocalFixHost(), req_for(p, tmp_path, facts), env)
    assert back.outcome.kind == "reverted" and p.read_bytes() == original


@pytest.mark.parametrize("fid", sorted(CASES))
def test_module_flag_already_right(fid, tmp_path):
    _, _, good, facts = CASES[fid]
    p = write(tmp_path, launch_text(good))
    env = env_with(**SERVER.get(fid, {}))
    env.facts.update(facts)
    rep, after, _ = engine.plan(get(fid), LocalFixHost(), req_for(p, tmp_path, facts), env)
    assert rep.outcome.kind == "already-applied" and after is None, rep.outcome.reason
    assert "already" in rep.outcome.reason


REFUSALS = {
    "eager-decode": ({"device": "cpu"}, "need a CUDA GPU"),
    "overlap-off": ({"pp_size": 2}, "pipeline parallelism"),
    "nccl-allreduce": ({"tp_size": 2, "nnodes": 2}, "within one node"),
    "torch-sampling": ({"device": "cpu"}, "need a CUDA GPU"),
}


@pytest.mark.parametrize("fid", sorted(REFUSALS))
def test_module_refuses_where_a_fact_does_not_hold(fid, tmp_path):
    server, why = REFUSALS[fid]
    p = write(tmp_path, launch_text(CASES[fid][0]))
    before = p.read_bytes()
    rep = engine.apply(get(fid), LocalFixHost(), req_for(p, tmp_path), env_with(**server))
    assert rep.outcome.kind == "refused" and why in rep.outcome.reason, rep.outcome.reason
    assert p.read_bytes() == before


@pytest.mark.parametrize("fid,server", [("nccl-allreduce", {"tp_size": 2}), ("torch-sampling", {})])
def test_module_refuses_an_amd_gpu(fid, server, tmp_path):
    """Both fixes refuse an AMD GPU (flags.is_amd_gpu); the same call on an NVIDIA name is not refused."""
    p = write(tmp_path, launch_text(CASES[fid][0]))
    before = p.read_bytes()
    env = env_with(**server)
    env.gpu_name = "AMD Instinct MI300X"
    rep = engine.apply(get(fid), LocalFixHost(), req_for(p, tmp_path), env)
    assert rep.outcome.kind == "refused" and "AMD Instinct MI300X" in rep.outcome.reason, rep.outcome.reason
    assert p.read_bytes() == before
    env_nv = env_with(**server)
    rep_nv, _, _ = engine.plan(get(fid), LocalFixHost(), req_for(p, tmp_path / "nv"), env_nv)
    assert rep_nv.outcome.kind != "refused", rep_nv.outcome.reason


@pytest.mark.parametrize("fid", sorted(CASES))
def test_module_refuses_a_version_without_the_flag(fid, tmp_path):
    """The server's /server_info lacks the key: that SGLang has no such flag."""
    fix = get(fid)
    env = env_with(**SERVER.get(fid, {}))
    for k in fix.required_keys:
        env.server_args.pop(k, None)
    p = write(tmp_path, launch_text(CASES[fid][0]))
    rep, _, _ = engine.plan(fix, LocalFixHost(), req_for(p, tmp_path), env)
    assert rep.outcome.kind == "refused" and "does not report" in rep.outcome.reason


def test_nccl_allreduce_skips_a_single_gpu(tmp_path):
    p = write(tmp_path, launch_text("--disable-custom-all-reduce"))
    rep, _, _ = engine.plan(get("nccl-allreduce"), LocalFixHost(), req_for(p, tmp_path), env_with(tp_size=1))
    assert rep.outcome.kind == "skipped" and "single GPU" in rep.outcome.reason


def test_eager_decode_picks_max_bs_from_the_batch_sizes_seen():
    from perfscope_fixes.eager_decode import graph_max_bs_for

    assert [graph_max_bs_for(b) for b in (1, 3, 8, 9, 33, 160)] == [1, 4, 8, 16, 40, 160]


def test_eager_decode_uses_the_max_bs_flag_of_the_servers_version(tmp_path):
    """0.5.23 reports cuda_graph_max_bs_decode (its flag --cuda-graph-max-bs-decode); older SGLang
    reports cuda_graph_max_bs (--cuda-graph-max-bs): the key in /server_info picks the flag."""
    facts = _finding("eager-decode", decode_batch_sizes=[4, 48])
    p = write(tmp_path, launch_text("--disable-cuda-graph"))
    env = env_with()
    env.facts.update(facts)
    rep, after, _ = engine.plan(get("eager-decode"), LocalFixHost(), req_for(p, tmp_path, facts), env)
    assert b"--cuda-graph-max-bs-decode 48" in after and b"--disable-cuda-graph" not in after
    old = env_with(version="0.5.5", cuda_graph_max_bs=16)
    for k in [k for k in old.server_args if k.startswith("cuda_graph_")]:
        if k != "cuda_graph_max_bs":
            old.server_args.pop(k)
    old.facts.update(facts)
    rep, after, _ = engine.plan(get("eager-decode"), LocalFixHost(), req_for(p, tmp_path, facts), old)
    assert b"--cuda-graph-max-bs 48" in after and b"-decode" not in after, rep.outcome.reason
    assert "saw decode batch sizes up to 48" in rep.strategy_reason and "above 16 run eagerly" in rep.strategy_reason


def test_a_vllm_launch_command_is_refused_by_an_sglang_only_fix(tmp_path):
    p = write(tmp_path, "vllm serve /m --max-num-seqs 8\n")
    rep, _, _ = engine.plan(get("torch-sampling"), LocalFixHost(), req_for(p, tmp_path), env_with())
    assert rep.outcome.kind == "refused" and "not vllm" in rep.outcome.reason


def test_eager_decode_on_vllm_drops_enforce_eager(tmp_path):
    p = write(tmp_path, "vllm serve /m --enforce-eager --max-num-seqs 8\n")
    env = Environment(host="local")
    rep = engine.apply(get("eager-decode"), LocalFixHost(), req_for(p, tmp_path), env)
    assert rep.outcome.kind == "applied" and p.read_text() == "vllm serve /m --max-num-seqs 8\n"


# ---------------------------------------------------------------------------------- the CLI


def test_cli_loop_check_apply_revert_and_refusal_exit_codes(tmp_path):
    p = write(tmp_path, SCRIPT)
    original = p.read_bytes()
    st = ["--state-dir", str(tmp_path / "st"), "--port", "0"]
    r = invoke("fix", "overlap-off", "--launch-file", str(p), *st)
    assert r.returncode == 0, r.stderr
    assert "-  --disable-overlap-schedule \\" in r.stdout and "checked:" in r.stdout
    assert p.read_bytes() == original
    r = invoke("fix", "overlap-off", "--launch-file", str(p), "--apply", *st)
    assert r.returncode == 0 and "applied:" in r.stdout, r.stdout + r.stderr
    assert b"--disable-overlap-schedule" not in p.read_bytes()
    r = invoke("fix", "overlap-off", "--launch-file", str(p), "--revert", *st)
    assert r.returncode == 0 and p.read_bytes() == original
    # no --restart-cmd: the running server keeps what the fix changed, and the revert says so
    assert "the running server still has the fix's flags" in r.stdout, r.stdout
    # a file it cannot read exactly: one line, exit 4, nothing written
    bad = write(tmp_path, "python -m sglang.launch_server --model-path $(cat m) --disable-overlap-schedule\n", "bad.sh")
    r = invoke("fix", "overlap-off", "--launch-file", str(bad), "--apply", *st)
    assert r.returncode == 4 and "command substitution" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # --apply without a launch file: a usage error, nothing runs
    r = invoke("fix", "overlap-off", "--apply", *st)
    assert r.returncode == 2 and "--launch-file" in r.stderr


def test_without_a_launch_file_the_change_and_the_servers_command_line_are_printed(tmp_path):
    """A real process listening on a port (python's http.server, started as a launcher would): the
    fix prints the command line /proc shows for it, and changes nothing."""
    import socket
    import time

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        r = invoke("fix", "eager-decode", "--port", str(port), "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["outcome"] == "checked" and out["flag_changes"] == ["remove --disable-cuda-graph"]
        assert out["server_command_line"][1:4] == ["-m", "http.server", str(port)]
        assert out["path"] is None and out["diff"]
    finally:
        proc.terminate()
        proc.wait(10)


# -------------------------------------------- diagnose's fix: line on every shared trace runs

SHARED_WITH_FINDINGS = {
    "mla_pool_eager.json.xz": "fp8-kv-cast", "mla_pool_graph.json.xz": "fp8-kv-cast",
    "mla_pages_eager.json.xz": "eager-decode", "mla_fp8_eager.json.xz": "eager-decode",
    "mla_fp8_graph.json.xz": "overlap-off", "mla_pages_graph.json.xz": "overlap-off",
}


@pytest.mark.parametrize("name", sorted(SHARED_WITH_FINDINGS))
def test_diagnose_fix_line_runs(name, tmp_path):
    """The fix command diagnose prints for each finding of the shared H200 traces, run as printed
    (fp8-kv-cast, a source patch, is pointed at a copy of the repro server's attention module, its
    target here: there is no sglang on this machine)."""
    import shlex

    target = H200 / name
    if SHARED_WITH_FINDINGS[name] == "overlap-off":
        # the graph stepbench traces' ~1 ms host bubble is the profiled host's: it counts when a bench
        # measured it unprofiled (perfscope.analysis.hosttime), so the trace goes in a run folder whose
        # bench says the step cycle is its GPU step + 1.2 ms
        from perfscope.analysis.diagnose import diagnose
        from perfscope.rundir import write_run

        step = diagnose([target]).primary.steps.median_ms
        (tmp_path / "run" / "traces").mkdir(parents=True)
        dst = tmp_path / "run" / "traces" / "1730000000.0-TP-0-DECODE.trace.json.gz"
        dst.write_bytes(target.read_bytes())
        write_run(tmp_path / "run", command=["perfscope", "trace"], engine="sglang",
                  timings={"tpot_ms": step + 2.0, "bench": {"tpot_ms": step + 1.2, "concurrency": 1}},
                  workload={"concurrency": 1}, files=[{"path": dst.relative_to(tmp_path / "run").as_posix()}])
        target = tmp_path / "run"
    r = invoke("diagnose", str(target), "--json")
    assert r.returncode == 0, r.stderr
    cmds = [f["fix_command"] for f in json.loads(r.stdout)["findings"] if f.get("fix")]
    assert cmds, "no finding with a fix"
    for c in cmds:
        argv = shlex.split(c)
        assert argv[:2] == ["perfscope", "fix"] and "--trace" in argv
        extra = ["--port", "0"]
        if argv[2] == "fp8-kv-cast":
            t = tmp_path / "mla_attention.py"
            t.write_bytes((REPO / "examples" / "repro_server" / "mla_attention.py").read_bytes())
            extra += ["--target-file", str(t), "--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer"]
        res = invoke(*argv[1:], *extra)
        assert res.returncode == 0, (c, res.stdout, res.stderr)
        assert "checked:" in res.stdout


@pytest.mark.parametrize("fid", sorted(CASES))
def test_per_fix_help_shows_the_modules_document(fid):
    r = invoke("fix", fid, "--help")
    assert r.returncode == 0, r.stderr
    assert get(fid).title.split(" (")[0] in " ".join(r.stdout.split()) and "How to revert" in r.stdout


def test_a_fix_read_from_a_run_uses_the_traced_servers_port_and_recorded_settings(tmp_path):
    """`perfscope fix ID --trace RUN` without --port: the traced server's port from RUN's run.json (30123 on
    the H200 where the real SGLang ran), not 30000, where another server of this machine may listen (seen:
    a CPU SGLang of a test run described as "the server" of the H200 run); and, with no live /server_info,
    the flags the server was traced with (overlap on there: nothing to change), said as such."""
    import socket

    from paths import GPU_LOOP

    run = GPU_LOOP / "h200-2026-12-01-sglang/pool495000-pages/runs/495000-pages"
    recorded = json.loads((run / "run.json").read_text())["server_info"]
    assert recorded["port"] == 30123 and recorded["disable_overlap_schedule"] is False
    # a process listening on 30000 here, which is not the traced server (skipped if the port is taken)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 30000))
        s.listen(1)
    except OSError:
        s.close()
        s = None
    try:
        r = invoke("fix", "overlap-off", "--trace", run, "--json")
    finally:
        if s is not None:
            s.close()
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "--port 30123, the port recorded for the traced server" in r.stderr
    assert d["server_command_line"] is None  # nothing on 30123 here: no other process taken for the server
    assert d["outcome"] == "already-applied"
    assert any("from the run record" in n for n in d["notes"])
    # an explicit --port still wins, and 0 means: look for no server process
    r = invoke("fix", "overlap-off", "--trace", run, "--port", "0", "--json")
    assert r.returncode == 0 and "port recorded" not in r.stderr, r.stderr
    r = invoke("fix", "overlap-off", "--port", "70000")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--port 70000" in r.stderr, r.stderr
