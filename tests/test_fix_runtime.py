"""fp8-kv-cast at run time: the patched reproduction server still runs and matches the cast path
(CPU), the inserted helper converts exactly the referenced rows, the Triton kernels are bit-exact
(Triton's interpreter on CPU), and check / apply / revert work over a real sshd on loopback."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import need
from clirun import invoke
from perfscope.fixengine import engine
from perfscope.fixengine.host import LocalFixHost
from perfscope.fixengine.registry import get
from sglang_sources import MLA, sglang_file
from need import missing

REPO = Path(__file__).resolve().parents[1]
SNIPPET = REPO / "fixes" / "fp8_kv_cast" / "snippet.py"
REPRO = REPO / "examples" / "repro_server" / "mla_attention.py"
FIX = get("fp8-kv-cast")


def _snippet():
    spec = importlib.util.spec_from_file_location("perfscope_fp8kv_snippet", SNIPPET)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------- the helper, torch path


def test_rows_helper_converts_exactly_the_referenced_rows():
    torch = need.module("torch")
    m = _snippet()
    torch.manual_seed(0)
    pool = (torch.randn(50, 1, 576) * 3).to(torch.float8_e4m3fn)
    idx = torch.tensor([4, 9, 9, 31, 0, 7], dtype=torch.int32)
    indptr = torch.tensor([0, 2, 4, 6], dtype=torch.int32)
    m._PERFSCOPE_FP8KV_SCRATCH.clear()
    out = m._perfscope_fp8kv_rows(pool, torch.bfloat16, idx, indptr, 2)  # first 2 requests: rows 4, 9, 9, 31
    ref = pool.to(torch.bfloat16)
    assert out.shape == pool.shape and out.dtype == torch.bfloat16
    for r in (4, 9, 31):
        assert torch.equal(out[r], ref[r])
    assert bool((out[7] == 0).all())  # not referenced by the first two requests: untouched
    # decode: the wrapper's index list + the backend's indptr
    w = SimpleNamespace(_kv_indices_buf=idx, _kv_data_type=torch.bfloat16)
    out = m._perfscope_fp8kv_decode(pool, torch.bfloat16, w, indptr, 3)
    assert torch.equal(out[7], ref[7]) and torch.equal(out[0], ref[0])
    # extend, planned eagerly: the wrapper's own indptr
    w = SimpleNamespace(_kv_indices_buf=torch.tensor([11, 12], dtype=torch.int32),
                        _kv_indptr_buf=torch.tensor([0, 2], dtype=torch.int32), _use_cuda_graph=False)
    out = m._perfscope_fp8kv_extend(pool, torch.bfloat16, w)
    assert torch.equal(out[11], ref[11]) and torch.equal(out[12], ref[12])
    # graph-planned extend keeps the whole-pool cast (its indptr may be stale at replay)
    w.__dict__["_use_cuda_graph"] = True
    assert torch.equal(m._perfscope_fp8kv_extend(pool, torch.bfloat16, w), ref)


def test_native_passthrough_scales_and_off_switch(monkeypatch):
    torch = need.module("torch")
    m = _snippet()
    pool = torch.zeros(8, 1, 576).to(torch.float8_e4m3fn)
    w = SimpleNamespace(_kv_data_type=torch.float8_e4m3fn, _kv_indices_buf=torch.tensor([1], dtype=torch.int32))
    assert m._perfscope_fp8kv_decode(pool, torch.bfloat16, w, torch.tensor([0, 1]), 1) is pool
    assert m._perfscope_fp8kv_scales(w, pool) == {"ckv_scale": 1.0, "kpe_scale": 1.0}
    assert m._perfscope_fp8kv_scales(SimpleNamespace(_kv_data_type=torch.bfloat16), pool) == {}
    # the model runner decides: no CUDA here, so the plan keeps the model dtype
    mr = SimpleNamespace(dtype=torch.bfloat16, kv_cache_dtype=torch.float8_e4m3fn)
    assert m._perfscope_fp8kv_plan_dtype(mr) == torch.bfloat16
    monkeypatch.setenv("PERFSCOPE_FP8_KV_CAST", "off")
    out = m._perfscope_fp8kv_rows(pool, torch.bfloat16, torch.tensor([1], dtype=torch.int32), torch.tensor([0, 1]), 1)
    assert torch.equal(out, pool.to(torch.bfloat16))


def test_paged_helper_fa3_layout():
    torch = need.module("torch")
    m = _snippet()
    m._PERFSCOPE_FP8KV_SCRATCH.clear()
    torch.manual_seed(1)
    ps = 4
    pool = (torch.randn(64, 1, 576)).to(torch.float8_e4m3fn)  # 16 pages of 4 tokens
    pt = torch.tensor([[3, 7, 0], [10, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([6, 1], dtype=torch.int32)  # request 0: pages 3, 7; request 1: page 10
    out = m._perfscope_fp8kv_paged(pool, torch.bfloat16, pt, lens, ps, False)
    ref = pool.to(torch.bfloat16)
    for page in (3, 7, 10):
        assert torch.equal(out[page * ps:(page + 1) * ps], ref[page * ps:(page + 1) * ps])
    assert bool((out[0:4] == 0).all())
    assert torch.equal(m._perfscope_fp8kv_paged(pool, torch.bfloat16, pt, lens, ps, True), ref)  # cascade: fallback


# ------------------------------------------------------- the Triton kernels (interpreter)


TRITON_CHECK = r"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("s", sys.argv[1]); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
assert m._perfscope_fp8kv_rows_kernel is not None
for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
    pool = (torch.randn(300, 1, 576) * 4).to(dt)
    pool.view(torch.uint8)[5, 0, :256] = torch.arange(256, dtype=torch.uint8)  # every bit pattern
    ref = pool.to(torch.bfloat16).float()
    out = torch.zeros(300, 1, 576, dtype=torch.bfloat16)
    idx = torch.tensor([5, 17, 3, 299, 100, 7, 8], dtype=torch.int32)
    m._perfscope_fp8kv_rows_kernel[(4,)](pool.view(torch.uint8), out, idx, torch.tensor([0, 3, 6], dtype=torch.int32),
        2, 300, ROW=576, FMT=m._perfscope_fp8kv_fmt(pool), BLOCK_R=16, BLOCK_C=64)
    a = out.float()
    bits, rbits = out.view(torch.int16), pool.to(torch.bfloat16).view(torch.int16)
    for r in (5, 17, 3, 299, 100, 7):
        assert bool(((a[r] == ref[r]) | (a[r].isnan() & ref[r].isnan())).all()), (dt, r)
        # bit for bit, the sign of zero included (0x80 is -0.0), NaN payloads aside
        assert bool(((bits[r] == rbits[r]) | ref[r].isnan()).all()), (dt, r)
    assert bool((a[8] == 0).all())
    out = torch.zeros(300, 1, 576, dtype=torch.bfloat16)
    pt = torch.tensor([[1, 74, 0, 0], [10, 11, 12, 0]], dtype=torch.int32)
    m._perfscope_fp8kv_pages_kernel[(2, 3)](pool.view(torch.uint8), out, pt, pt.stride(0),
        torch.tensor([6, 9], dtype=torch.int32), 4, 75, PAGE=4 * 576, FMT=m._perfscope_fp8kv_fmt(pool), BLOCK_P=1024)
    a = out.float()
    rows = [p * 4 + j for p in (1, 74, 10, 11, 12) for j in range(4)]
    assert bool(((a[rows] == ref[rows]) | (a[rows].isnan() & ref[rows].isnan())).all()), dt
    assert bool((a[0:4] == 0).all())
print("ok")
"""


@pytest.mark.slow  # ~10 s
def test_triton_kernels_bit_exact_in_interpreter():
    need.module("torch")
    if importlib.util.find_spec("triton") is None:
        missing("triton is not installed (the test extra has it; SGLang servers always have it)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", TRITON_CHECK, str(SNIPPET)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


# ------------------------------------------------------------ the reproduction server


@pytest.mark.slow  # the patched reproduction server module run on CPU (~8 s)
@pytest.mark.parametrize("strategy", ["pages", "native"])
def test_repro_server_module_patched_runs_and_matches(tmp_path, strategy):
    """The fix applied to examples/repro_server/mla_attention.py: the patched module decodes a
    batch on CPU with logits equal to the unpatched (whole-pool cast) module's within 2e-2 (BF16
    rounding of the attention output; the converted rows themselves are bit-exact)."""
    torch = need.module("torch")
    assert REPRO.is_file(), "examples/repro_server is part of this repository"
    import test_repro_server as trs

    p = tmp_path / "mla_attention.py"
    p.write_bytes(REPRO.read_bytes())
    req = engine.FixRequest(target_file=str(p), state_dir=str(tmp_path / "state"), strategy=strategy,
                            overrides={"compute_cap": "9.0"} if strategy == "native" else {})
    rep = engine.apply(FIX, LocalFixHost(), req)
    assert rep.outcome.kind == "applied", rep.outcome.reason
    assert rep.target == "repro-server"
    mod, _ = trs._load_patched(tmp_path, p.read_text(), f"fixed_{strategy}")
    ref = trs._decode_logits(trs._runner("pool"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        got = trs._decode_logits(trs._runner("pool", module=mod))
    assert torch.allclose(ref, got, atol=2e-2, rtol=2e-2), (ref - got).abs().max()
    whole = [e for e in prof.events() if e.name == "aten::copy_" and e.input_shapes
             and e.input_shapes[0][:1] == [3001] and "Float8" in str(getattr(e, "input_types", ""))]
    assert not whole
    assert engine.revert(FIX, LocalFixHost(), req).outcome.kind == "reverted"
    assert p.read_bytes() == REPRO.read_bytes()


# ------------------------------------------------------------------------ over SSH (sshd)


def _cli(args):
    r = invoke("fix", *args)
    return r.returncode, r.stdout, r.stderr


def test_remote_check_apply_revert_through_sshd(sshd, tmp_path):
    data = sglang_file("0.5.23", MLA)
    remote = tmp_path / "remote" / "flashinfer_mla_backend.py"
    remote.parent.mkdir()
    remote.write_bytes(data)
    state = tmp_path / "remote-state dir"  # a space: every remote argument is quoted
    base = ["fp8-kv-cast", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "-i", str(sshd.user_key),
            "--known-hosts", str(sshd.known_hosts), "--target-file", str(remote), "--state-dir", str(state),
            "--port", "1", "--json"]
    rc, out, err = _cli(base)
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["outcome"] == "checked" and rep["variant"] == "mla-0.5.16-dcp" and rep["strategy"] == "pages"
    assert rep["environment"]["host"].endswith(f"127.0.0.1:{sshd.port}")
    assert remote.read_bytes() == data and not state.exists()
    rc, out, err = _cli(base + ["--apply", "--expect-sha256", rep["sha256_before"]])
    assert rc == 0, err
    applied = json.loads(out)
    assert applied["outcome"] == "applied"
    assert hashlib.sha256(remote.read_bytes()).hexdigest() == applied["sha256_after"]
    assert (state / "fp8-kv-cast").is_dir()
    rc, out, _ = _cli(base + ["--apply"])
    assert rc == 0 and json.loads(out)["outcome"] == "already-applied"
    rc, out, err = _cli(base + ["--revert"])
    assert rc == 0, err
    assert json.loads(out)["outcome"] == "reverted"
    assert remote.read_bytes() == data


@pytest.mark.slow  # ~10 s
def test_cli_list_doc_and_exit_codes(tmp_path):
    rc, out, _ = _cli(["--list"])
    assert rc == 0 and "fp8-kv-cast" in out and "sglang-fa3" in out
    rc, out, _ = _cli(["--list", "--doc"])
    assert rc == 0 and out.startswith("# perfscope fixes") and "## `fp8-kv-cast`" in out
    p = tmp_path / "f.py"
    p.write_bytes(sglang_file("0.4.6", MLA))
    rc, out, err = _cli(["fp8-kv-cast", "--target-file", str(p)])
    assert rc == 4 and "sglang#5651" in err  # the refusal: once, as the error line
    rc, out, err = _cli(["no-such-fix"])
    assert rc == 2 and "unknown fix" in err


def test_docs_fixes_md_is_generated_from_the_code():
    from perfscope.cli._fix_doc import list_doc

    assert (REPO / "docs" / "fixes.md").read_text(encoding="utf-8") == list_doc(True), \
        "docs/fixes.md is stale: python -m perfscope fix --list --doc > docs/fixes.md"
