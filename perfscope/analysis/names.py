"""Readable kernel names: ``at::native::unrolled_elementwise_kernel<...direct_copy...LoadWithCast>``
becomes ``unrolled_elementwise_kernel [direct_copy cast->BFloat16]``; mangled names are unmangled
far enough to read."""

from __future__ import annotations

import re
from functools import lru_cache

_LAMBDA_TYPE = re.compile(r"\{lambda\((?:c10::)?(\w+)\)#\d+\}")
_FUNCTOR = re.compile(r"(?:native::|::)(\w*(?:Functor|_kernel_cuda|Op)\w*)")
_MANGLED = re.compile(r"^_Z+N?")


def _demangle_idents(name: str) -> str:
    """Read the nested identifiers of an Itanium-mangled name (no templates): good enough to read."""
    s = _MANGLED.sub("", name)
    parts = []
    i = 0
    while i < len(s) and len(parts) < 4:
        m = re.match(r"(\d+)", s[i:])
        if not m:
            break
        n = int(m.group(1))
        i += len(m.group(1))
        parts.append(s[i:i + n])
        i += n
    return "::".join(p for p in parts if p) or name


def _strip_templates(name: str) -> str:
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


@lru_cache(maxsize=16384)
def short_name(name: str) -> str:
    if name.startswith("_Z"):
        return _demangle_idents(name)[:120]
    base = name[5:] if name.startswith("void ") else name
    head = _strip_templates(base.split("(", 1)[0] if "<" not in base.split("(", 1)[0] else base)
    head = head.split("(", 1)[0].strip()
    head = head.split("::")[-1] if "::" in head else head
    if not head:
        head = base[:60]
    tags = []
    if "direct_copy_kernel" in name:
        tags.append("direct_copy")
    if "LoadWithCast" in name:
        t = _LAMBDA_TYPE.findall(name)
        tags.append(f"cast->{t[-1]}" if t else "cast")
    elif "direct_copy_kernel" not in name:
        f = _FUNCTOR.findall(name)
        if f:
            tags.append(f[0])
    s = head + (f" [{' '.join(tags)}]" if tags else "")
    return s[:120]
