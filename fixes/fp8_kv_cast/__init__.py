"""fp8-kv-cast: stop converting the whole FP8 MLA KV pool to BF16 in every layer of every step.

Targets (see README.md beside this file for the design and the risks):

* ``sglang-flashinfer-mla``: ``sglang/srt/layers/attention/flashinfer_mla_backend.py``,
  0.4.6.post5 - 0.5.23, strategies ``native`` and ``pages``;
* ``sglang-fa3``: ``sglang/srt/layers/attention/flashattention_backend.py`` (absorbed-MLA path),
  0.4.10.post2 - 0.5.23, strategy ``pages``;
* ``repro-server``: ``examples/repro_server/mla_attention.py`` (perfscope's reproduction server,
  written like SGLang 0.5.14+), strategies ``native`` and ``pages``.

Everything is anchored on code structure (``ast``): the cast statements in ``forward_extend`` /
``forward_decode`` of the attention backend class, the dtype arguments given to ``plan()`` in the
indices updaters, and the ``run()`` calls that consume the cast. A file whose structure is not one
of the known variants is refused, never patched by guess.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

from perfscope.fixengine.edit import Edit, SourceIndex, insert_lines_after, statement_edit
from perfscope.fixengine.model import (
    Detection,
    Environment,
    FixModule,
    StrategyChoice,
    TargetSpec,
    parse_version,
)

HERE = Path(__file__).resolve().parent
SNIPPET = (HERE / "snippet.py").read_text(encoding="utf-8")
MARKER = "# >>> perfscope fp8-kv-cast >>>"
END_MARKER = "# <<< perfscope fp8-kv-cast <<<"

MLA = TargetSpec(
    name="sglang-flashinfer-mla",
    relpath="srt/layers/attention/flashinfer_mla_backend.py",
    versions="0.4.6.post5 - 0.5.23 (0.4.6 - 0.4.6.post4 refused: sglang#5651)",
    strategies=("native", "pages"),
    backends=("flashinfer",),
    description="SGLang's FlashInfer MLA backend (forward_decode, forward_extend, plan() dtypes)",
)
FA3 = TargetSpec(
    name="sglang-fa3",
    relpath="srt/layers/attention/flashattention_backend.py",
    versions="0.4.10.post2 - 0.5.23 (0.4.6.post5 does not cast: not applicable)",
    strategies=("pages",),
    backends=("fa3",),
    description="SGLang's FA3 backend, absorbed-MLA path (forward_decode, forward_extend)",
)
REPRO = TargetSpec(
    name="repro-server",
    relpath=None,
    versions="perfscope examples/repro_server (SGLang 0.5.14+ shape)",
    strategies=("native", "pages"),
    backends=("flashinfer", "torch"),
    description="perfscope's reproduction server attention module (examples/repro_server/mla_attention.py)",
)

# Versions whose sources the test suite checks (released wheels). Newer versions are handled when
# their structure is a known variant, with a note; an unknown structure is refused.
TESTED_MAX = (0, 5, 23, -1)
REFUSED_RANGE = ((0, 4, 6, -1), (0, 4, 6, 4))  # 0.4.6 .. 0.4.6.post4
FP8_KV = ("fp8_e4m3", "fp8_e5m2", "fp8")
NATIVE_MIN_FLASHINFER = (0, 6, 14, -1)
NATIVE_FA2_MIN_FLASHINFER = (0, 6, 18, -1)

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


class _Refuse(Exception):
    pass


# ------------------------------------------------------------------------------ ast helpers


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _class(tree: ast.Module, name: str) -> Optional[ast.ClassDef]:
    for n in tree.body:
        if isinstance(n, ast.ClassDef) and n.name == name:
            return n
    return None


def _method(cls: Optional[ast.ClassDef], name: str) -> Optional[ast.FunctionDef]:
    if cls is None:
        return None
    for n in cls.body:
        if isinstance(n, ast.FunctionDef) and n.name == name:
            return n
    return None


def _is_q_dtype(node: ast.AST) -> bool:
    return _dotted(node) == "q.dtype"


def _casts(fn: ast.FunctionDef) -> list[tuple[ast.Assign, str, ast.AST]]:
    """Statements ``NAME = <buffer>.to(q.dtype)`` in ``fn`` whose buffer is the KV pool
    (``…get_key_buffer(layer.layer_id)``) or a DCP gather (``…dcp_kv_buffer``).
    Returns (statement, kind, buffer expression)."""
    out = []
    for st in ast.walk(fn):
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)):
            continue
        v = st.value
        if not (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "to"):
            continue
        if len(v.args) != 1 or v.keywords or not _is_q_dtype(v.args[0]):
            continue
        buf = v.func.value
        if (isinstance(buf, ast.Call) and isinstance(buf.func, ast.Attribute)
                and buf.func.attr == "get_key_buffer" and len(buf.args) == 1 and not buf.keywords
                and _dotted(buf.args[0]) == "layer.layer_id"):
            out.append((st, "pool", buf))
        elif isinstance(buf, ast.Attribute) and buf.attr == "dcp_kv_buffer":
            out.append((st, "dcp", buf))
    out.sort(key=lambda t: t[0].lineno)
    return out


def _pool_owner(buf: ast.Call) -> str:
    owner = _dotted(buf.func.value)
    if owner == "forward_batch.token_to_kv_pool":
        return "forward_batch"
    if owner == "self.token_to_kv_pool":
        return "self"
    return owner or "?"


def _assigned_before(fn: ast.FunctionDef, name: str, lineno: int) -> Optional[ast.Assign]:
    best = None
    for st in ast.walk(fn):
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and st.lineno < lineno:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            for t in targets:
                names = [t] if isinstance(t, ast.Name) else [e for e in getattr(t, "elts", []) if isinstance(e, ast.Name)]
                if any(n.id == name for n in names):
                    best = st
    return best


def _assigned_between(fn: ast.FunctionDef, names: set, a: int, b: int) -> set:
    hit = set()
    for st in ast.walk(fn):
        if isinstance(st, ast.Assign) and a < st.lineno < b:
            for t in st.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id in names:
                        hit.add(n.id)
    return hit


def _calls_after(fn: ast.FunctionDef, lineno: int, pred) -> list[ast.Call]:
    return sorted(
        (c for c in ast.walk(fn) if isinstance(c, ast.Call) and c.lineno > lineno and pred(c)),
        key=lambda c: c.lineno,
    )


def _uses_name(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _snippet_anchor(tree: ast.Module) -> int:
    """Line after which the helper block goes: the last top-level import before the first
    top-level class or function."""
    last = None
    for n in tree.body:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            break
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            last = n
    if last is None:
        raise _Refuse("no top-level import block to put the helper after")
    return last.end_lineno


def _snippet_lines() -> list[str]:
    return ["\n", "\n", *SNIPPET.splitlines(keepends=True), "\n"]


# --------------------------------------------------------------------------------- the fix


class Fp8KvCast(FixModule):
    id = "fp8-kv-cast"
    title = "Stop converting the whole FP8 MLA KV pool to BF16 every layer"
    answers = ("fp8-kv-cast",)
    targets = (MLA, FA3, REPRO)
    strategies = ("native", "pages")
    requirements = {
        "native": "SM90 (H100/H200) GPU, FlashInfer >= 0.6.14 (fa3; >= 0.6.18 also fa2), "
                  "kv_cache_dtype fp8_e4m3, BF16 model; run() gets ckv_scale=kpe_scale=1.0",
        "pages": "any GPU and FlashInfer; Triton (SGLang depends on it) for the CUDA-graph-safe "
                 "row conversion; scratch memory = one layer of the pool in BF16",
    }
    marker = MARKER

    # ---------------------------------------------------------------- target and applicability

    def target_for(self, env: Environment, name: Optional[str]) -> TargetSpec:
        if name:
            for t in self.targets:
                if t.name == name:
                    return t
            raise KeyError(name)
        backend = (env.decode_attention_backend or env.attention_backend or "").lower()
        if backend == "fa3":
            return FA3
        return MLA

    def target_for_file(self, data: bytes) -> TargetSpec:
        """Which target a file given by path is, from its content."""
        text = data.decode("utf-8", "replace")
        if "class FlashAttentionBackend" in text:
            return FA3
        if "class FlashInferMLAAttnBackend" in text and "TorchMLAPagedAttentionWrapper" in text:
            return REPRO
        return MLA

    def applicable(self, env: Environment, target: TargetSpec) -> Optional[str]:
        kv = (env.kv_cache_dtype or "").lower()
        if kv and kv not in FP8_KV:
            return (f"kv_cache_dtype is {env.kv_cache_dtype!r}: the KV pool is not FP8, so there is no "
                    "cast to remove")
        backend = (env.decode_attention_backend or env.attention_backend or "").lower()
        if backend and target.backends and backend not in target.backends and target is not REPRO:
            if backend in ("flashinfer", "fa3"):
                return None  # the caller picked the other target on purpose
            return (f"attention backend is {backend!r}: only 'flashinfer' (FlashInfer MLA) and 'fa3' "
                    "convert the whole pool")
        return None

    # ---------------------------------------------------------------------------- detection

    def detect(self, target: TargetSpec, data: bytes, env: Environment) -> Detection:
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
                return self._detect_fa3(tree, data, env)
            return self._detect_mla(target, tree, data, env)
        except _Refuse as e:
            return Detection(target.name, None, "unknown", f"unknown shape: {e}; refusing to patch by guess")

    def _version_note(self, det: Detection, env: Environment) -> None:
        v = parse_version(env.sglang_version)
        if v and v > TESTED_MAX:
            det.facts.setdefault("notes", []).append(
                f"sglang {env.sglang_version} is newer than the last version checked against released "
                f"source (0.5.23); its structure matches the known variant {det.variant}")

    def _detect_mla(self, target: TargetSpec, tree: ast.Module, data: bytes, env: Environment) -> Detection:
        idx = SourceIndex(data)
        backend = _class(tree, "FlashInferMLAAttnBackend")
        if backend is None:
            raise _Refuse("no class FlashInferMLAAttnBackend")
        fe, fd = _method(backend, "forward_extend"), _method(backend, "forward_decode")
        if fe is None or fd is None:
            raise _Refuse("FlashInferMLAAttnBackend lacks forward_extend / forward_decode")
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
                target.name, "mla-0.4.6", "refused",
                f"{ver} has no pool cast to remove: it plans FlashInfer MLA with the FP8 KV dtype for the "
                "query too, which fails to JIT-compile with an FP8 KV cache (sglang#5651); upgrade to "
                "0.4.6.post5 or later, then run this fix",
                facts={"version_tuple": v},
            )

        pool_e = [c for c in ext_casts if c[1] == "pool"]
        pool_d = [c for c in dec_casts if c[1] == "pool"]
        dcp_e = [c for c in ext_casts if c[1] == "dcp"]
        if len(pool_e) != 1 or len(pool_d) != 1:
            raise _Refuse(f"expected one KV-pool cast in forward_extend and one in forward_decode, found "
                          f"{len(pool_e)} and {len(pool_d)}")
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
        if _dotted(dw.value) != "self.forward_metadata.decode_wrapper":
            raise _Refuse("decode_wrapper is not self.forward_metadata.decode_wrapper")
        pw = _assigned_before(fe, "prefill_wrapper_paged", e_stmt.lineno)
        if _dotted(pw.value) != "self.forward_metadata.prefill_wrapper":
            raise _Refuse("prefill_wrapper_paged is not self.forward_metadata.prefill_wrapper")
        init_b = _method(backend, "__init__")
        has_indptr = init_b is not None and any(
            isinstance(s, ast.Assign) and any(_dotted(t) == "self.kv_indptr" for t in s.targets) for s in ast.walk(init_b))
        if not has_indptr and target is not REPRO:
            raise _Refuse("FlashInferMLAAttnBackend.__init__ does not set self.kv_indptr")

        # the run() call consuming each cast
        runs = {}
        for fn, st, wname in ((fd, d_stmt, "decode_wrapper"), (fe, e_stmt, "prefill_wrapper_paged")):
            var = st.targets[0].id
            calls = _calls_after(fn, st.lineno, lambda c, w=wname, v=var: (
                isinstance(c.func, ast.Attribute) and c.func.attr == "run" and _dotted(c.func.value) == w
                and any(_uses_name(a, v) for a in c.args)))
            if len(calls) != 1:
                raise _Refuse(f"{fn.name}: expected one {wname}.run(...) reading {var}, found {len(calls)}")
            runs[fn.name] = calls[0]
            if any(k.arg in ("ckv_scale", "kpe_scale") for k in calls[0].keywords):
                raise _Refuse(f"{fn.name}: run() already passes KV scales")

        # the dtypes given to plan()
        plans, styles = [], set()
        for cls, expected in ((upd_d, 2), (upd_p, 1)):
            cbf = _method(cls, "call_begin_forward")
            if cbf is None:
                raise _Refuse(f"{cls.name} has no call_begin_forward")
            found = []
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
            hit = [s for s in (init.body if init else []) if isinstance(s, ast.Assign)
                   and any(_dotted(t) == "self.data_type" for t in s.targets) and _dotted(s.value) == "model_runner.dtype"]
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
            *({"what": "plan() kv_data_type", "line": p["kv"].lineno, "text": idx.segment(p["call"]).splitlines()[0] + " …"}
              for p in plans),
        ]
        det = Detection(target.name, variant, "original", "", anchors=anchors, facts={
            "tree": tree, "ext": pool_e[0], "dec": pool_d[0], "dcp": dcp_e[0] if dcp_e else None,
            "runs": runs, "plans": plans, "inits": inits,
            # the repro server plans eagerly only: its decode wrapper's index list is exact
            "indptr": "self.kv_indptr" if has_indptr else "None",
        })
        self._version_note(det, env)
        return det

    def _detect_fa3(self, tree: ast.Module, data: bytes, env: Environment) -> Detection:
        idx = SourceIndex(data)
        backend = _class(tree, "FlashAttentionBackend")
        if backend is None:
            raise _Refuse("no class FlashAttentionBackend")
        fe, fd = _method(backend, "forward_extend"), _method(backend, "forward_decode")
        if fe is None or fd is None:
            raise _Refuse("FlashAttentionBackend lacks forward_extend / forward_decode")
        ce = [c for c in _casts(fe) if c[1] == "pool"]
        cd = [c for c in _casts(fd) if c[1] == "pool"]
        if not ce and not cd:
            return Detection(FA3.name, "fa3-no-cast", "not-applicable",
                             "this fa3 backend does not convert the KV pool (it hands FA3 an FP8 query "
                             "and the FP8 pool): nothing to fix")
        if len(ce) != 1 or len(cd) != 1:
            raise _Refuse(f"expected one KV-pool cast in forward_extend and one in forward_decode, found "
                          f"{len(ce)} and {len(cd)}")
        init_b = _method(backend, "__init__")
        if init_b is None or not any(
            isinstance(s, ast.Assign) and any(_dotted(t) == "self.page_size" for t in s.targets) for s in ast.walk(init_b)
        ):
            raise _Refuse("FlashAttentionBackend.__init__ does not set self.page_size")
        sites = {}
        for fn, (st, _, buf) in ((fe, ce[0]), (fd, cd[0])):
            var = st.targets[0].id
            # the first flash_attn_with_kvcache(...) after the cast reads views of `var`
            nested = [(n.lineno, n.end_lineno) for n in ast.walk(fn)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and n is not fn]
            calls = _calls_after(fn, st.lineno, lambda c: _dotted(c.func) == "flash_attn_with_kvcache" and not any(
                a <= c.lineno <= b for a, b in nested))
            if not calls:
                raise _Refuse(f"{fn.name}: no flash_attn_with_kvcache call after the cast")
            call = calls[0]
            kw = {k.arg: k.value for k in call.keywords}
            if "page_table" not in kw or "cache_seqlens" not in kw:
                raise _Refuse(f"{fn.name}: flash_attn_with_kvcache without page_table / cache_seqlens")
            pt, sl = kw["page_table"], kw["cache_seqlens"]
            roots = {n.id for n in ast.walk(pt) if isinstance(n, ast.Name)} | {
                n.id for n in ast.walk(sl) if isinstance(n, ast.Name)}
            for name in roots - {"self"}:
                if _assigned_before(fn, name, st.lineno) is None:
                    raise _Refuse(f"{fn.name}: {name} is not set before the cast")
            moved = _assigned_between(fn, roots, st.lineno, call.lineno)
            if moved:
                raise _Refuse(f"{fn.name}: {sorted(moved)} change between the cast and the kernel call")
            # Paths that read other pages than (page_table, cache_seqlens) keep the whole-pool cast:
            # cascade (speculative top-k > 1 reads a second page table), context-parallel chunks.
            flags = [f for f in ("use_cascade_attn", "cp_active") if _assigned_before(fn, f, st.lineno) is not None]
            sites[fn.name] = {"stmt": st, "buf": buf, "page_table": idx.segment(pt), "seqlens": idx.segment(sl),
                              "fallback": " or ".join(flags) or "False"}
        owners = {_pool_owner(ce[0][2]), _pool_owner(cd[0][2])}
        layouts = {"oneline" if c[0].lineno == c[0].end_lineno else "split" for c in ce + cd}
        if len(owners) != 1:
            raise _Refuse("the two casts reach the pool differently")
        owner = owners.pop()
        variant = FA3_VARIANTS.get((owner, "split" if "split" in layouts else "oneline"))
        if variant is None:
            raise _Refuse(f"pool reached through {owner}")
        anchors = [{"what": f"{name} cast", "line": s["stmt"].lineno, "text": idx.segment(s["stmt"])}
                   for name, s in sites.items()]
        det = Detection(FA3.name, variant, "original", "", anchors=anchors, facts={"tree": tree, "sites": sites})
        self._version_note(det, env)
        return det

    # ------------------------------------------------------------------------------ strategy

    def choose_strategy(self, target: TargetSpec, det: Detection, env: Environment,
                        requested: str = "auto") -> StrategyChoice:
        rejected = {}
        why_not_native = self._native_blockers(target, env)
        if why_not_native:
            rejected["native"] = "; ".join(why_not_native)
        if requested == "native":
            if "native" in rejected:
                return StrategyChoice(None, f"--strategy native cannot work here: {rejected['native']}", rejected)
            return StrategyChoice("native", "requested; " + self._native_reason(target, env), rejected)
        if requested == "pages":
            return StrategyChoice("pages", "requested: converts only the KV rows the batch reads (any GPU)", rejected)
        if "native" not in rejected:
            return StrategyChoice("native", self._native_reason(target, env), rejected)
        return StrategyChoice(
            "pages",
            "converts only the KV rows the batch reads, on any GPU and FlashInfer, CUDA graphs included "
            f"(native not chosen: {rejected['native']})",
            rejected,
        )

    def _native_reason(self, target: TargetSpec, env: Environment) -> str:
        how = ("the MLA kernel reads the FP8 pool itself (plan kv_data_type = FP8, run with ckv_scale = "
               "kpe_scale = 1.0); no conversion at all")
        if target is REPRO and env.sm is None:
            return ("no GPU here: the reproduction server's attention reads the FP8 pool directly and "
                    "upcasts only the rows it attends to")
        return f"SM{env.compute_cap} with FlashInfer {env.flashinfer_version or 'unknown'}: {how}"

    def _native_blockers(self, target: TargetSpec, env: Environment) -> list[str]:
        out = []
        if "native" not in target.strategies:
            return [f"{target.name} has no FP8-reading kernel to hand the pool to (FA3's MLA path needs BF16 KV "
                    "with a BF16 query)"]
        if target is REPRO:
            if env.compute_cap and env.sm != (9, 0) and env.compute_cap != "cpu":
                out.append(f"GPU is SM{env.compute_cap}")
            return out
        sm = env.sm
        if sm is None:
            out.append("GPU compute capability unknown (no nvidia-smi answer; pass --gpu-cc)")
        elif sm[0] != 9:
            out.append(f"GPU is SM{env.compute_cap}: FlashInfer's MLA kernels read FP8 KV with a BF16 query "
                       "only on SM90 (SM100 trtllm-gen wants equal dtypes; SM120 has none)")
        fi = parse_version(env.flashinfer_version)
        if not fi:
            out.append("FlashInfer version unknown")
        elif fi < NATIVE_MIN_FLASHINFER:
            out.append(f"FlashInfer {env.flashinfer_version} < 0.6.14 has no BF16-query/FP8-KV MLA kernel "
                       "('DType must be 16bit')")
        kv = (env.kv_cache_dtype or "").lower()
        if kv == "fp8_e5m2":
            out.append("kv_cache_dtype fp8_e5m2: FlashInfer's FP8 MLA path reads e4m3 only")
        if env.dtype and env.dtype.lower() not in ("bfloat16", "bf16", "auto"):
            out.append(f"model dtype {env.dtype}: the FP8 MLA path needs a BF16 query")
        return out

    # ----------------------------------------------------------------------------- transform

    def transform(self, target: TargetSpec, det: Detection, data: bytes, strategy: str) -> tuple[bytes, list]:
        from perfscope.fixengine.edit import apply_edits

        idx = SourceIndex(data)
        tree = det.facts["tree"]
        edits: list[Edit] = []
        notes: list[str] = []
        head = [*_snippet_lines()[:2], f"# perfscope fp8-kv-cast strategy: {strategy}\n", *_snippet_lines()[2:]]
        edits.append(insert_lines_after(idx, _snippet_anchor(tree), head, "helper block"))
        if target is FA3:
            for name, s in det.facts["sites"].items():
                st = s["stmt"]
                var = st.targets[0].id
                fallback = s["fallback"]
                edits.append(statement_edit(idx, st, [
                    f"{var} = _perfscope_fp8kv_paged(",
                    f"    {idx.segment(s['buf'])},",
                    "    q.dtype,",
                    f"    {s['page_table']},",
                    f"    {s['seqlens']},",
                    "    self.page_size,",
                    f"    {fallback},",
                    ")",
                ], f"{name} cast"))
            return apply_edits(data, edits), notes

        ext_st, _, ext_buf = det.facts["ext"]
        dec_st, _, dec_buf = det.facts["dec"]
        edits.append(statement_edit(idx, dec_st, [
            f"{dec_st.targets[0].id} = _perfscope_fp8kv_decode(",
            f"    {idx.segment(dec_buf)},",
            "    q.dtype,",
            "    decode_wrapper,",
            f"    {det.facts['indptr']},",
            "    q_nope.shape[0],",
            ")",
        ], "forward_decode cast"))
        edits.append(statement_edit(idx, ext_st, [
            f"{ext_st.targets[0].id} = _perfscope_fp8kv_extend(",
            f"    {idx.segment(ext_buf)}, q.dtype, prefill_wrapper_paged",
            ")",
        ], "forward_extend cast"))
        if strategy == "native":
            dcp = det.facts["dcp"]
            if dcp is not None:
                st, _, buf = dcp
                edits.append(statement_edit(idx, st, [
                    f"{st.targets[0].id} = _perfscope_fp8kv_keep(",
                    f"    {idx.segment(buf)}, q.dtype, prefill_wrapper_paged",
                    ")",
                ], "forward_extend DCP cast"))
            for fname, wname, var in (("forward_decode", "decode_wrapper", dec_st.targets[0].id),
                                      ("forward_extend", "prefill_wrapper_paged", ext_st.targets[0].id)):
                call = det.facts["runs"][fname]
                items = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
                last = items[-1]
                indent = idx.indent_of(last.lineno)
                if last.lineno == call.lineno or len(indent.encode()) != last.col_offset:
                    raise ValueError(f"{fname}: {wname}.run(...) is not laid out one argument per line")
                tail = idx.line(last.end_lineno)[last.end_col_offset:].decode("utf-8")
                if not tail.lstrip().startswith(","):
                    edits.append(Edit((last.end_lineno, last.end_col_offset), (last.end_lineno, last.end_col_offset),
                                      ",", f"{fname} run() trailing comma"))
                edits.append(insert_lines_after(idx, last.end_lineno, [
                    f"{indent}**_perfscope_fp8kv_scales({wname}, {var}),\n"], f"{fname} run() scales"))
            for p in det.facts["plans"]:
                kv = p["kv"]
                edits.append(Edit((kv.lineno, kv.col_offset), (kv.end_lineno, kv.end_col_offset),
                                  "self._perfscope_kv_data_type", "plan() kv_data_type"))
            for st in det.facts["inits"]:
                ind = idx.indent_of(st.lineno)
                edits.append(insert_lines_after(idx, st.end_lineno, [
                    f"{ind}self._perfscope_kv_data_type = _perfscope_fp8kv_plan_dtype(model_runner)\n"],
                    "kv dtype for plan()"))
            notes.append("native: plan() gets the pool's FP8 dtype where the GPU/FlashInfer support it (checked "
                         "again at server start); otherwise the patched code falls back to the pages conversion")
        return apply_edits(data, edits), notes

    # ------------------------------------------------------------------------ post-conditions

    def postconditions(self, target: TargetSpec, det: Detection, before: bytes, after: bytes,
                       strategy: str) -> list[str]:
        from perfscope.fixengine.edit import compiles

        problems = []
        err = compiles(after)
        if err:
            problems.append(f"patched file does not compile: {err}")
            return problems
        text = after.decode("utf-8")
        if text.count(MARKER) != 1 or text.count(END_MARKER) != 1:
            problems.append("helper block markers missing or duplicated")
        tree = ast.parse(after)
        if target is FA3:
            backend = _class(tree, "FlashAttentionBackend")
            for name in ("forward_extend", "forward_decode"):
                if _casts(_method(backend, name)):
                    problems.append(f"{name} still converts the whole pool")
        else:
            backend = _class(tree, "FlashInferMLAAttnBackend")
            for name in ("forward_extend", "forward_decode"):
                left = [c for c in _casts(_method(backend, name)) if c[1] == "pool"]
                if left:
                    problems.append(f"{name} still converts the whole pool")
            if strategy == "native":
                n = text.count("self._perfscope_kv_data_type,") + text.count("kv_data_type=self._perfscope_kv_data_type")
                if n < len(det.facts["plans"]):
                    problems.append("plan() calls do not all get the KV dtype")
            # the chunked-KV runner's fresh k/v casts must be untouched
            chunk_b, chunk_a = _class(ast.parse(before), "FlashInferMhaChunkKVRunner"), _class(tree, "FlashInferMhaChunkKVRunner")
            if (chunk_b is None) != (chunk_a is None) or (
                chunk_b is not None and ast.dump(chunk_b) != ast.dump(chunk_a)):
                problems.append("FlashInferMhaChunkKVRunner changed")
        return problems


FIX = Fp8KvCast()
