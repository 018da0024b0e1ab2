"""Reading the attention backend's code structure (``ast``): classes, methods, the KV-pool casts,
assignments and calls around them. :class:`_Refuse` means 'not a known shape'."""

from __future__ import annotations

import ast
from typing import Optional


class _Refuse(Exception):
    pass


# ------------------------------------------------------------------------------ ast helpers


def _dotted(node: Optional[ast.AST]) -> str:
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


def _casts(fn: ast.FunctionDef) -> list[tuple[ast.Assign, str, ast.expr]]:
    """Statements ``NAME = <buffer>.to(q.dtype)`` in ``fn`` whose buffer is the KV pool
    (``…get_key_buffer(layer.layer_id)``) or a DCP gather (``…dcp_kv_buffer``).
    Returns (statement, kind, buffer expression)."""
    out: list[tuple[ast.Assign, str, ast.expr]] = []
    for st in ast.walk(fn):
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)):
            continue
        v = st.value
        if not (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "to"):
            continue
        if len(v.args) != 1 or v.keywords or not _is_q_dtype(v.args[0]):
            continue
        buf = v.func.value
        if (
            isinstance(buf, ast.Call)
            and isinstance(buf.func, ast.Attribute)
            and buf.func.attr == "get_key_buffer"
            and len(buf.args) == 1
            and not buf.keywords
            and _dotted(buf.args[0]) == "layer.layer_id"
        ):
            out.append((st, "pool", buf))
        elif isinstance(buf, ast.Attribute) and buf.attr == "dcp_kv_buffer":
            out.append((st, "dcp", buf))
    out.sort(key=lambda t: t[0].lineno)
    return out


def _pool_owner(buf: ast.expr) -> str:
    """Who holds the KV pool of a pool cast's buffer, ``<owner>.get_key_buffer(...)``."""
    if not (isinstance(buf, ast.Call) and isinstance(buf.func, ast.Attribute)):
        return "?"
    owner = _dotted(buf.func.value)
    if owner == "forward_batch.token_to_kv_pool":
        return "forward_batch"
    if owner == "self.token_to_kv_pool":
        return "self"
    return owner or "?"


def _assigned_before(fn: ast.FunctionDef, name: str, lineno: int) -> Optional[ast.Assign | ast.AnnAssign]:
    best: Optional[ast.Assign | ast.AnnAssign] = None
    for st in ast.walk(fn):
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and st.lineno < lineno:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            for t in targets:
                names = (
                    [t] if isinstance(t, ast.Name) else [e for e in getattr(t, "elts", []) if isinstance(e, ast.Name)]
                )
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
