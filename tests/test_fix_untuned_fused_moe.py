"""untuned-fused-moe's fix: SGLang's config naming and search on the real SGLang 0.5.23 install, and
check / apply / revert on a copy of its configs folder, the tuner running SGLang's own fused-MoE
kernel on CPU under Triton's interpreter (tiny shapes). On CPU the tuner replaces SGLang's
token/expert alignment op (sgl-kernel, CUDA only) with a torch stand-in; the GEMM kernel is SGLang's."""

from __future__ import annotations

import dataclasses

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clirun import invoke
from perfscope.analysis.moe_config import LOADER_RELDIR, config_file_name, lookup, scan_log, version_dir
from perfscope.errors import InputError
from real_engines import engine_python

HERE = Path(__file__).resolve().parent
TUNER = HERE.parent / "fixes/untuned_fused_moe/tune_script.py"
_NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=([^,]+)\.json$")


def _install(py: Path) -> Path:
    root = py.parent.parent / "lib"
    hits = sorted(root.glob("python3*/site-packages/sglang"))
    assert hits, f"no sglang package under {root}"
    return hits[0]


def _configs(py: Path) -> Path:
    return _install(py) / LOADER_RELDIR / "configs"


@pytest.mark.slow
def test_file_names_and_search_follow_the_installed_sglang():
    py = engine_python("sglang")
    cfg = _configs(py)
    dirs = [d.name for d in cfg.iterdir() if d.is_dir()]
    # every plain (no dtype) file SGLang ships is named as config_file_name writes it
    plain = [(d, f.name) for d in dirs for f in (cfg / d).iterdir() if _NAME.match(f.name)]
    assert len(plain) > 20
    for d, n in plain:
        e, nn, dev = _NAME.match(n).groups()
        assert config_file_name(int(e), int(nn), dev.replace("_", " ")) == n
    exists = lambda d, n: (cfg / d / n).is_file()  # noqa: E731
    d, n = plain[0]
    v = d[len("triton_"):].replace("_", ".")
    assert lookup(dirs, exists, n, v) == ("exact", d)
    # another Triton version: SGLang's fallback, the newest folder holding the name
    newest = max((x for x in dirs if exists(x, n)), key=lambda x: tuple(int(p) for p in x[7:].split("_")))
    assert lookup(dirs, exists, n, "99.0.0") == ("fallback", newest)
    v2_lite = config_file_name(64, 1408, "NVIDIA H200")
    assert v2_lite == "E=64,N=1408,device_name=NVIDIA_H200.json"
    assert lookup(dirs, exists, v2_lite, "3.8.0") == ("default", None)
    assert version_dir("3.6.0") == "triton_3_6_0"


@pytest.mark.slow
def test_log_lines_in_sglang_wording():
    # the three lines of SGLang's loader (0.5.13.post1 and 0.5.23 word them alike), read from its source
    py = engine_python("sglang")
    src = (_install(py) / LOADER_RELDIR / "fused_moe_triton_config.py").read_text()
    assert "Using default MoE kernel config. Performance might be sub-optimal! " in src
    assert "Fallback to triton version" in src and "Using MoE kernel config from" in src
    p = "/s/configs/triton_3_6_0/E=64,N=1408,device_name=NVIDIA_H200.json"
    log = (f"[x] Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {p}, you "
           "can create them with https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton\n"
           f"[x] Config file not found at {p}. Fallback to triton version 3.4.0 and use MoE kernel config from "
           "/s/configs/triton_3_4_0/E=64,N=1408,device_name=NVIDIA_H200.json. Performance might be sub-optimal!\n")
    got = scan_log(log)
    assert [(x.kind, x.path) for x in got] == [("default", p), ("fallback", p)]
    assert got[1].used.endswith("triton_3_4_0/E=64,N=1408,device_name=NVIDIA_H200.json")


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture()
def install_copy(tmp_path):
    py = engine_python("sglang")
    src = _install(py)
    dst = tmp_path / "site" / "sglang"
    shutil.copytree(src / LOADER_RELDIR / "configs", dst / LOADER_RELDIR / "configs")
    for f in ("_version.py", "version.py"):
        shutil.copy2(src / f, dst / f)
    return py, dst


def test_check_apply_revert_on_a_copy_of_the_install(install_copy, tmp_path, monkeypatch):
    from perfscope.fixengine import engine
    from perfscope.fixengine.host import LocalFixHost
    from perfscope.fixengine.registry import get

    py, root = install_copy
    fix = get("untuned-fused-moe")
    monkeypatch.setattr(fix, "max_candidates", 1)  # Triton's interpreter: one candidate beside the default
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    finding = {"id": "untuned-fused-moe", "evidence": {"moe_shape": {"E": 4, "N": 64, "top_k": 2, "hidden": 128,
                                                                     "moe_layers": 1}, "batch": 4}}
    req = engine.FixRequest(sglang_root=str(root), python=str(py), state_dir=str(tmp_path / "state"),
                            overrides={"gpu_name": "NVIDIA H200"}, facts={"findings": [finding]})
    host = LocalFixHost()
    before = _tree(root)
    want = root / LOADER_RELDIR / "configs" / "triton_3_8_0" / "E=4,N=64,device_name=NVIDIA_H200.json"

    rep, after, det = engine.plan(fix, host, req)
    assert rep.outcome.kind == "checked", rep.outcome.reason
    assert rep.path == str(want) and not want.exists()
    assert det.variant == "default" and det.facts["batches"] == [1, 4]
    assert any("tune_script.py" in n for n in rep.notes) and _tree(root) == before
    assert any("runs its default config" in n for n in rep.notes) and "bounded at 240 s" in rep.strategy_reason
    # fix --budget SECONDS (the request's budget_s) bounds the tuning instead, and the check shows it
    breq = dataclasses.replace(req, facts={**req.facts, "budget_s": 60.0})
    brep, _, _ = engine.plan(fix, host, breq)
    assert "bounded at 60 s" in brep.strategy_reason and any("--budget-s 60.0" in n for n in brep.notes)

    rep = engine.apply(fix, host, req)
    assert rep.outcome.kind == "applied", rep.outcome.reason
    cfg = json.loads(want.read_text())
    assert sorted(cfg) == ["1", "4"] and all(set(v) <= {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K",
                                                        "GROUP_SIZE_M", "num_warps", "num_stages"} for v in cfg.values())
    man = json.loads(Path(rep.manifest).read_text())
    assert man["absent_before"] is True and "created_dir" not in man
    assert any(n.startswith("batch 4: default") for n in rep.notes)
    assert engine.plan(fix, host, req)[0].outcome.kind == "already-applied"

    rep = engine.revert(fix, host, req)
    assert rep.outcome.kind == "reverted", rep.outcome.reason
    assert not want.exists() and _tree(root) == before


@pytest.mark.slow
def test_stopped_tuner_leaves_nothing(tmp_path):
    py = engine_python("sglang")
    out = tmp_path / "o" / "tuned.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.Popen([str(py), str(TUNER), "--E", "4", "--N", "64", "--hidden", "128", "--topk", "2",
                          "--batches", "1", "--device", "cpu", "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, env=env)
    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    so, _ = p.communicate(timeout=120)
    res = json.loads(so.strip().splitlines()[-1])
    assert p.returncode == 130 and res["ok"] is False and "nothing written" in res["reason"]
    assert not out.exists() and not (out.parent.exists() and any(out.parent.iterdir()))


def test_tuner_dry_run_plans_the_served_sizes_only():
    r = subprocess.run(["python3", str(TUNER), "--E", "64", "--N", "1408", "--hidden", "2048", "--topk", "6",
                        "--batches", "1,16,64", "--dry-run", "--device", "cpu"], capture_output=True, text=True,
                       timeout=60)
    res = json.loads(r.stdout)
    assert r.returncode == 0 and res["dry_run"] and res["batches"] == [1, 16, 64]
    assert all(0 < n <= 60 for n in res["candidates"].values())  # pruned: SGLang's own sweep is 1,920 per size


def test_gather_reads_the_model_config_from_model_path(install_copy, tmp_path):
    # the server's model_path (from /server_info or the run record) -> its config.json on the host: the shape
    # per rank (TP 2 halves N), the file's name, and what SGLang loads now from the install
    from perfscope.fixengine.host import LocalFixHost
    from perfscope.fixengine.model import Environment
    from perfscope.fixengine.registry import get

    _, root = install_copy
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 27,
        "first_k_dense_replace": 1, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
        "moe_intermediate_size": 1408}))
    fix = get("untuned-fused-moe")
    env = Environment(sglang_root=str(root), triton_version="3.8.0", gpu_name="NVIDIA H200",
                      facts={"server_info": {"model_path": str(model), "tp_size": 2, "cuda_graph_max_bs": 48}})
    fix.gather(LocalFixHost(), env)
    m = env.facts["moe"]
    assert m["shape"] == {"E": 64, "N": 704, "hidden": 2048, "topk": 6}
    assert m["name"] == "E=64,N=704,device_name=NVIDIA_H200.json" and m["version_dir"] == "triton_3_8_0"
    assert m["loads_now"] == {"kind": "default", "folder": None} and m["batches"] == [1, 48]
    spec = fix.target_for(env, None)
    assert spec.creates and spec.relpath.endswith("configs/triton_3_8_0/E=64,N=704,device_name=NVIDIA_H200.json")
    env2 = Environment(sglang_root=str(root), triton_version="3.8.0", gpu_name="NVIDIA H200",
                       facts={"server_info": {"model_path": str(tmp_path / "none")}})
    fix.gather(LocalFixHost(), env2)
    assert fix.target_for(env2, None).relpath is None
    assert any("config.json" in x for x in env2.facts["moe"]["could_not_read"])


def test_apply_makes_the_triton_folder_and_revert_removes_it(install_copy, tmp_path, monkeypatch):
    # a Triton version with no configs folder in the install yet: apply makes it, revert removes file and folder.
    # The tuning step is replaced by fixed winners here (the tuner itself runs in the test above).
    from perfscope.fixengine import engine
    from perfscope.fixengine.host import LocalFixHost
    from perfscope.fixengine.registry import get

    py, root = install_copy
    fix = get("untuned-fused-moe")
    won = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
                 "num_stages": 3}}

    def prepare(host, env, target, path, det):
        det.facts["tuned"] = (json.dumps(won, indent=4) + "\n").encode()

    monkeypatch.setattr(fix, "prepare", prepare)
    finding = {"id": "untuned-fused-moe", "evidence": {"moe_shape": {"E": 64, "N": 1408, "top_k": 6, "hidden": 2048}}}
    req = engine.FixRequest(sglang_root=str(root), python=str(py), state_dir=str(tmp_path / "state"),
                            overrides={"gpu_name": "NVIDIA H200", "triton_version": "3.99.0"},
                            facts={"findings": [finding]})
    before = _tree(root)
    rep = engine.apply(fix, LocalFixHost(), req)
    assert rep.outcome.kind == "applied", rep.outcome.reason
    made = root / LOADER_RELDIR / "configs" / "triton_3_99_0"
    assert json.loads((made / "E=64,N=1408,device_name=NVIDIA_H200.json").read_text()) == won
    assert json.loads(Path(rep.manifest).read_text())["created_dir"] == str(made)
    # the server is down (the H200 run reverted after stopping it): no model shape to name the file from,
    # so an apply cannot say what it would write, but --revert finds what this fix created in the install
    gone = dataclasses.replace(req, facts={})
    with pytest.raises(InputError, match="cannot name the file to write"):
        engine.plan(fix, LocalFixHost(), gone)
    rep = engine.revert(fix, LocalFixHost(), gone)
    assert rep.outcome.kind == "reverted", rep.outcome.reason
    assert not made.exists() and _tree(root) == before
    rep = engine.revert(fix, LocalFixHost(), gone)  # once more: nothing left to revert, nothing touched
    assert rep.outcome.kind == "skipped" and _tree(root) == before


def test_budget_is_refused_where_it_means_nothing(tmp_path):
    """--budget bounds GPU time a fix spends on the server: only untuned-fused-moe's tuning has one;
    out of 10-3600 s, or on another fix: one line, exit 2, nothing read or changed."""
    for args, want in ((["fp8-kv-cast", "--budget", "60"], "fp8-kv-cast spends no GPU time"),
                       (["untuned-fused-moe", "--budget", "3"], "expected 10-3600 seconds")):
        r = invoke("fix", *args, cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and want in lines[0], r.stderr
