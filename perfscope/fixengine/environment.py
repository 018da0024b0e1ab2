"""What the host runs, for a fix to decide on: the server's interpreter and its sglang / FlashInfer /
torch / Triton, the sglang install, the GPU, and the server's settings (``/server_info``)."""

from __future__ import annotations

import json
import os
import re
from typing import Callable, Optional

from perfscope.errors import PerfscopeError
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.model import Environment
from perfscope.fixengine.request import FixRequest

_SGLANG_ROOT_PY = (
    "import importlib.util, json\n"
    "s = importlib.util.find_spec('sglang')\n"
    "print(json.dumps(list(s.submodule_search_locations) if s and s.submodule_search_locations else []))\n"
)


def _read_version_py(host: FixHost, root: str) -> Optional[str]:
    for rel in ("_version.py", "version.py"):  # _version.py: generated, exact
        p = join(host, root, rel)
        if host.exists(p):
            vm = re.search(
                rb"""__version__\s*(?::\s*str\s*)?=\s*version\s*=\s*['"]([^'"]+)|__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)""",
                host.read_bytes(p),
            )
            if vm:
                return bytes(vm.group(1) or vm.group(2)).decode()
    # a wheel install: ../sglang-X.dist-info
    parent = os.path.dirname(root.rstrip("/"))
    r = host.run(["sh", "-c", 'ls -d "$1"/sglang-*.dist-info 2>/dev/null | head -n 1', "sh", parent])
    m = re.search(r"sglang-([^/]+)\.dist-info", r.stdout or "")
    return m.group(1) if m else None


def probe_env(host: FixHost, req: FixRequest, log: Optional[Callable[[str], None]] = None) -> Environment:
    """What the host runs: the server's interpreter and its sglang / FlashInfer, the GPU, and the
    server's settings (from /server_info when a URL is given). Options override everything."""
    env = Environment(host=host.label)
    say = log or (lambda m: None)
    if req.server_url:
        from perfscope.remote.sglang_api import SGLangClient

        try:
            info = SGLangClient(req.server_url, api_key=req.api_key, timeout=10).server_info()
        except PerfscopeError as e:
            env.notes.append(f"server info not read: {e}")
            info = {}
        if info:
            env.server_url = req.server_url
            env.server_args = dict(info)
            for k_env, k_info in (
                ("sglang_version", "version"),
                ("kv_cache_dtype", "kv_cache_dtype"),
                ("attention_backend", "attention_backend"),
                ("decode_attention_backend", "decode_attention_backend"),
                ("dtype", "dtype"),
            ):
                if info.get(k_info) not in (None, ""):
                    setattr(env, k_env, str(info[k_info]))
                    env.sources[k_env] = "server_info"
    env.facts.update(req.facts)
    recorded = req.facts.get("server_info") if isinstance(req.facts.get("server_info"), dict) else {}
    if not env.server_args and recorded and req.facts.get("trace"):
        # no live /server_info: the traced server's, as the run recorded it (a launch-flag fix then decides
        # from the flags the server had, not from what the finding implies); said, as it may be stale
        env.server_args = dict(recorded)
        env.sources["server_args"] = "run record"
        env.notes.append(
            f"server settings from the run record ({req.facts['trace']}: /server_info when it was "
            "traced), not from the live server"
        )
    need_python = (req.source_fix and not req.target_file) or req.python
    if need_python:
        if req.python:
            cands = [req.python]
        else:
            proc = host.io.server_process(req.port) if req.port else {}
            cands = host.io.python_candidates(proc)
            if proc.get("python_note"):
                env.notes.append(proc["python_note"])
            if proc.get("pid") and cands != ["python3"]:
                env.sources["python"] = f"process {proc['pid']} listening on port {req.port}"
            elif not proc.get("pid"):
                env.notes.append(
                    f"no server process found on port {req.port}: using python3 on PATH "
                    "(pass --python to name the server's interpreter)"
                )
        vers = host.io.python_versions(cands, want="sglang")
        if vers:
            env.python = vers.get("interpreter")
            env.sources.setdefault("python", "--python" if req.python else "python3 on PATH")
            for k in ("flashinfer", "torch", "triton"):
                if vers.get(k):
                    setattr(env, f"{k}_version", vers[k])
                    env.sources[f"{k}_version"] = env.python
            if vers.get("sglang") and not env.sglang_version:
                env.sglang_version = vers["sglang"]
                env.sources["sglang_version"] = env.python
            if vers.get("sglang") and not req.sglang_root and env.python:
                r = host.run([env.python, "-c", _SGLANG_ROOT_PY])
                try:
                    roots = json.loads(r.stdout.strip().splitlines()[-1]) if r.rc == 0 else []
                except (ValueError, IndexError):
                    roots = []
                if roots:
                    env.sglang_root = roots[0]
                    env.sources["sglang_root"] = env.python
    if req.sglang_root:
        root = req.sglang_root.rstrip("/")
        if not host.exists(join(host, root, "srt")) and host.exists(join(host, root, "sglang", "srt")):
            root = join(host, root, "sglang")
        env.sglang_root = root
        env.sources["sglang_root"] = "--sglang-root"
        # the tree named is the one patched: its version.py wins over an interpreter's (the process on
        # --port may be another server's, with another sglang)
        ver = _read_version_py(host, root)
        if ver:
            if env.sglang_version and env.sglang_version != ver and env.sources.get("sglang_version") != "server_info":
                env.notes.append(
                    f"sglang {ver} in --sglang-root {root}; the interpreter found ({env.python}) "
                    f"has sglang {env.sglang_version}: the fix reads the tree it patches"
                )
            if env.sources.get("sglang_version") != "server_info":
                env.sglang_version = ver
                env.sources["sglang_version"] = f"{root}/version.py"
    r = host.run(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"], timeout=30)
    if r.rc == 0 and r.stdout.strip():
        cap, _, name = r.stdout.strip().splitlines()[0].partition(",")
        env.compute_cap, env.gpu_name = cap.strip(), name.strip()
        env.sources["compute_cap"] = "nvidia-smi"
    for k, v in req.overrides.items():
        if v is not None:
            setattr(env, k, v)
            env.sources[k] = "option"
    say(f"environment: {env.to_dict()}")
    return env
