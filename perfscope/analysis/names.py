"""Readable kernel names: ``at::native::unrolled_elementwise_kernel<...direct_copy...LoadWithCast>``
becomes ``unrolled_elementwise_kernel [direct_copy cast->BFloat16]``; mangled names are unmangled
far enough to read. A kernel that is only a generic entry point (CUTLASS's ``device_kernel<K>`` /
``Kernel<K>`` / ``Kernel2<K>``, CK-tile's ``kentry<N, K>``, cuBLAS's ``gemvx::kernel<...>``) is named by
the kernel type it runs: ``cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>``
reads ``grouped_gemm::fp8_dptp128c_acc::GemmKernel``, not ``device_kernel``."""

from __future__ import annotations

import re
from functools import lru_cache

_LAMBDA_TYPE = re.compile(r"\{lambda\((?:c10::)?(\w+)\)#\d+\}")
_FUNCTOR = re.compile(r"(?:native::|::)(\w*(?:Functor|_kernel_cuda|Op)\w*)")
_MANGLED = re.compile(r"^_Z+N?")
# torch's reductions are all `reduce_kernel<.., ReduceOp<T, Ops>>`: the Ops (ArgMaxOps, MeanOps,
# func_wrapper_t<T, sum_functor<..>>) say what it reduces
_REDUCE_OPS = re.compile(r"ReduceOp<[\w:]+, (?:\w+::)*(?:func_wrapper_t<[\w:]+, (?:\w+::)*)?(\w+)")
# torch's lambda kernels: the host function the lambda is defined in (`silu_kernel(at::TensorIteratorBase&)`)
_LAMBDA_FN = re.compile(r"(?:native::|fbgemm_gpu::)(\w+)(?:<[^<>()]*>)?\((?:at::TensorIterator|at::Tensor)")


def _demangle_idents(name: str) -> str:
    """Read the nested identifiers of an Itanium-mangled name (no templates): good enough to read."""
    s = _MANGLED.sub("", name)
    parts: list[str] = []
    i = 0
    while i < len(s) and len(parts) < 4:
        m = re.match(r"(\d+)", s[i:])
        if not m:
            break
        n = int(m.group(1))
        i += len(m.group(1))
        parts.append(s[i : i + n])
        i += n
    return "::".join(p for p in parts if p) or name


def _strip_templates(name: str) -> str:
    """``a<b<c>>::d<(x)>(y)>`` -> ``a::d``-style text: template arguments dropped. A ``<``/``>`` inside
    parentheses within a template argument is a comparison (``enable_if<(((8)>(0)))&&...>``), not a
    bracket."""
    out, depth, paren = [], 0, 0
    for ch in name:
        if depth and ch == "(":
            paren += 1
        elif depth and ch == ")":
            paren = max(0, paren - 1)
        elif ch == "<" and not paren:
            depth += 1
        elif ch == ">" and not paren:
            depth = max(0, depth - 1)
            if not depth:
                paren = 0
        elif depth == 0:
            out.append(ch)
    return "".join(out)


_ANON_NS = "(anonymous namespace)::"


# entry points that run the kernel type they are instantiated with: their own name says nothing
_GENERIC_ENTRY = {"device_kernel", "Kernel", "Kernel2", "kentry", "GenericKernel", "kernel_entry"}
# entry points named only `kernel` whose template arguments are parameters, not a kernel type:
# their namespace names them (cuBLAS `internal::gemvx::kernel<int, float, ...>` -> `gemvx::kernel`)
_BARE_ENTRY = {"kernel"}
# namespaces that only repeat what the rest of the path says (a kernel type keeps at most 3 parts)
_NOISE_NS = {"", "void", "dpsk", "cuda", "detail", "kernels", "impl", "internal", "at", "native", "cutlass"}
_BUILTIN = re.compile(
    r"^(?:const |unsigned |signed )*(?:int|long|short|char|bool|float|double|void|half|"
    r"__half|__nv_bfloat16|__nv_fp8\w*|u?int\d+_t|std::|c10::|cute::|true|false)\b"
)
_MANGLED_IDENT = re.compile(r"(?<!\d)(?=(\d+)([A-Za-z_][A-Za-z0-9_]*))")


def _split_top(args: str) -> list[str]:
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in args:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _entry_and_args(name: str) -> tuple[str, str]:
    """(qualified name of the kernel function, its template argument text) of a demangled name."""
    from perfscope.analysis.buckets import without_params

    head = without_params(name).strip()
    args = ""
    if head.endswith(">"):
        depth = 0
        for i in range(len(head) - 1, -1, -1):
            if head[i] == ">":
                depth += 1
            elif head[i] == "<":
                depth -= 1
                if depth == 0:
                    head, args = head[:i], head[i + 1 : -1]
                    break
    # the last space-separated token outside templates is the function (drops `void`, return types)
    depth, cut = 0, 0
    for i, ch in enumerate(head):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i + 1
    return head[cut:], args


def _readable_type(t: str) -> str:
    parts = [p for p in _strip_templates(t).split("::") if p.strip() not in _NOISE_NS]
    return "::".join(p.strip() for p in parts[-3:])


def _entry_kernel_type(name: str) -> str | None:
    """The kernel type a generic entry point runs, readable; None when the name is no such entry."""
    if name.startswith("_Z"):
        ident = _demangle_idents(name)
        if ident.split("::")[-1] not in _GENERIC_ENTRY:
            return None
        s = _MANGLED.sub("", name)
        pos = s.find(ident.split("::")[-1])
        for m in _MANGLED_IDENT.finditer(s, pos + len(ident.split("::")[-1])):
            n = int(m.group(1))
            if n >= 4 and len(m.group(2)) >= n:
                return m.group(2)[:n]
        return None
    func, args = _entry_and_args(name)
    parts = func.split("::")
    if parts[-1] in _BARE_ENTRY and len(parts) > 1:
        return "::".join(parts[-2:])
    if parts[-1] not in _GENERIC_ENTRY:
        return None
    for a in _split_top(args) if args else []:
        if re.match(r"^[A-Za-z_][\w:]*", a) and not _BUILTIN.match(a):
            r = _readable_type(a)
            if r:
                return r
    return None


@lru_cache(maxsize=16384)
def short_name(name: str) -> str:
    # torch's and sgl-kernel's kernels live in anonymous namespaces: that is no part of their name
    name = name.replace(_ANON_NS, "")
    entry = _entry_kernel_type(name)
    if entry:
        return entry[:120]
    if name.startswith("_Z"):
        return _demangle_idents(name)[:120]
    base = name[5:] if name.startswith("void ") else name
    head = _strip_templates(base.split("(", 1)[0] if "<" not in base.split("(", 1)[0] else base)
    head = head.split("(", 1)[0].strip()
    head = head.rsplit(" ", 1)[-1]  # a return type before the function (`std::enable_if<..>::type f<..>`)
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
        r = _REDUCE_OPS.search(name) if f and f[0] == "ReduceOp" else None
        lam = None if f else _LAMBDA_FN.search(name)
        if r:
            tags.append(r.group(1))
        elif f:
            tags.append(f[0])
        elif lam:
            tags.append(lam.group(1))
    s = head + (f" [{' '.join(tags)}]" if tags else "")
    return s[:120]
