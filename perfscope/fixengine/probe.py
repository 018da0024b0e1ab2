"""`--probe`: run a fix's probe script with the server's interpreter on the server's host, before
anything is patched. The script (``fixes/<id>/probe_script.py``) prints one JSON line."""

from __future__ import annotations

import json

from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.model import Environment, FixModule


def run_probe(fix: FixModule, host: FixHost, env: Environment, strategy: str, timeout: float = 600.0) -> dict:
    script = fix.folder / "probe_script.py" if fix.folder else None
    if script is None or not script.is_file():
        return {"ok": False, "reason": f"{fix.id} has no probe"}
    if not env.python:
        return {"ok": False, "reason": "the server's python is unknown: pass --python"}
    snippet = fix.folder / "snippet.py"
    r = host.run(["mktemp", "-d", "/tmp/perfscope-probe.XXXXXX"])
    tmp = r.stdout.strip()
    if r.rc != 0 or not tmp:
        return {"ok": False, "reason": f"cannot make a temp folder on {host.label}"}
    try:
        sp = join(host, tmp, "snippet.py")
        pp = join(host, tmp, "probe.py")
        host.write_bytes_atomic(sp, snippet.read_bytes() if snippet.is_file() else b"")
        host.write_bytes_atomic(pp, script.read_bytes())  # a file: Triton's @jit needs real source files
        r = host.run([env.python, pp, strategy, sp], timeout=timeout)
    finally:
        host.run(["rm", "-rf", tmp])
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (r.stderr or r.stdout or "").strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "reason": f"probe did not run (rc {r.rc}): {tail[0][:300]}"}
    res["strategy"] = strategy
    return res
