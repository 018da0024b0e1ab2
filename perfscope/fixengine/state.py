"""A fix's state on the host: the state root, one folder per fix and target file with its manifest
and byte-exact backup, the pointer to a file a fix created, and the lock that serialises apply and
revert.

State lives in ``$XDG_STATE_HOME/perfscope/fixes`` (default ``~/.local/state/perfscope/fixes``) or
``--state-dir``: ``<fix-id>/<sha256(path)[:16]>/`` holds ``manifest.json`` and ``original-<sha256>.py``.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Optional

from perfscope.errors import FixRefused, PerfscopeError
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.model import Environment, FixModule
from perfscope.fixengine.request import FixRequest
from perfscope.util import jsonio


def state_root(host: FixHost, req: FixRequest) -> str:
    if req.state_dir:
        return req.state_dir
    if host.remote:
        r = host.run(["sh", "-c", 'printf %s "${XDG_STATE_HOME:-$HOME/.local/state}"'])
        base = r.stdout.strip()
        if r.rc != 0 or not base.startswith("/"):
            base = join(host, host.home(), ".local", "state")
    else:
        base = os.environ.get("XDG_STATE_HOME") or os.path.join(host.home(), ".local", "state")
    return join(host, base, "perfscope", "fixes")


def path_key(path: str) -> str:
    """The name of a path's folder in the state root (a path may be long, or have any character)."""
    return hashlib.sha256(path.encode()).hexdigest()[:16]


def state_dir_for(host: FixHost, req: FixRequest, fix: FixModule, path: str) -> str:
    return join(host, state_root(host, req), fix.id, path_key(path))


def lock_path(host: FixHost, req: FixRequest) -> str:
    return join(host, state_root(host, req), ".lock")


def load_manifest(host: FixHost, folder: str) -> Optional[dict[str, Any]]:
    p = join(host, folder, "manifest.json")
    if not host.exists(p):
        return None
    man = jsonio.loads(
        host.read_bytes(p),
        f"{p} (fix manifest; refusing to touch the file, remove it by hand)",
        error=FixRefused,
        expect=dict,
    )
    for key in ("backup", "sha256_before", "sha256_after"):
        v = man.get(key)
        if not isinstance(v, str) or not v or (key == "backup" and ("/" in v or v.startswith("."))):
            raise FixRefused(
                f"{p}: fix manifest has no usable {key!r}; refusing to touch the file (remove the manifest by hand)"
            )
    for key in ("strategy", "variant", "applied_at"):
        if man.get(key) is not None and not isinstance(man[key], str):
            raise FixRefused(f"{p}: fix manifest's {key!r} is not text; refusing to touch the file")
    return man


def retire_manifest(host: FixHost, folder: str) -> None:
    src = join(host, folder, "manifest.json")
    data = host.read_bytes(src)
    host.write_bytes_atomic(join(host, folder, f"manifest-reverted-{int(time.time())}.json"), data, mode=0o600)
    host.run(["rm", "-f", src])


def fix_on_top(
    host: FixHost, req: FixRequest, fix: FixModule, path: str, cur: str, ours_after: str
) -> Optional[tuple[str, str]]:
    """(fix id, manifest path) of another perfscope fix of ``path`` in the same state root whose
    manifest explains the file's state ``cur``: applied on top of this one, or still applied."""
    from perfscope.fixengine.registry import discover

    key = path_key(path)
    for other in sorted(discover()):
        if other == fix.id:
            continue
        folder = join(host, state_root(host, req), other, key)
        try:
            man = load_manifest(host, folder)
        except PerfscopeError:
            continue
        if man and (man["sha256_after"] == cur or man["sha256_before"] == ours_after):
            return other, join(host, folder, "manifest.json")
    return None


def created_pointer(host: FixHost, req: FixRequest, fix: FixModule, sglang_root: str) -> str:
    return join(host, state_root(host, req), fix.id, f"created-in-{path_key(sglang_root)}.json")


def created_path(host: FixHost, req: FixRequest, fix: FixModule, env: Environment) -> Optional[str]:
    """The file this fix created in this install at its last apply (``created_pointer``), for a revert
    that cannot name it from the server's facts."""
    if not env.sglang_root:
        return None
    p = created_pointer(host, req, fix, env.sglang_root)
    if not host.exists(p):
        return None
    got = jsonio.loads(host.read_bytes(p), p, error=FixRefused, expect=dict)
    path = got.get("path")
    root = env.sglang_root.rstrip("/") + "/"
    return path if isinstance(path, str) and path.startswith(root) and "/../" not in path else None
