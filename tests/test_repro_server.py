"""The reproduction server (examples/repro_server), run for real on CPU: its SGLang-shaped HTTP API,
its profiler traces (named and shaped like SGLang's), its API keys, and its three KV strategies,
including the patched source forms documented in examples/repro_server/README.md."""

from __future__ import annotations

from paths import topen

import functools
import gzip
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import pytest

from perfscope.load.reader import repair_names
from perfscope.remote.sglang_api import HTTPStatusError, SGLangClient, Unauthorized
from reproserver import REPO, repro, start_repro  # noqa: F401  (repro is a fixture)

SGLANG_NAME = re.compile(r"^(?:(?P<prefix>[\w.]+)-)?(?P<id>\d+\.\d+)-TP-(?P<tp>\d+)(?:-(?P<stage>EXTEND|DECODE))?"
                         r"\.trace\.json\.gz$")
MLA = REPO / "examples" / "repro_server" / "mla_attention.py"


def _gen(client, n=4, ids=(1, 2, 3, 4, 5)):
    return list(client.generate_stream({"input_ids": list(ids), "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}, timeout=60))


def _wait_files(d: Path, n: int, timeout: float = 60.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(p for p in d.glob("*.trace.json.gz")) if d.is_dir() else []
        if len(files) >= n:
            return files
        time.sleep(0.2)
    raise AssertionError(f"{n} trace file(s) did not appear in {d}: {list(d.iterdir()) if d.is_dir() else 'no dir'}")


def _events(path: Path) -> list[dict]:
    with topen(path) as f:  # repair_names: torch sometimes leaves quotes in a name unescaped
        doc = json.loads(repair_names(f.read())[0])
    assert isinstance(doc.get("traceEvents"), list) and doc["traceEvents"]
    return doc["traceEvents"]


# ------------------------------------------------------------------------------------ generate


def test_streaming_generate_frames(repro):
    c = SGLangClient(repro)
    frames = _gen(c, n=5)
    assert len(frames) == 5  # one SSE frame per token, then [DONE] (consumed by the client)
    counts = [f.data["meta_info"]["completion_tokens"] for f in frames]
    assert counts == [1, 2, 3, 4, 5]
    assert all(f.data["meta_info"]["finish_reason"] is None for f in frames[:-1])
    assert frames[-1].data["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert frames[-1].data["meta_info"]["prompt_tokens"] == 5
    assert len(frames[-1].data["output_ids"]) == 5 and frames[-1].data["text"]
    ts = [f.t for f in frames]
    assert ts == sorted(ts)
    # greedy decoding on fixed weights is deterministic, and so is the non-streamed reply
    again = c.generate({"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                                          "ignore_eos": True}})
    assert again["output_ids"] == frames[-1].data["output_ids"]


def test_raw_sse_wire_format(repro):
    """The bytes on the wire: `data: {json}` frames separated by blank lines, ending `data: [DONE]`."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(repro)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/generate", json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2,
                                                  "ignore_eos": True}, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    body = r.read().decode()
    conn.close()
    chunks = [c for c in body.split("\n\n") if c]
    assert chunks[-1] == "data: [DONE]"
    assert all(c.startswith("data: {") for c in chunks[:-1]) and len(chunks) == 3


def test_generate_rejects_bad_input(repro):
    c = SGLangClient(repro)
    with pytest.raises(HTTPStatusError) as e:
        c.generate({"sampling_params": {"max_new_tokens": 2}})
    assert e.value.status == 400
    with pytest.raises(HTTPStatusError):
        c.generate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}})


def test_server_info_both_endpoints(repro):
    c = SGLangClient(repro)
    info = c.server_info()
    old = c.request_json("GET", "/get_server_info")
    for d in (info, old):
        assert d["kv_cache_dtype"] == "fp8_e4m3" and d["dtype"] == "bfloat16"
        assert d["attention_backend"] == "flashinfer" and d["page_size"] == 1 and d["tp_size"] == 1
        assert d["max_total_num_tokens"] == 4000 and d["kv_pool_rows"] == 4001
        assert d["kv_lora_rank"] == 512 and d["qk_rope_head_dim"] == 64 and d["num_hidden_layers"] == 2
        assert d["weight_bytes"] == 2 * d["weight_bytes_per_layer"] > 0
        assert d["disable_cuda_graph"] is True and "cuda_graph_max_bs" in d
        assert re.match(r"^0\.5\.\d+$", d["version"])
    assert info["kv_strategy"] == "pool"  # the shipped source has the whole-pool cast
    assert c.health()


# ------------------------------------------------------------------------------------ profiling


def test_start_profile_replies_at_once_and_writes_an_sglang_trace(repro, tmp_path):
    c = SGLangClient(repro)
    out = tmp_path / "prof"
    reply = c.start_profile(output_dir=str(out), num_steps=3, activities=["CPU", "GPU"], with_stack=True,
                            record_shapes=True, profile_prefix="pfx")
    assert reply.startswith("Start profiling")
    assert not list(out.glob("*.gz")) if out.exists() else True  # nothing yet: no step has run
    _gen(c, n=6)
    (path,) = _wait_files(out, 1)
    m = SGLANG_NAME.match(path.name)
    assert m and m["prefix"] == "pfx" and m["tp"] == "0" and m["stage"] is None, path.name
    assert abs(float(m["id"]) - time.time()) < 600  # profile id is time.time(), as in SGLang
    ev = _events(path)
    names = [e.get("name", "") for e in ev]
    steps = [n for n in names if n.startswith("step[")]
    assert len(steps) == 3 and steps[0] == "step[EXTEND bs=1 toks=5]" and "step[DECODE bs=1]" in steps
    assert not any(n.startswith("ProfilerStep#") for n in names)  # SGLang's traces have none
    casts = [e for e in ev if e.get("name") == "aten::copy_"
             and (e.get("args") or {}).get("Input type", [None, None])[1] == "c10::Float8_e4m3fn"]
    assert casts, "no FP8 -> BF16 aten::copy_ in the trace"
    a = casts[0]["args"]
    assert a["Input type"][0] == "c10::BFloat16"
    assert a["Input Dims"][:2] == [[4001, 1, 576], [4001, 1, 576]]  # the whole pool (4000 tokens + padded slot 0)
    assert len(casts) == 3 * 2  # every step, every layer
    assert any(e.get("cat") == "python_function" for e in ev)  # with_stack
    assert any("mla_attention.py" in e.get("name", "") for e in ev if e.get("cat") == "python_function")
    # the profile has ended by itself: a stop now is refused with a bare 500, as SGLang 0.5.23
    with pytest.raises(HTTPStatusError) as e:
        c.stop_profile()
    assert e.value.status == 500 and e.value.body == "Internal Server Error"


def test_profile_by_stage_writes_extend_and_decode_files(repro, tmp_path):
    c = SGLangClient(repro)
    out = tmp_path / "bystage"
    c.start_profile(output_dir=str(out), num_steps=2, profile_by_stage=True)
    _gen(c, n=4)
    _gen(c, n=2)  # a second prefill: the EXTEND capture already ended at the first decode
    files = _wait_files(out, 2)
    stages = sorted(SGLANG_NAME.match(p.name)["stage"] for p in files)
    assert stages == ["DECODE", "EXTEND"]
    ids = {SGLANG_NAME.match(p.name)["id"] for p in files}
    assert len(ids) == 1  # one profile id for both stage files
    dec = next(p for p in files if p.name.endswith("-DECODE.trace.json.gz"))
    steps = [e["name"] for e in _events(dec) if e.get("name", "").startswith("step[")]
    assert steps == ["step[DECODE bs=1]"] * 2


def test_stop_profile_errors(repro, tmp_path):
    """As real SGLang 0.5.23 (tests/test_emulator_contract.py compares the two): refusals are a
    bare 500; a second plain start silently replaces a running profile; one with start_step (what
    perfscope sends) or by stage is refused."""
    c = SGLangClient(repro)
    with pytest.raises(HTTPStatusError) as e:
        c.stop_profile()
    assert e.value.status == 500 and e.value.body == "Internal Server Error"
    # without num_steps the profile runs until /stop_profile, which writes the file before replying
    c.start_profile(output_dir=str(tmp_path / "manual"))
    for guarded in ({"start_step": 1, "num_steps": 2}, {"profile_by_stage": True, "num_steps": 2}):
        with pytest.raises(HTTPStatusError) as e:
            c.start_profile(output_dir=str(tmp_path / "other"), **guarded)
        assert e.value.status == 500
    assert c.start_profile(output_dir=str(tmp_path / "replaced")) == "Start profiling."  # the silent restart
    _gen(c, n=2)
    c.stop_profile()
    files = list((tmp_path / "replaced").glob("*.trace.json.gz"))
    assert len(files) == 1 and SGLANG_NAME.match(files[0].name)
    assert not (tmp_path / "other").exists() and not (tmp_path / "manual").exists()
    with pytest.raises(HTTPStatusError, match="unknown"):
        c.request("POST", "/start_profile", {"bogus_field": 1})


# ------------------------------------------------------------------------------------ API keys


@pytest.mark.slow
def test_api_keys_enforced(tmp_path):
    user, admin = "user-key-123", "admin-key-456"
    with start_repro("--seed", "1", env={"REPRO_API_KEY": user,
                     "REPRO_ADMIN_API_KEY": admin}, log_dir=tmp_path) as (url, _):
        assert SGLangClient(url).health()  # /health is open
        for key in (None, "wrong"):
            with pytest.raises(Unauthorized) as e:
                SGLangClient(url, api_key=key).server_info()
            assert e.value.status == 401 and user not in str(e.value) and admin not in str(e.value)
        info = SGLangClient(url, api_key=user).server_info()
        assert info["api_key_set"] is True and user not in json.dumps(info) and admin not in json.dumps(info)
        assert _gen(SGLangClient(url, api_key=user), n=2)
        # profiling is an admin endpoint: the user key is not enough
        with pytest.raises(Unauthorized):
            SGLangClient(url, api_key=user).start_profile(output_dir=str(tmp_path / "p"), num_steps=1)
        SGLangClient(url, api_key=admin).start_profile(output_dir=str(tmp_path / "p"), num_steps=1)
        SGLangClient(url, api_key=admin).stop_profile()
        assert "***" in repr(SGLangClient(url, api_key=user)) and user not in repr(SGLangClient(url, api_key=user))
    assert user not in (tmp_path.glob("repro-*.log").__next__().read_text())


# ------------------------------------------------------------------------- the KV strategies


def _runner(strategy: str, module=None):
    import torch

    sys.path.insert(0, str(REPO))
    from examples.repro_server.model import ModelConfig, ModelRunner

    torch.manual_seed(0)
    cfg = ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, vocab_size=256)
    r = ModelRunner(cfg, max_total_tokens=3000, kv_strategy="pool" if module else strategy)
    if module is not None:  # a patched copy of mla_attention.py
        r.attn_backend = module.FlashInferMLAAttnBackend(r)
    return r


def _decode_logits(r):
    from examples.repro_server.model import ForwardMode

    slots = [r.allocator.alloc(40) for _ in range(3)]
    lens = [17, 29, 8]
    ids = [[(7 * i + j) % 250 + 1 for j in range(n)] for i, n in enumerate(lens)]
    r.run_batch(r.build_batch(ForwardMode.EXTEND, ids, [s[:n] for s, n in zip(slots, lens)],
                              [s[:n] for s, n in zip(slots, lens)]))
    fb = r.build_batch(ForwardMode.DECODE, [[5], [6], [7]], [s[: n + 1] for s, n in zip(slots, lens)],
                       [[s[n]] for s, n in zip(slots, lens)])
    return r.run_batch(fb).float()


@functools.lru_cache(maxsize=None)
def _pool_logits():
    """The unpatched pool strategy's decode logits: the reference every strategy and patch is held to
    (computed once; read, never changed)."""
    return _decode_logits(_runner("pool"))


def test_three_strategies_compute_the_same_decode():
    import torch

    ref = _pool_logits()
    for s in ("pages", "fp8"):
        got = _decode_logits(_runner(s))
        assert torch.allclose(ref, got, atol=2e-2, rtol=2e-2), (s, (ref - got).abs().max())


def patch_pages(src: str) -> str:
    """The 'pages' patched form from README.md: cast only the rows the batch reads."""
    anchor = "self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)"
    assert src.count(anchor) == 2
    return src.replace(anchor, "cast_kv_pages(self.token_to_kv_pool.get_key_buffer(layer.layer_id), "
                               "self.forward_metadata.kv_indices, q.dtype)")


def patch_fp8(src: str) -> str:
    """The 'fp8' patched form from README.md: no cast, plan(kv_data_type=FP8), unit scales."""
    s = src.replace(".get_key_buffer(layer.layer_id).to(q.dtype)", ".get_key_buffer(layer.layer_id)")
    assert s.count("            out=o,\n        )") == 2
    s = s.replace("            out=o,\n        )", "            out=o,\n            ckv_scale=1.0,\n            kpe_scale=1.0,\n        )")
    head, sep, tail = s.partition("class FlashInferMLAIndicesUpdaterDecode")
    assert tail.count("        self.data_type = model_runner.dtype\n") == 2
    tail = tail.replace("        self.data_type = model_runner.dtype\n",
                        "        self.data_type = model_runner.dtype\n        self.kv_data_type = model_runner.kv_cache_dtype\n")
    assert tail.count("            self.data_type,\n        )") == 2
    tail = tail.replace("            self.data_type,\n        )", "            self.kv_data_type,\n        )")
    return head + sep + tail


def _load_patched(tmp_path: Path, text: str, name: str):
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "mla_attention.py").write_text(text)
    spec = importlib.util.spec_from_file_location(f"{name}_mla", pkg / "mla_attention.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod, pkg / "mla_attention.py"


@pytest.mark.parametrize("name,patch", [("pages", patch_pages), ("fp8", patch_fp8)])
def test_documented_patches_fix_the_source(tmp_path, name, patch):
    """Applying README.md's patched form to mla_attention.py gives the same numbers without the
    whole-pool cast, and /server_info's kv_strategy (read from the source) follows."""
    import torch

    from examples.repro_server.kv_variants import strategy_of_source

    src = MLA.read_text()
    assert strategy_of_source(MLA) == "pool"
    mod, path = _load_patched(tmp_path, patch(src), name)
    assert strategy_of_source(path) == name
    ref = _pool_logits()
    r = _runner(name, module=mod)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        got = _decode_logits(r)
    assert torch.allclose(ref, got, atol=2e-2, rtol=2e-2), (ref - got).abs().max()
    whole = [e for e in prof.events() if e.name == "aten::copy_" and e.input_shapes
             and e.input_shapes[0][:1] == [3001]]
    assert not whole, "the patched source still copies the whole pool"
