"""Variant detection: which known structure (variant) a target file has, with the anchors and facts
the transformation needs; an unknown structure is refused, never patched by guess."""

from __future__ import annotations

import ast
from typing import TypedDict

from perfscope.fixengine.edit import SourceIndex
from perfscope.fixengine.model import Detection, Environment, TargetSpec, parse_version

from .shapes import (
    _assigned_before,
    _assigned_between,
    _calls_after,
    _casts,
    _class,
    _dotted,
    _method,
    _pool_owner,
    _Refuse,
    _uses_name,
)
from .targets import FA3, MARKER, REPRO

# Versions whose sources the test suite checks (released wheels). Newer versions are handled when
# their structure is a known variant, with a note; an unknown structure is refused.
TESTED_MAX = (0, 5, 23, -1)
REFUSED_RANGE = ((0, 4, 6, -1), (0, 4, 6, 4))  # 0.4.6 .. 0.4.6.post4

# (pool accessor, cast layout, plan argument style, dcp cast) -> variant name
MLA_VARIANTS = {
    ("forward_batch", "split", "positional", False): "mla-0.4.6.post5",  # 0.4.6.post5 - 0.5.12 (but 0.5.1)
    ("forward_batch", "split", "keyword", False): "mla-0.5.1",
    ("self", "oneline", "positional", False): "mla-0.5.14",  # 0.5.14 - 0.5.15
    ("self", "oneline", "positional", True): "mla-0.5.16-dcp",  # 0.5.16 - 0.5.23
}
FA3_VARIANTS = {
    ("forward_batch", "split"): "fa3-0.4.10",  # 0.4.10.post2 - 0.5.12
    ("forward_batch", "oneline"): "fa3-0.4.10",
    ("self", "split"): "fa3-0.5.14",  # 0.5.14 - 0.5.23
    ("self", "oneline"): "fa3-0.5.14",
}


class _Plan(TypedDict):
    """A FlashInfer MLA plan() call and the node of its KV dtype argument."""

    call: ast.Call
    kv: ast.expr
    fast: bool


class _Fa3Site(TypedDict):
    """One FA3 pool cast and what its kernel call reads."""

    stmt: ast.Assign
    buf: ast.expr
    page_table: str
    seqlens: str
    fallback: str


def detect(target: TargetSpec, data: bytes, env: Environment) -> Detection:
    text = data.decode("utf-8", "replace")
    if MARKER in text:
        strategy = None
        for s in ("native", "pages"):
            if f"# perfscope fp8-kv-cast strategy: {s}" in text:
                strategy = s
        return Detection(target.name, None, "patched", "already patched by perfscope", patched_strategy=strategy)
    try:
        tree = ast.parse(data)
    except SyntaxError as e:
        return Detection(target.name, None, "unknown", f"file does not parse as Python: {e.msg} (line {e.lineno})")
    try:
        if target is FA3:
            return _detect_fa3(tree, data, env)
        return _detect_mla(target, tree, data, env)
    except _Refuse as e:
        return Detection(target.name, None, "unknown", f"unknown shape: {e}; refusing to patch by guess")


def _version_note(det: Detection, env: Environment) -> None:
    v = parse_version(env.sglang_version)
    if v and v > TESTED_MAX:
        det.facts.setdefault("notes", []).append(
            f"sglang {env.sglang_version} is newer than the last version checked against released "
            f"source (0.5.23); its structure matches the known variant {det.variant}"
        )


def _backend(tree: ast.Module, name: str):
    """The attention backend class and its forward_extend / forward_decode; refused if any is missing."""
    backend = _class(tree, name)
    if backend is None:
        raise _Refuse(f"no class {name}")
    fe, fd = _method(backend, "forward_extend"), _method(backend, "forward_decode")
    if fe is None or fd is None:
        raise _Refuse(f"{name} lacks forward_extend / forward_decode")
    return backend, fe, fd


def _detect_mla(target: TargetSpec, tree: ast.Module, data: bytes, env: Environment) -> Detection:
    idx = SourceIndex(data)
    backend, fe, fd = _backend(tree, "FlashInferMLAAttnBackend")
    upd_d = _class(tree, "FlashInferMLAIndicesUpdaterDecode")
    upd_p = _class(tree, "FlashInferMLAIndicesUpdaterPrefill")
    if upd_d is None or upd_p is None:
        raise _Refuse("no FlashInferMLAIndicesUpdaterDecode / FlashInferMLAIndicesUpdaterPrefill")
    ext_casts, dec_casts = _casts(fe), _casts(fd)

    # sglang 0.4.6 - 0.4.6.post4: no cast, the FP8 dtype is given to plan() for q as well
    init_d = _method(upd_d, "__init__")
    dt_src = None
    for st in ast.walk(init_d) if init_d else []:
        if isinstance(st, ast.Assign) and any(_dotted(t) == "self.data_type" for t in st.targets):
            dt_src = _dotted(st.value)
    if not ext_casts and not dec_casts and dt_src == "model_runner.kv_cache_dtype":
        v = parse_version(env.sglang_version)
        ver = f"sglang {env.sglang_version}" if env.sglang_version else "this sglang (0.4.6 - 0.4.6.post4 shape)"
        return Detection(
            target.name,
            "mla-0.4.6",
            "refused",
            f"{ver} has no pool cast to remove: it plans FlashInfer MLA with the FP8 KV dtype for the "
            "query too, which fails to JIT-compile with an FP8 KV cache (sglang#5651); upgrade to "
            "0.4.6.post5 or later, then run this fix",
            facts={"version_tuple": v},
        )

    pool_e = [c for c in ext_casts if c[1] == "pool"]
    pool_d = [c for c in dec_casts if c[1] == "pool"]
    dcp_e = [c for c in ext_casts if c[1] == "dcp"]
    if len(pool_e) != 1 or len(pool_d) != 1:
        raise _Refuse(
            f"expected one KV-pool cast in forward_extend and one in forward_decode, found "
            f"{len(pool_e)} and {len(pool_d)}"
        )
    if [c for c in dec_casts if c[1] == "dcp"] or len(dcp_e) > 1:
        raise _Refuse("unexpected DCP buffer casts")
    owners = {_pool_owner(pool_e[0][2]), _pool_owner(pool_d[0][2])}
    if len(owners) != 1 or owners - {"forward_batch", "self"}:
        raise _Refuse(f"KV pool reached through {sorted(owners)}")
    owner = owners.pop()
    layouts = {"oneline" if st.lineno == st.end_lineno else "split" for st, _, _ in pool_e + pool_d}
    if len(layouts) != 1:
        raise _Refuse("the two casts are laid out differently")
    layout = layouts.pop()

    # names the helper calls need, assigned before the casts
    d_stmt, e_stmt = pool_d[0][0], pool_e[0][0]
    need = [(fd, "decode_wrapper", d_stmt), (fd, "q_nope", d_stmt), (fe, "prefill_wrapper_paged", e_stmt)]
    for fn, name, st in need:
        if _assigned_before(fn, name, st.lineno) is None:
            raise _Refuse(f"{fn.name} does not set {name} before the cast")
    dw = _assigned_before(fd, "decode_wrapper", d_stmt.lineno)
    if dw is None or _dotted(dw.value) != "self.forward_metadata.decode_wrapper":
        raise _Refuse("decode_wrapper is not self.forward_metadata.decode_wrapper")
    pw = _assigned_before(fe, "prefill_wrapper_paged", e_stmt.lineno)
    if pw is None or _dotted(pw.value) != "self.forward_metadata.prefill_wrapper":
        raise _Refuse("prefill_wrapper_paged is not self.forward_metadata.prefill_wrapper")
    init_b = _method(backend, "__init__")
    has_indptr = init_b is not None and any(
        isinstance(s, ast.Assign) and any(_dotted(t) == "self.kv_indptr" for t in s.targets) for s in ast.walk(init_b)
    )
    if not has_indptr and target is not REPRO:
        raise _Refuse("FlashInferMLAAttnBackend.__init__ does not set self.kv_indptr")

    # the run() call consuming each cast
    runs = {}
    for fn, st, wname in ((fd, d_stmt, "decode_wrapper"), (fe, e_stmt, "prefill_wrapper_paged")):
        var = _dotted(st.targets[0])  # a Name: _casts keeps only `NAME = ...`
        calls = _calls_after(
            fn,
            st.lineno,
            lambda c, w=wname, v=var: (
                isinstance(c.func, ast.Attribute)
                and c.func.attr == "run"
                and _dotted(c.func.value) == w
                and any(_uses_name(a, v) for a in c.args)
            ),
        )
        if len(calls) != 1:
            raise _Refuse(f"{fn.name}: expected one {wname}.run(...) reading {var}, found {len(calls)}")
        runs[fn.name] = calls[0]
        if any(k.arg in ("ckv_scale", "kpe_scale") for k in calls[0].keywords):
            raise _Refuse(f"{fn.name}: run() already passes KV scales")

    # the dtypes given to plan()
    plans: list[_Plan] = []
    styles: set[str] = set()
    for cls, expected in ((upd_d, 2), (upd_p, 1)):
        cbf = _method(cls, "call_begin_forward")
        if cbf is None:
            raise _Refuse(f"{cls.name} has no call_begin_forward")
        found: list[_Plan] = []
        for c in ast.walk(cbf):
            if not isinstance(c, ast.Call):
                continue
            is_plan = isinstance(c.func, ast.Attribute) and c.func.attr == "plan"
            is_fast = isinstance(c.func, ast.Name) and c.func.id in ("fast_mla_decode_plan", "fast_mla_prefill_plan")
            if not (is_plan or is_fast):
                continue
            kw = {k.arg: k.value for k in c.keywords}
            if "kv_data_type" in kw:
                q_node, kv_node, style = kw.get("q_data_type"), kw["kv_data_type"], "keyword"
            elif len(c.args) == (13 if is_fast else 12):
                q_node, kv_node, style = c.args[-2], c.args[-1], "positional"
            else:
                raise _Refuse(f"{cls.name}: a plan() call with {len(c.args)} positional arguments")
            if _dotted(kv_node) != "self.data_type" or _dotted(q_node) not in ("self.data_type", "self.q_data_type"):
                raise _Refuse(f"{cls.name}: plan() dtypes are {_dotted(q_node) or '?'} / {_dotted(kv_node) or '?'}")
            found.append({"call": c, "kv": kv_node, "fast": is_fast})
            if not is_fast:
                styles.add(style)
        n_plan = sum(1 for f in found if not f["fast"])
        if n_plan != expected and not (target is REPRO and 1 <= n_plan <= expected):
            raise _Refuse(f"{cls.name}.call_begin_forward: expected {expected} plan() calls, found {n_plan}")
        plans.extend(found)
    if len(styles) != 1:
        raise _Refuse("plan() is called both positionally and with keywords")
    style = styles.pop()

    # where the native kv dtype is computed: after `self.data_type = model_runner.dtype`
    inits = []
    for cls in (upd_d, upd_p):
        init = _method(cls, "__init__")
        hit = [
            s
            for s in (init.body if init else [])
            if isinstance(s, ast.Assign)
            and any(_dotted(t) == "self.data_type" for t in s.targets)
            and _dotted(s.value) == "model_runner.dtype"
        ]
        if len(hit) != 1:
            raise _Refuse(f"{cls.name}.__init__ does not set self.data_type = model_runner.dtype once")
        inits.append(hit[0])

    key = (owner, layout, style, bool(dcp_e))
    variant = MLA_VARIANTS.get(key)
    if variant is None:
        raise _Refuse(f"structure {key} is not a known variant")
    anchors = [
        {"what": "forward_extend cast", "line": e_stmt.lineno, "text": idx.segment(e_stmt)},
        {"what": "forward_decode cast", "line": d_stmt.lineno, "text": idx.segment(d_stmt)},
        *({"what": "forward_extend DCP cast", "line": c[0].lineno, "text": idx.segment(c[0])} for c in dcp_e),
        *(
            {
                "what": "plan() kv_data_type",
                "line": p["kv"].lineno,
                "text": idx.segment(p["call"]).splitlines()[0] + " …",
            }
            for p in plans
        ),
    ]
    det = Detection(
        target.name,
        variant,
        "original",
        "",
        anchors=anchors,
        facts={
            "tree": tree,
            "ext": pool_e[0],
            "dec": pool_d[0],
            "dcp": dcp_e[0] if dcp_e else None,
            "runs": runs,
            "plans": plans,
            "inits": inits,
            # the repro server plans eagerly only: its decode wrapper's index list is exact
            "indptr": "self.kv_indptr" if has_indptr else "None",
        },
    )
    _version_note(det, env)
    return det


def _detect_fa3(tree: ast.Module, data: bytes, env: Environment) -> Detection:
    idx = SourceIndex(data)
    backend, fe, fd = _backend(tree, "FlashAttentionBackend")
    ce = [c for c in _casts(fe) if c[1] == "pool"]
    cd = [c for c in _casts(fd) if c[1] == "pool"]
    if not ce and not cd:
        return Detection(
            FA3.name,
            "fa3-no-cast",
            "not-applicable",
            "this fa3 backend does not convert the KV pool (it hands FA3 an FP8 query "
            "and the FP8 pool): nothing to fix",
        )
    if len(ce) != 1 or len(cd) != 1:
        raise _Refuse(
            f"expected one KV-pool cast in forward_extend and one in forward_decode, found {len(ce)} and {len(cd)}"
        )
    init_b = _method(backend, "__init__")
    if init_b is None or not any(
        isinstance(s, ast.Assign) and any(_dotted(t) == "self.page_size" for t in s.targets) for s in ast.walk(init_b)
    ):
        raise _Refuse("FlashAttentionBackend.__init__ does not set self.page_size")
    sites: dict[str, _Fa3Site] = {}
    for fn, (st, _, buf) in ((fe, ce[0]), (fd, cd[0])):
        # the first flash_attn_with_kvcache(...) after the cast reads views of the cast's target
        nested = [
            (n.lineno, n.end_lineno)
            for n in ast.walk(fn)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and n is not fn
        ]
        calls = _calls_after(
            fn,
            st.lineno,
            lambda c: _dotted(c.func) == "flash_attn_with_kvcache" and not any(a <= c.lineno <= b for a, b in nested),  # noqa: B023 (called within this iteration)
        )
        if not calls:
            raise _Refuse(f"{fn.name}: no flash_attn_with_kvcache call after the cast")
        call = calls[0]
        kw = {k.arg: k.value for k in call.keywords}
        if "page_table" not in kw or "cache_seqlens" not in kw:
            raise _Refuse(f"{fn.name}: flash_attn_with_kvcache without page_table / cache_seqlens")
        pt, sl = kw["page_table"], kw["cache_seqlens"]
        roots = {n.id for n in ast.walk(pt) if isinstance(n, ast.Name)} | {
            n.id for n in ast.walk(sl) if isinstance(n, ast.Name)
        }
        for name in roots - {"self"}:
            if _assigned_before(fn, name, st.lineno) is None:
                raise _Refuse(f"{fn.name}: {name} is not set before the cast")
        moved = _assigned_between(fn, roots, st.lineno, call.lineno)
        if moved:
            raise _Refuse(f"{fn.name}: {sorted(moved)} change between the cast and the kernel call")
        # Paths that read other pages than (page_table, cache_seqlens) keep the whole-pool cast:
        # cascade (speculative top-k > 1 reads a second page table), context-parallel chunks.
        flags = [f for f in ("use_cascade_attn", "cp_active") if _assigned_before(fn, f, st.lineno) is not None]
        sites[fn.name] = {
            "stmt": st,
            "buf": buf,
            "page_table": idx.segment(pt),
            "seqlens": idx.segment(sl),
            "fallback": " or ".join(flags) or "False",
        }
    owners = {_pool_owner(ce[0][2]), _pool_owner(cd[0][2])}
    layouts = {"oneline" if c[0].lineno == c[0].end_lineno else "split" for c in ce + cd}
    if len(owners) != 1:
        raise _Refuse("the two casts reach the pool differently")
    owner = owners.pop()
    variant = FA3_VARIANTS.get((owner, "split" if "split" in layouts else "oneline"))
    if variant is None:
        raise _Refuse(f"pool reached through {owner}")
    anchors = [
        {"what": f"{name} cast", "line": s["stmt"].lineno, "text": idx.segment(s["stmt"])} for name, s in sites.items()
    ]
    det = Detection(FA3.name, variant, "original", "", anchors=anchors, facts={"tree": tree, "sites": sites})
    _version_note(det, env)
    return det
