"""What a new user meets first, on a fresh clone, against the real SGLang 0.5.23 on CPU
(tests/real_engines.py): ``perfscope fix ID --port P`` on the machine the server runs on (the
README's form with --host dropped) checks the fix against what that server really runs: its
/server_info (as over SSH), or, when that cannot be read, the command line of the process on the
port; never only what the finding would imply."""

from __future__ import annotations

import subprocess

from clirun import invoke, run
from paths import H200, REPO
from perfscope.fixengine import engine
from perfscope.fixengine.host import LocalFixHost
from perfscope.fixengine.model import Environment
from perfscope.fixengine.registry import get


def cli(*args) -> subprocess.CompletedProcess:
    return run(*args, cwd=REPO)


def test_local_fix_check_reads_the_server_on_the_port(sglang_server):
    srv = sglang_server
    assert "--disable-overlap-schedule" in srv.cmd and "--disable-cuda-graph" not in srv.cmd
    # fp8-kv-cast on a server whose KV pool is not FP8: nothing to fix (it said "the pages patch
    # applies cleanly", having read neither kv_cache_dtype nor the backend)
    # (it does not apply: exit 4, said once, on stderr)
    r = cli("fix", "fp8-kv-cast", "--port", srv.port)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "kv_cache_dtype auto" in r.stdout and "backend torch_native" in r.stdout, r.stdout
    assert "skipped: kv_cache_dtype is 'auto'" in r.stderr and "applies cleanly" not in r.stdout, r.stdout + r.stderr
    # eager-decode from an eager H200 trace, against this CPU server: refused for what the server is
    # (it proposed removing a --disable-cuda-graph the server was never started with)
    r = cli("fix", "eager-decode", "--trace", H200 / "mla_fp8_eager.json.xz", "--port", srv.port)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "remove --disable-cuda-graph" not in r.stdout and "runs on cpu" in r.stderr, r.stdout + r.stderr
    # overlap-off: the server has the flag, so the change is to drop it
    r = cli("fix", "overlap-off", "--port", srv.port)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "remove --disable-overlap-schedule" in r.stdout and "nothing changed" in r.stdout, r.stdout
    assert srv.healthy()


def test_without_server_info_the_process_command_line_gives_the_flags(sglang_server):
    """/server_info not read (no --url; e.g. an API key perfscope was not given): the flags come from
    the command line of the process on --port, which the check prints anyway."""
    srv = sglang_server
    req = engine.FixRequest(port=srv.port, source_fix=False,
                            facts={"findings": [{"id": "eager-decode", "ms_per_step": 22.3}]})
    rep = engine.describe_launch(get("eager-decode"), LocalFixHost(), Environment(host="local"), req)
    notes = "\n".join(rep.notes)
    assert f"read from the command line of the process on port {srv.port}" in notes, notes
    assert rep.outcome.kind == "already-applied" and "remove --disable-cuda-graph" not in (rep.diff or ""), rep
    rep = engine.describe_launch(get("overlap-off"), LocalFixHost(), Environment(host="local"), req)
    assert "remove --disable-overlap-schedule" in rep.diff, rep


def test_fix_list_json_is_json():
    """`perfscope fix --list --json`: the fix modules as JSON on stdout and nothing else (--json was
    ignored: the text list came out)."""
    import json

    from perfscope.fixengine.registry import discover

    r = cli("fix", "--list", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [x["id"] for x in d] == sorted(discover())
    fp8 = next(x for x in d if x["id"] == "fp8-kv-cast")
    assert "fp8-kv-cast" in fp8["answers"] and fp8["targets"] and "pages" in fp8["strategies"]


def test_demo_bad_options_are_one_line_exit_2_and_leave_nothing(tmp_path):
    """`perfscope demo --device tpu` started the server anyway and failed with exit 3 ("the
    reproduction server did not start", a torch traceback in its log) and left a run folder."""
    def demo(*args):
        return invoke("demo", *args, cwd=tmp_path)

    cases = [(["--device", "tpu"], "--device tpu: expected cpu, cuda or cuda:N"),
             (["--strategy", "bogus"], "--strategy bogus: expected auto, native or pages")]
    import torch

    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "sees no CUDA GPU here"))
    for args, want in cases:
        r = demo(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and want in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stdout + r.stderr
    assert list(tmp_path.iterdir()) == []


def test_sglang_root_names_the_version_even_with_another_server_on_the_port(sglang_server, tmp_path):
    """--sglang-root T is the tree patched: its version decides the patch, not the sglang of whatever server
    listens on --port here (the real 0.5.23 CPU server: before, its interpreter's 0.5.23 was taken for the
    0.5.14 tree, and applying then reverting failed whenever a server listened on 30000)."""
    from test_fix_fp8_kv_cast import FIX, MLA, sglang_tree

    root = sglang_tree("0.5.14", tmp_path / "site")
    original = (root / MLA).read_bytes()
    host = LocalFixHost()
    req = engine.FixRequest(sglang_root=str(tmp_path / "site"), state_dir=str(tmp_path / "state"),
                            port=sglang_server.port, overrides={"kv_cache_dtype": "fp8_e4m3"})
    env = engine.probe_env(host, req)
    assert env.sglang_version == "0.5.14" and env.sources["sglang_version"].endswith("version.py"), env.sources
    assert any("0.5.23" in n and "the fix reads the tree it patches" in n for n in env.notes), env.notes
    rep = engine.apply(FIX, host, req, env)
    assert rep.outcome.kind == "applied", rep.outcome.reason
    assert engine.revert(FIX, host, req, env).outcome.kind == "reverted"
    assert (root / MLA).read_bytes() == original


def test_diagnose_refuses_a_negative_top_and_a_model_config_that_is_not_one(tmp_path):
    trace = H200 / "mla_pool_graph.json.xz"
    r = cli("diagnose", trace, "--top", "-1")
    assert r.returncode == 2 and "--top" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # a run's run.json given as the model config: said, exit 2, not a silent diagnosis without a floor
    run_json = REPO / "examples/gpu_loop/results/h200-2026-12-01-sglang/pool495000-pages/runs/495000-pages/run.json"
    r = cli("diagnose", trace, "--model-config", run_json)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "not a model's config.json" in r.stderr and r.stdout == ""
    # a real model config still reads (the repro server's DeepSeek-V2-shaped config)
    cfg = REPO / "examples/gpu_loop/sglang/config.json"
    r = cli("diagnose", trace, "--model-config", cfg, "--json")
    assert r.returncode == 0, r.stderr
