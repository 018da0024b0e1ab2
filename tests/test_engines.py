"""The engine adapters ``perfscope trace`` and ``perfscope bench`` drive (perfscope/capture/engines):
the registry, and each adapter's requests, folders and files on real inputs: the run.json of real
SGLang traces on an H200 (examples/gpu_loop/results: the server info, versions and GPUs they
recorded, and the profile perfscope asked for), real vLLM traces in a profiler folder on this
machine (LocalHost: the filesystem itself). The adapters against live servers: test_real_sglang.py,
test_real_vllm.py, test_trace*.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from clirun import invoke
from paths import GPU_LOOP, VLLM_CPU
from perfscope.capture import engines
from perfscope.capture.engines import Server
from perfscope.capture.engines.vllm import TABLES_DIR
from perfscope.capture.options import TraceOptions
from perfscope.errors import EXIT_INPUT, InputError, RemoteError
from perfscope.remote.hostio import LocalHost
from perfscope.remote.sglang_api import SGLangClient, server_has_gpu
from perfscope.remote.vllm_api import VLLMClient

RUNTIME_KEYS = ("remote_dir_kept", "started", "duration_s", "after_trace")  # the tracer's, not the engine's


def real_sglang_runs() -> list[Path]:
    runs = sorted(p for p in GPU_LOOP.rglob("run.json") if json.loads(p.read_text()).get("kind") == "trace")
    assert len(runs) >= 20, runs
    return runs


# ---------------------------------------------------------------------------------------- registry


def test_registry_names_every_engine_once_in_help_order():
    assert engines.choices() == ["sglang", "vllm"] == list(engines.ENGINES)
    assert engines.DEFAULT in engines.ENGINES
    for name, engine in engines.ENGINES.items():
        assert engine.name == name and engine.summary.startswith(name)
        assert engines.get(name) is engine and engines.get(name.upper()) is engine


def test_an_unknown_engine_is_a_bad_option_naming_the_choices():
    with pytest.raises(InputError) as ei:
        engines.get("TensorRT-LLM")
    assert ei.value.exit_code == EXIT_INPUT
    assert str(ei.value) == "--engine tensorrt-llm: expected sglang or vllm"


@pytest.mark.parametrize("command", [["bench", "--url", "http://127.0.0.1:1"], ["trace", "--url", "http://127.0.0.1:1"]])
def test_the_commands_refuse_an_unknown_engine_before_reaching_a_server(command):
    rc, _, err = invoke(*command, "--engine", "trt")
    assert rc == 2 and "--engine trt: expected sglang or vllm" in err


def test_each_engine_has_its_own_client():
    sgl = engines.get("sglang").client("http://127.0.0.1:30000/", api_key="s3cret", timeout=7)
    vll = engines.get("vllm").client("127.0.0.1:8000", timeout=3)
    assert type(sgl) is SGLangClient and type(vll) is VLLMClient
    assert (sgl.base_url, sgl.timeout) == ("http://127.0.0.1:30000", 7.0)
    assert (vll.base_url, vll.timeout) == ("http://127.0.0.1:8000", 3.0)
    assert "s3cret" not in repr(sgl)


# ------------------------------------------------------------------------------------------ SGLang


def _server(d: dict) -> Server:
    info, gpu = d["server_info"], d.get("gpu") or []
    return Server("h200", info, str((d.get("versions") or {}).get("server") or ""), gpu, server_has_gpu(info, gpu))


@pytest.mark.parametrize("run", real_sglang_runs(), ids=lambda p: str(p.relative_to(GPU_LOOP).parent))
def test_sglang_asks_what_the_real_h200_runs_were_asked(run):
    """From the server each real run met, the adapter builds the profile request that run recorded, and
    expects one file per stage of its one rank (the repository keeps some of those runs' DECODE file only)."""
    d = json.loads(run.read_text())
    recorded = {k: v for k, v in d["profile"].items() if k not in RUNTIME_KEYS}
    by_stage = bool(recorded.get("profile_by_stage"))
    gpu_only = recorded["activities"] == ["GPU"]
    # a full trace's stacks and shapes as the run was asked (trace --no-stack / --no-shapes record False)
    full = {k: recorded[k] for k in ("with_stack", "record_shapes") if not gpu_only and k in recorded}
    opts = TraceOptions(steps=recorded["num_steps"], gpu_only=gpu_only, by_stage=by_stage, **full)
    sglang, server = engines.get("sglang"), _server(d)
    assert server.has_gpu and sglang.host_timing
    profile = {"output_dir": recorded["output_dir"], **sglang.profile(opts, server, by_stage)}
    if by_stage:
        profile["profile_by_stage"] = True
    assert profile == recorded
    expected = sglang.expected_files(server, by_stage)
    assert d["server_info"]["tp_size"] == 1 and expected == (2 if by_stage else 1) >= len(d["files"]) >= 1


def test_sglang_refuses_what_the_server_cannot_do():
    d = json.loads(real_sglang_runs()[0].read_text())
    sglang = engines.get("sglang")
    old = Server("h200", d["server_info"], "0.5.9", d["gpu"], True)
    with pytest.raises(RemoteError, match=r"--profile-prefix needs SGLang 0\.5\.10\+; h200 runs 0\.5\.9"):
        sglang.profile(TraceOptions(profile_prefix="p"), old, False)
    cpu = Server("cpu-box", {**d["server_info"], "device": "cpu"}, "0.5.23", [], False)
    with pytest.raises(InputError, match="--gpu-only: cpu-box reports no GPU"):
        sglang.profile(TraceOptions(gpu_only=True), cpu, False)
    assert sglang.profile(TraceOptions(), cpu, False)["activities"] == ["CPU"]  # never MEM, no GPU where none is
    # an explicit --by-stage keeps its one profile across the stages (start_step would split them)
    assert "start_step" not in sglang.profile(TraceOptions(by_stage=True), cpu, True)


def test_sglang_makes_a_fresh_folder_on_the_host(tmp_path):
    d = json.loads(real_sglang_runs()[0].read_text())
    folder = engines.get("sglang").output_dir(LocalHost(), TraceOptions(remote_dir=str(tmp_path)),
                                              Server("h", d["server_info"], "", [], False, {"uid": os.getuid()}))
    assert folder.made and folder.baseline == set() and Path(folder.path).parent == tmp_path
    assert Path(folder.path).is_dir() and Path(folder.path).name.startswith("perfscope-trace.")


# -------------------------------------------------------------------------------------------- vLLM


def test_vllm_needs_its_profiler_folder_and_takes_no_sglang_only_option():
    vllm = engines.get("vllm")
    with pytest.raises(InputError, match="--engine vllm needs --profile-dir"):
        vllm.check_options(TraceOptions(engine="vllm"))
    for opts in (TraceOptions(engine="vllm", profile_dir="/p", gpu_only=True),
                 TraceOptions(engine="vllm", profile_dir="/p", profile_prefix="x")):
        with pytest.raises(InputError, match="is for SGLang"):
            vllm.check_options(opts)
    vllm.check_options(TraceOptions(engine="vllm", profile_dir="/p"))
    engines.get("sglang").check_options(TraceOptions(gpu_only=True, profile_prefix="x"))
    assert not vllm.host_timing


def test_vllm_profile_says_its_server_configured_it():
    d = json.loads(real_sglang_runs()[0].read_text())
    assert engines.get("vllm").profile(TraceOptions(steps=4), _server(d), False) == {
        "num_steps": 4, "stopped_by": "perfscope", "with_stack": None, "record_shapes": None, "activities": None}


def test_vllm_takes_only_this_runs_traces_and_op_tables_from_its_folder(tmp_path):
    """The real vLLM traces already in the profiler folder are not this run's; nor is an op table vLLM
    left unchanged. The run's worker trace and its table are (the table copied into the run folder)."""
    prof, out = tmp_path / "profiles", tmp_path / "run"
    vllm, io = engines.get("vllm"), LocalHost()
    opts = TraceOptions(engine="vllm", profile_dir=str(prof), timeout=5)
    assert vllm.output_dir(io, opts, Server("h", {}, "", [], False)).baseline == set()  # vLLM makes it at its first trace
    prof.mkdir()
    shutil.copyfile(VLLM_CPU / "plain.json.gz", prof / "rank0.1700000000000000000.pt.trace.json.gz")
    (prof / "rank0.profiler_out.txt").write_text("old table\n")
    os.utime(prof / "rank0.profiler_out.txt", (1_700_000_000, 1_700_000_000))
    folder = vllm.output_dir(io, opts, Server("h", {}, "", [], False))
    assert not folder.made and folder.path == str(prof)
    assert folder.baseline == {"rank0.1700000000000000000.pt.trace.json.gz"}
    assert set(folder.before) == {"rank0.profiler_out.txt"}
    assert vllm.extras(io, folder, out, [], TraceOptions(engine="vllm", timeout=0.1), print) == {}  # unchanged

    new = prof / "rank0.1800000000000000000.pt.trace.json.gz"
    shutil.copyfile(VLLM_CPU / "detailed.json.gz", new)
    (prof / "rank0.profiler_out.txt").write_text("this run's table\n")
    (got,) = [f for f in io.list_traces(str(prof)) if f.name not in folder.baseline]
    said: list[str] = []
    assert vllm.extras(io, folder, out, [got], opts, said.append) == {
        "profiler_tables": [f"{TABLES_DIR}/rank0.profiler_out.txt"]}
    assert (out / TABLES_DIR / "rank0.profiler_out.txt").read_text() == "this run's table\n" and said == []


def test_vllm_says_which_worker_wrote_no_op_table(tmp_path):
    prof = tmp_path / "profiles"
    prof.mkdir()
    shutil.copyfile(VLLM_CPU / "plain.json.gz", prof / "rank1.1800000000000000000.pt.trace.json.gz")
    vllm, io = engines.get("vllm"), LocalHost()
    folder = vllm.output_dir(io, TraceOptions(engine="vllm", profile_dir=str(prof)), Server("h", {}, "", [], False))
    said: list[str] = []
    assert vllm.extras(io, folder, tmp_path / "run", io.list_traces(str(prof)),
                       TraceOptions(engine="vllm", timeout=0.5), said.append) == {}
    assert len(said) == 1 and "vLLM wrote no rank1.profiler_out.txt within 0.5s" in said[0]
