"""fp8-kv-cast against the real SGLang sources of released wheels (fetched and cached by
tests/sglang_sources.py): variant detection, exact diffs, compile, idempotent apply, byte-exact
revert, refusal of unknown shapes; plus the strategy choice and the engine's safety rules."""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import json
import os
import re

import pytest

from clirun import invoke
from perfscope.fixengine import engine
from perfscope.fixengine.host import LocalFixHost
from perfscope.fixengine.model import Environment
from perfscope.fixengine.registry import get
from sglang_sources import FA3, MLA, REFUSED, VERSIONS, sglang_file, sglang_tree

FIX = get("fp8-kv-cast")
MOD = __import__("perfscope_fixes.fp8_kv_cast", fromlist=["MLA"])

EXPECTED_MLA = {
    "0.4.6.post5": "mla-0.4.6.post5",
    "0.4.10.post2": "mla-0.4.6.post5",
    "0.5.1": "mla-0.5.1",
    "0.5.5": "mla-0.4.6.post5",
    "0.5.12": "mla-0.4.6.post5",
    "0.5.14": "mla-0.5.14",
    "0.5.23": "mla-0.5.16-dcp",
}
EXPECTED_FA3 = {
    "0.4.6.post5": None,  # does not cast: not applicable
    "0.4.10.post2": "fa3-0.4.10",
    "0.5.1": "fa3-0.4.10",
    "0.5.5": "fa3-0.4.10",
    "0.5.12": "fa3-0.4.10",
    "0.5.14": "fa3-0.5.14",
    "0.5.23": "fa3-0.5.14",
}
H200 = dict(compute_cap="9.0", flashinfer_version="0.6.18", kv_cache_dtype="fp8_e4m3")


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@functools.lru_cache(maxsize=None)
def _tree(data: bytes) -> ast.Module:
    """The source's syntax tree, parsed once per session for every test that walks it (read, never changed)."""
    return ast.parse(data)


def cast_line_ranges(data: bytes, cls: str) -> list[tuple[int, int, str]]:
    """(first, last, kind) lines of the whole-pool casts in forward_extend / forward_decode,
    found independently of the fix module with a plain ast walk."""
    tree = _tree(data)
    out = []
    for c in tree.body:
        if isinstance(c, ast.ClassDef) and c.name == cls:
            for fn in c.body:
                if isinstance(fn, ast.FunctionDef) and fn.name in ("forward_extend", "forward_decode"):
                    for st in ast.walk(fn):
                        if not (isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)):
                            continue
                        f = st.value.func
                        if isinstance(f, ast.Attribute) and f.attr == "to" and len(st.value.args) == 1 \
                                and ast.unparse(st.value.args[0]) == "q.dtype":
                            src = ast.unparse(st.value.func.value)
                            if "get_key_buffer" in src:
                                out.append((st.lineno, st.end_lineno, "pool"))
                            elif "dcp_kv_buffer" in src:
                                out.append((st.lineno, st.end_lineno, "dcp"))
    return out


def plan_kv_lines(data: bytes) -> set[int]:
    """Lines of the kv dtype argument of plan() in the MLA indices updaters."""
    tree = _tree(data)
    lines = set()
    for c in tree.body:
        if isinstance(c, ast.ClassDef) and c.name.startswith("FlashInferMLAIndicesUpdater"):
            for call in ast.walk(c):
                if isinstance(call, ast.Call) and (
                        (isinstance(call.func, ast.Attribute) and call.func.attr == "plan")
                        or (isinstance(call.func, ast.Name) and call.func.id.startswith("fast_mla_"))):
                    kw = {k.arg: k.value for k in call.keywords}
                    node = kw.get("kv_data_type", call.args[-1] if call.args else None)
                    lines.add(node.lineno)
    return lines


def hunks(before: bytes, after: bytes):
    a, b = before.decode().splitlines(), after.decode().splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            yield set(range(i1 + 1, i2 + 1)), "\n".join(b[j1:j2])


def check_env(**kw) -> Environment:
    return Environment(**kw)


# ------------------------------------------------------------------- per released version


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("strategy", ["pages", "native"])
def test_flashinfer_mla_variant_diff_compile(version, strategy):
    data = sglang_file(version, MLA)
    env = check_env(sglang_version=version, **H200)
    det = FIX.detect(MOD.MLA, data, env)
    assert det.state == "original", det.reason
    assert det.variant == EXPECTED_MLA[version]
    after, _ = FIX.transform(MOD.MLA, det, data, strategy)
    assert FIX.postconditions(MOD.MLA, det, data, after, strategy) == []
    compile(after, f"sglang-{version}-{strategy}", "exec", dont_inherit=True)

    casts = cast_line_ranges(data, "FlashInferMLAAttnBackend")
    pool = [c for c in casts if c[2] == "pool"]
    assert len(pool) == 2
    allowed = set().union(*(set(range(a, b + 1)) for a, b, _ in pool))
    must = {a for a, _, _ in pool}  # (a closing ")" may line up with the new statement's)
    if strategy == "native":
        allowed |= plan_kv_lines(data)
        allowed |= set().union(set(), *(set(range(a, b + 1)) for a, b, k in casts if k == "dcp"))
        must |= plan_kv_lines(data)
    removed = set()
    for rem, added in hunks(data, after):
        removed |= rem
        # every changed spot is ours: the helper block or a call of it
        assert "perfscope" in added or (rem and rem <= allowed), (rem, added)
    assert removed <= allowed, sorted(removed - allowed)
    assert must <= removed, sorted(must - removed)
    # the chunked-KV runner's casts of fresh k/v are untouched; no whole-pool cast is left
    fresh = rb"k.view(-1, layer.tp_k_head_num, layer.head_dim).to(q.dtype)"
    assert after.count(fresh) == data.count(fresh)
    assert [c for c in cast_line_ranges(after, "FlashInferMLAAttnBackend") if c[2] == "pool"] == []
    if strategy == "native":
        assert len(plan_kv_lines(after)) == len(plan_kv_lines(data))
        for ln in plan_kv_lines(after):
            assert b"self._perfscope_kv_data_type" in after.splitlines()[ln - 1]
        assert after.count(b"**_perfscope_fp8kv_scales(") == 2
    else:
        assert b"_perfscope_kv_data_type" not in after.split(MOD.END_MARKER.encode())[1]


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_twice_then_revert_is_byte_identical(version, tmp_path):
    root = sglang_tree(version, tmp_path / "site")
    target = root / MLA
    original = target.read_bytes()
    host = LocalFixHost()
    req = engine.FixRequest(sglang_root=str(tmp_path / "site"), state_dir=str(tmp_path / "state"),
                            overrides={"kv_cache_dtype": "fp8_e4m3"})
    env = engine.probe_env(host, req)
    assert env.sglang_version == version  # read from the package's own version files
    rep = engine.apply(FIX, host, req, env)
    assert rep.outcome.kind == "applied", rep.outcome.reason
    assert rep.strategy == "pages"  # no GPU here: pages is the one that works anywhere
    patched = target.read_bytes()
    assert sha(patched) == rep.sha256_after != sha(original)
    again = engine.apply(FIX, host, req, env)
    assert again.outcome.kind == "already-applied"
    assert target.read_bytes() == patched
    back = engine.revert(FIX, host, req, env)
    assert back.outcome.kind == "reverted", back.outcome.reason
    assert target.read_bytes() == original
    assert engine.revert(FIX, host, req, env).outcome.kind == "skipped"


@pytest.mark.parametrize("version", VERSIONS)
def test_fa3_pages(version):
    data = sglang_file(version, FA3)
    env = check_env(sglang_version=version, **H200)
    det = FIX.detect(MOD.FA3, data, env)
    if EXPECTED_FA3[version] is None:
        assert det.state == "not-applicable"
        return
    assert det.state == "original", det.reason
    assert det.variant == EXPECTED_FA3[version]
    choice = FIX.choose_strategy(MOD.FA3, det, env, "auto")
    assert choice.strategy == "pages"
    assert FIX.choose_strategy(MOD.FA3, det, env, "native").strategy is None
    after, _ = FIX.transform(MOD.FA3, det, data, "pages")
    assert FIX.postconditions(MOD.FA3, det, data, after, "pages") == []
    compile(after, "fa3", "exec", dont_inherit=True)
    pool = [c for c in cast_line_ranges(data, "FlashAttentionBackend") if c[2] == "pool"]
    allowed = set().union(*(set(range(a, b + 1)) for a, b, _ in pool))
    removed = set()
    for rem, added in hunks(data, after):
        removed |= rem
        assert "perfscope" in added or (rem and rem <= allowed), (rem, added)
    assert removed <= allowed and {a for a, _, _ in pool} <= removed
    # the kernel's own page table and lengths are what the helper converts
    for ln in re.findall(rb"_perfscope_fp8kv_paged\(\n(?:.*\n){7}", after):
        assert b"page_table" in ln and b"seqlens" in ln


@pytest.mark.parametrize("version", REFUSED)
def test_046_refused_with_reason(version, tmp_path):
    data = sglang_file(version, MLA)
    det = FIX.detect(MOD.MLA, data, check_env(sglang_version=version))
    assert det.state == "refused"
    assert "sglang#5651" in det.reason and "0.4.6.post5" in det.reason
    p = tmp_path / "flashinfer_mla_backend.py"
    p.write_bytes(data)
    rep = engine.apply(FIX, LocalFixHost(), engine.FixRequest(target_file=str(p), state_dir=str(tmp_path / "s")))
    assert rep.outcome.kind == "refused"
    assert p.read_bytes() == data


MUTATIONS = {
    "cast by keyword": (rb"get_key_buffer(layer.layer_id).to(q.dtype)", rb"get_key_buffer(layer.layer_id).to(dtype=q.dtype)"),
    "decode wrapper renamed": (rb"decode_wrapper = self.forward_metadata.decode_wrapper",
                               rb"wrapper_d = self.forward_metadata.decode_wrapper"),
    "plan kv dtype changed": (b"                self.data_type,\n            )", b"                self.kv_dtype,\n            )"),
}


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_unknown_shape_is_refused(version, mutation, tmp_path):
    data = sglang_file(version, MLA)
    old, new = MUTATIONS[mutation]
    assert old in data
    mutated = data.replace(old, new, 1)
    p = tmp_path / "flashinfer_mla_backend.py"
    p.write_bytes(mutated)
    rep = engine.apply(FIX, LocalFixHost(), engine.FixRequest(
        target_file=str(p), state_dir=str(tmp_path / "s"), overrides={"sglang_version": "0.5.99"}))
    assert rep.outcome.kind == "refused", rep.outcome.reason
    assert "unknown shape" in rep.outcome.reason
    assert p.read_bytes() == mutated


def test_extra_cast_is_refused(tmp_path):
    data = sglang_file("0.5.14", MLA)
    line = b"        k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)\n"
    assert line in data
    mutated = data.replace(line, line + line.replace(b"k_buffer", b"k_buffer2"), 1)
    det = FIX.detect(MOD.MLA, mutated, check_env(sglang_version="0.6.0"))
    assert det.state == "unknown" and "found 1 and 2" in det.reason


def test_newer_version_with_known_shape_is_noted():
    data = sglang_file("0.5.23", MLA)
    det = FIX.detect(MOD.MLA, data, check_env(sglang_version="0.5.24"))
    assert det.state == "original"
    assert any("newer than" in n for n in det.facts["notes"])


# ------------------------------------------------------------------------ strategy choice


@pytest.mark.parametrize("env,expected,why", [
    (dict(compute_cap="9.0", flashinfer_version="0.6.18", kv_cache_dtype="fp8_e4m3"), "native", "reads the FP8 pool"),
    (dict(compute_cap="9.0", flashinfer_version="0.6.14", kv_cache_dtype="fp8_e4m3"), "native", ""),
    (dict(compute_cap="9.0", flashinfer_version="0.6.0", kv_cache_dtype="fp8_e4m3"), "pages", "< 0.6.14"),
    (dict(compute_cap="12.0", flashinfer_version="0.6.18", kv_cache_dtype="fp8_e4m3"), "pages", "SM12.0"),
    (dict(compute_cap="10.0", flashinfer_version="0.6.18", kv_cache_dtype="fp8_e4m3"), "pages", "SM100"),
    (dict(compute_cap="9.0", flashinfer_version="0.6.18", kv_cache_dtype="fp8_e5m2"), "pages", "e5m2"),
    (dict(), "pages", "unknown"),
])
def test_strategy_choice(env, expected, why):
    data = sglang_file("0.5.23", MLA)
    e = check_env(sglang_version="0.5.23", **env)
    det = FIX.detect(MOD.MLA, data, e)
    ch = FIX.choose_strategy(MOD.MLA, det, e, "auto")
    assert ch.strategy == expected
    assert why in (ch.reason + json.dumps(ch.rejected))


def test_native_forced_on_sm120_is_refused(tmp_path):
    p = tmp_path / "f.py"
    p.write_bytes(sglang_file("0.5.12", MLA))
    rep = engine.apply(FIX, LocalFixHost(), engine.FixRequest(
        target_file=str(p), strategy="native", state_dir=str(tmp_path / "s"),
        overrides={"compute_cap": "12.0", "flashinfer_version": "0.6.18", "kv_cache_dtype": "fp8_e4m3"}))
    assert rep.outcome.kind == "refused" and "SM12.0" in rep.outcome.reason


def test_no_fp8_kv_is_skipped(tmp_path):
    p = tmp_path / "f.py"
    p.write_bytes(sglang_file("0.5.12", MLA))
    rep, after, _ = engine.plan(FIX, LocalFixHost(), engine.FixRequest(
        target_file=str(p), overrides={"kv_cache_dtype": "auto"}))
    assert rep.outcome.kind == "skipped" and after is None


# -------------------------------------------------------------------------- safety rules


def _applied(tmp_path, version="0.5.12"):
    p = tmp_path / "flashinfer_mla_backend.py"
    p.write_bytes(sglang_file(version, MLA))
    req = engine.FixRequest(target_file=str(p), state_dir=str(tmp_path / "state"))
    rep = engine.apply(FIX, LocalFixHost(), req)
    assert rep.outcome.kind == "applied"
    return p, req, rep


def test_expect_sha256_mismatch_refuses(tmp_path):
    p = tmp_path / "f.py"
    data = sglang_file("0.5.12", MLA)
    p.write_bytes(data)
    rep = engine.apply(FIX, LocalFixHost(), engine.FixRequest(
        target_file=str(p), state_dir=str(tmp_path / "s"), expect_sha256="0" * 64))
    assert rep.outcome.kind == "refused" and "changed since the check" in rep.outcome.reason
    assert p.read_bytes() == data


def test_revert_refuses_a_file_changed_after_apply_unless_forced(tmp_path):
    p, req, rep = _applied(tmp_path)
    original = sglang_file("0.5.12", MLA)
    p.write_bytes(p.read_bytes() + b"# edited\n")
    r = engine.revert(FIX, LocalFixHost(), req)
    assert r.outcome.kind == "refused" and "neither" in r.outcome.reason
    req.force = True
    r = engine.revert(FIX, LocalFixHost(), req)
    assert r.outcome.kind == "reverted" and p.read_bytes() == original


def test_revert_refuses_a_corrupt_backup(tmp_path):
    p, req, rep = _applied(tmp_path)
    backup = rep.outcome.details["backup"]
    with open(backup, "ab") as f:
        f.write(b"#")
    patched = p.read_bytes()
    r = engine.revert(FIX, LocalFixHost(), req)
    assert r.outcome.kind == "failed" and "does not match" in r.outcome.reason
    assert p.read_bytes() == patched


def test_manifest_records_hashes_and_mode_is_kept(tmp_path):
    p = tmp_path / "f.py"
    p.write_bytes(sglang_file("0.5.14", MLA))
    os.chmod(p, 0o640)
    req = engine.FixRequest(target_file=str(p), state_dir=str(tmp_path / "state"))
    rep = engine.apply(FIX, LocalFixHost(), req)
    man = json.loads(open(rep.manifest).read())
    assert man["sha256_before"] == sha(sglang_file("0.5.14", MLA))
    assert man["sha256_after"] == sha(p.read_bytes())
    assert man["variant"] == "mla-0.5.14" and man["strategy"] == "pages"
    assert os.stat(p).st_mode & 0o777 == 0o640


def test_switching_strategy_needs_a_revert(tmp_path):
    p, req, _ = _applied(tmp_path)
    req.strategy = "native"
    req.overrides = {"compute_cap": "9.0", "flashinfer_version": "0.6.18"}
    rep = engine.apply(FIX, LocalFixHost(), req)
    assert rep.outcome.kind == "refused" and "revert it first" in rep.outcome.reason


def _fix_cli(*args):
    return invoke("fix", "fp8-kv-cast", *args)


def test_cli_a_fix_that_does_not_apply_exits_4_and_says_it_once(tmp_path):
    """The README's exit codes: a fix that does not apply here (no FP8 KV cache: skipped) or is
    refused exits 4 with one error line; neither is also printed as a report line on stdout. A
    --revert with nothing to revert is not an error (exit 0)."""
    p = tmp_path / "flashinfer_mla_backend.py"
    p.write_bytes(sglang_file("0.5.12", MLA))
    st = ["--target-file", str(p), "--port", "0", "--state-dir", str(tmp_path / "s")]
    r = _fix_cli(*st, "--kv-cache-dtype", "auto")
    assert r.returncode == 4, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "does not apply here" in err[0] and "kv_cache_dtype is 'auto'" in err[0], r.stderr
    assert "kv_cache_dtype is 'auto'" not in r.stdout, r.stdout
    r = _fix_cli(*st, "--kv-cache-dtype", "fp8_e4m3", "--strategy", "native", "--gpu-cc", "12.0",
                 "--flashinfer-version", "0.6.18", "--apply")
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr.count("refused") == 1 and "refused" not in r.stdout and "SM12.0" in r.stderr, r.stdout + r.stderr
    assert p.read_bytes() == sglang_file("0.5.12", MLA)
    r = _fix_cli(*st, "--kv-cache-dtype", "fp8_e4m3", "--revert")
    assert r.returncode == 0 and "nothing to revert" in r.stdout, r.stdout + r.stderr
