"""The transformation (statement edits plus the helper block from snippet.py) and the checks on the
patched file (post-conditions)."""

from __future__ import annotations

import ast
from pathlib import Path

from perfscope.fixengine.edit import Edit, SourceIndex, end_lineno, insert_lines_after, statement_edit
from perfscope.fixengine.model import Detection, TargetSpec

from .shapes import _casts, _class, _method, _Refuse
from .targets import END_MARKER, FA3, MARKER

HERE = Path(__file__).resolve().parent
SNIPPET = (HERE / "snippet.py").read_text(encoding="utf-8")


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
    return end_lineno(last)


def _snippet_lines() -> list[str]:
    return ["\n", "\n", *SNIPPET.splitlines(keepends=True), "\n"]


def transform(target: TargetSpec, det: Detection, data: bytes, strategy: str) -> tuple[bytes, list]:
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
            edits.append(
                statement_edit(
                    idx,
                    st,
                    [
                        f"{var} = _perfscope_fp8kv_paged(",
                        f"    {idx.segment(s['buf'])},",
                        "    q.dtype,",
                        f"    {s['page_table']},",
                        f"    {s['seqlens']},",
                        "    self.page_size,",
                        f"    {fallback},",
                        ")",
                    ],
                    f"{name} cast",
                )
            )
        return apply_edits(data, edits), notes

    ext_st, _, ext_buf = det.facts["ext"]
    dec_st, _, dec_buf = det.facts["dec"]
    edits.append(
        statement_edit(
            idx,
            dec_st,
            [
                f"{dec_st.targets[0].id} = _perfscope_fp8kv_decode(",
                f"    {idx.segment(dec_buf)},",
                "    q.dtype,",
                "    decode_wrapper,",
                f"    {det.facts['indptr']},",
                "    q_nope.shape[0],",
                ")",
            ],
            "forward_decode cast",
        )
    )
    edits.append(
        statement_edit(
            idx,
            ext_st,
            [
                f"{ext_st.targets[0].id} = _perfscope_fp8kv_extend(",
                f"    {idx.segment(ext_buf)}, q.dtype, prefill_wrapper_paged",
                ")",
            ],
            "forward_extend cast",
        )
    )
    if strategy == "native":
        dcp = det.facts["dcp"]
        if dcp is not None:
            st, _, buf = dcp
            edits.append(
                statement_edit(
                    idx,
                    st,
                    [
                        f"{st.targets[0].id} = _perfscope_fp8kv_keep(",
                        f"    {idx.segment(buf)}, q.dtype, prefill_wrapper_paged",
                        ")",
                    ],
                    "forward_extend DCP cast",
                )
            )
        for fname, wname, var in (
            ("forward_decode", "decode_wrapper", dec_st.targets[0].id),
            ("forward_extend", "prefill_wrapper_paged", ext_st.targets[0].id),
        ):
            call = det.facts["runs"][fname]
            items = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
            last = items[-1]
            indent = idx.indent_of(last.lineno)
            if last.lineno == call.lineno or len(indent.encode()) != last.col_offset:
                raise ValueError(f"{fname}: {wname}.run(...) is not laid out one argument per line")
            tail = idx.line(last.end_lineno)[last.end_col_offset :].decode("utf-8")
            if not tail.lstrip().startswith(","):
                edits.append(
                    Edit(
                        (last.end_lineno, last.end_col_offset),
                        (last.end_lineno, last.end_col_offset),
                        ",",
                        f"{fname} run() trailing comma",
                    )
                )
            edits.append(
                insert_lines_after(
                    idx,
                    last.end_lineno,
                    [f"{indent}**_perfscope_fp8kv_scales({wname}, {var}),\n"],
                    f"{fname} run() scales",
                )
            )
        for p in det.facts["plans"]:
            kv = p["kv"]
            edits.append(
                Edit(
                    (kv.lineno, kv.col_offset),
                    (kv.end_lineno, kv.end_col_offset),
                    "self._perfscope_kv_data_type",
                    "plan() kv_data_type",
                )
            )
        for st in det.facts["inits"]:
            ind = idx.indent_of(st.lineno)
            edits.append(
                insert_lines_after(
                    idx,
                    st.end_lineno,
                    [f"{ind}self._perfscope_kv_data_type = _perfscope_fp8kv_plan_dtype(model_runner)\n"],
                    "kv dtype for plan()",
                )
            )
        notes.append(
            "native: plan() gets the pool's FP8 dtype where the GPU/FlashInfer support it (checked "
            "again at server start); otherwise the patched code falls back to the pages conversion"
        )
    return apply_edits(data, edits), notes


def _patched_method(backend: ast.ClassDef | None, name: str) -> ast.FunctionDef:
    """The method ``name`` of the patched backend (detection refused a file without it, and the
    edits only add lines)."""
    fn = _method(backend, name)
    if fn is None:
        raise ValueError(f"the patched file has no {name} in its attention backend")
    return fn


def postconditions(target: TargetSpec, det: Detection, before: bytes, after: bytes, strategy: str) -> list[str]:
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
            if _casts(_patched_method(backend, name)):
                problems.append(f"{name} still converts the whole pool")
    else:
        backend = _class(tree, "FlashInferMLAAttnBackend")
        for name in ("forward_extend", "forward_decode"):
            left = [c for c in _casts(_patched_method(backend, name)) if c[1] == "pool"]
            if left:
                problems.append(f"{name} still converts the whole pool")
        if strategy == "native":
            n = text.count("self._perfscope_kv_data_type,") + text.count("kv_data_type=self._perfscope_kv_data_type")
            if n < len(det.facts["plans"]):
                problems.append("plan() calls do not all get the KV dtype")
        # the chunked-KV runner's fresh k/v casts must be untouched
        chunk_b, chunk_a = (
            _class(ast.parse(before), "FlashInferMhaChunkKVRunner"),
            _class(tree, "FlashInferMhaChunkKVRunner"),
        )
        if (chunk_b is None) != (chunk_a is None) or (
            chunk_b is not None and chunk_a is not None and ast.dump(chunk_b) != ast.dump(chunk_a)
        ):
            problems.append("FlashInferMhaChunkKVRunner changed")
    return problems
