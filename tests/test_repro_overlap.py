"""The reproduction server's overlap scheduler (examples/repro_server/scheduler.py), run for real on
CPU, where it runs the same code path with nothing to overlap: it must give the normal loop's greedy
tokens (concurrent requests, EOS mid-stream, one-token requests), free every pool row, keep one
``step[...]`` annotation per forward, and report itself in /server_info as SGLang does. The CUDA
side (pinned copies, events, graph replay) cannot run here; run_loop.py runs it on a GPU."""

from __future__ import annotations

from paths import topen

import gzip
import json
import time
from pathlib import Path

import pytest

import need

from perfscope.load.reader import repair_names
from perfscope.remote.sglang_api import SGLangClient
from reproserver import start_repro

torch = need.module("torch")

from examples.repro_server.model import ModelConfig, ModelRunner  # noqa: E402
from examples.repro_server.scheduler import Req, Scheduler  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the reproduction server

POOL = 4000


def _tokens(r) -> tuple[list, str]:
    """A request's streamed tokens and its finish reason, as the scheduler puts them on r.out."""
    toks = []
    while True:
        kind, payload = r.out.get(timeout=120)
        assert kind == "token", payload
        toks.append(payload[0])
        if payload[1]:
            return toks, payload[1]


def _serve(overlap: bool, specs: list[dict], eos: int | None = None) -> tuple[list, int, Scheduler]:
    """Submit every request before the scheduler starts (the batches are then the same in both
    loops), collect each request's (tokens, finish reason)."""
    cfg = ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, vocab_size=256)
    runner = ModelRunner(cfg, max_total_tokens=POOL, device="cpu")
    sched = Scheduler(runner, overlap=overlap)
    if eos is not None:
        sched.EOS_ID = eos
    reqs = [Req(rid=str(i), input_ids=s["ids"], max_new_tokens=s["n"], temperature=s.get("t", 0.0),
                ignore_eos=s.get("ignore_eos", True)) for i, s in enumerate(specs)]
    for r in reqs:
        sched.submit(r)
    sched.start()
    try:
        out = [_tokens(r) for r in reqs]
        deadline = time.monotonic() + 10
        while sched.running and time.monotonic() < deadline:  # the last step is read, then freed
            time.sleep(0.01)
    finally:
        sched.shutdown()
    assert sched.error is None
    return out, runner.allocator.available_size(), sched


SPECS = [{"ids": [1, 2, 3, 4, 5], "n": 12}, {"ids": [7, 8, 9], "n": 6}, {"ids": [3] * 20, "n": 9},
         {"ids": [5, 6], "n": 1}]


def test_overlap_gives_the_normal_loops_greedy_tokens():
    normal, free_n, sn = _serve(False, SPECS)
    over, free_o, so = _serve(True, SPECS)
    assert [len(t) for t, _ in normal] == [12, 6, 9, 1]
    assert over == normal
    assert free_n == free_o == POOL  # every pool row back
    assert so.overlap and not sn.overlap
    # one forward per step, each timed once: the extend, then 11 decodes (the longest request)
    modes = [m for m, _, _ in so.step_times]
    assert modes[0] == "EXTEND" and modes.count("EXTEND") == 1 and modes.count("DECODE") == 11
    assert [m for m, _, _ in sn.step_times] == modes


def test_overlap_eos_mid_stream_discards_the_step_in_flight():
    ref, _, _ = _serve(False, [{"ids": [1, 2, 3, 4, 5], "n": 12}])
    eos = ref[0][0][4]  # the 5th greedy token: make it the EOS token
    specs = [{"ids": [1, 2, 3, 4, 5], "n": 12, "ignore_eos": False}, {"ids": [7, 8, 9], "n": 8}]
    normal, free_n, _ = _serve(False, specs, eos=eos)
    over, free_o, so = _serve(True, specs, eos=eos)
    assert normal[0] == (ref[0][0][:5], "stop")
    assert over == normal and free_n == free_o == POOL
    # the overlap loop launched one more step for the first request (discarded when its EOS was read)
    assert len(so.step_times) >= 8


def test_sampled_requests_run_synchronously_with_the_same_random_stream():
    specs = [{"ids": [1, 2, 3], "n": 6, "t": 0.8}, {"ids": [4, 5, 6], "n": 5}]
    normal, _, _ = _serve(False, specs)
    over, free, _ = _serve(True, specs)
    assert over == normal and free == POOL


def _steps(path: Path) -> list[str]:
    with topen(path) as f:  # repair_names: torch sometimes leaves quotes in a name unescaped
        ev = json.loads(repair_names(f.read())[0])["traceEvents"]
    return [e["name"] for e in ev if e.get("name", "").startswith("step[") and e.get("ph") == "X"
            and e.get("cat") != "gpu_user_annotation"]


def test_server_overlap_flag_tokens_and_trace(tmp_path):
    payload = {"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 7, "temperature": 0,
                                                                  "ignore_eos": True}}
    with start_repro(log_dir=tmp_path) as (url, _):
        c = SGLangClient(url)
        assert c.server_info()["disable_overlap_schedule"] is True  # CPU default: the normal loop
        normal = c.generate(payload)["output_ids"]
    with start_repro("--enable-overlap-schedule", log_dir=tmp_path) as (url, _):
        c = SGLangClient(url)
        assert c.server_info()["disable_overlap_schedule"] is False
        frames = list(c.generate_stream(payload, timeout=60))
        assert [f.data["meta_info"]["completion_tokens"] for f in frames] == list(range(1, 8))
        assert frames[-1].data["output_ids"] == normal
        assert frames[-1].data["meta_info"]["finish_reason"] == {"type": "length", "length": 7}
        out = tmp_path / "prof"
        c.start_profile(output_dir=str(out), num_steps=4)
        assert c.generate(payload)["output_ids"] == normal
        deadline = time.monotonic() + 60
        while not list(out.glob("*.trace.json.gz")) and time.monotonic() < deadline:
            time.sleep(0.2)
        (path,) = list(out.glob("*.trace.json.gz"))
        assert _steps(path) == ["step[EXTEND bs=1 toks=5]"] + ["step[DECODE bs=1]"] * 3  # one per forward


def test_overlap_flags_contradict(tmp_path):
    import subprocess
    import sys

    from reproserver import REPO, TINY

    p = subprocess.run([sys.executable, "-m", "examples.repro_server", "--port", "0", *TINY,
                        "--enable-overlap-schedule", "--disable-overlap-schedule"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "contradict" in p.stderr


# ------------------------------------------------------------------ the CUDA-graph replay, eagerly
# CUDA graphs cannot run here. A test double stands in for torch.cuda.CUDAGraph only: "replay"
# re-runs the forward on the captured buffers, so CudaGraphRunner.replay's own code (padding to a
# captured size, host-side plan arrays, the backend's in-place kv_indptr, the captured kv_indices)
# runs for real, with the torch MLA wrapper in its CUDA-graph mode.


class _EagerGraph:
    def __init__(self, runner, fb, out):
        self.runner, self.fb, self.out = runner, fb, out

    def replay(self):
        with torch.inference_mode():
            self.out.copy_(self.runner.forward(self.fb))


def _eager_graph_runner(runner, max_bs: int, max_context: int):
    from examples.repro_server import model as M
    from examples.repro_server.mla_attention import make_mla_wrapper

    class EagerGraphRunner(M.CudaGraphRunner):
        def _capture_all(self):
            r, be = self.r, self.r.attn_backend
            self.ws = be.workspace_buffer
            for bs in self.batch_sizes:
                qo = torch.arange(bs + 1, dtype=torch.int32)
                kvp = torch.arange(bs + 1, dtype=torch.int32)
                kvi = torch.zeros(self.max_bs * self.max_context, dtype=torch.int32)
                kvl = torch.ones(bs, dtype=torch.int32)
                w = make_mla_wrapper(self.ws, use_flashinfer=False, use_cuda_graph=True, qo_indptr=qo,
                                     kv_indptr=kvp, kv_indices=kvi, kv_len_arr=kvl, max_kv_len=self.max_context)
                fb = M.ForwardBatch(M.ForwardMode.DECODE, bs, torch.zeros(bs, dtype=torch.long),
                                    torch.zeros(bs, dtype=torch.long), qo, kvp, kvi, kvl)
                be.init_forward_metadata(fb, decode_wrapper=w)
                out = r.forward(fb)
                self.graphs[bs] = (_EagerGraph(r, fb, out), fb, w, out)

    return EagerGraphRunner(runner, max_bs, max_context)


def test_graph_replay_logic_with_overlap_gives_the_same_tokens(monkeypatch):
    from examples.repro_server import model as M

    real = M.host_tensor
    monkeypatch.setattr(M, "host_tensor", lambda data, dtype, pin: real(data, dtype, False))  # no pinned memory on CPU
    specs = [{"ids": [1, 2, 3, 4, 5], "n": 10}, {"ids": [7, 8, 9], "n": 6}, {"ids": [3] * 20, "n": 8}]
    ref, _, _ = _serve(False, specs)

    cfg = ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, vocab_size=256)
    runner = ModelRunner(cfg, max_total_tokens=POOL, device="cpu")
    sched = Scheduler(runner, overlap=True)
    sched.graph_runner = _eager_graph_runner(runner, 4, 64)  # bs 3 runs padded to the captured 4
    replays = []
    orig = sched.graph_runner.replay
    sched.graph_runner.replay = lambda fb, ready_event=None: replays.append(fb.batch_size) or orig(fb, ready_event)
    reqs = [Req(rid=str(i), input_ids=s["ids"], max_new_tokens=s["n"], temperature=0.0, ignore_eos=True)
            for i, s in enumerate(specs)]
    for r in reqs:
        sched.submit(r)
    sched.start()
    try:
        got = [_tokens(r) for r in reqs]
    finally:
        sched.shutdown()
    assert sched.error is None
    assert got == ref
    assert replays and 3 in replays and 1 in replays  # padded (3 -> 4) and exact sizes replayed
