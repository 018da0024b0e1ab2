"""The apply: the checked patch written with a byte-exact backup and a manifest (sha256 before /
after) in the state folder on the host; refused if the file changed since the check; written
atomically and read back. Applying twice is ``AlreadyApplied``."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Optional

from perfscope import __version__
from perfscope.errors import FixRefused
from perfscope.fixengine.check import Planned, check, patch_bytes
from perfscope.fixengine.environment import probe_env
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.model import Applied, Environment, Failed, FixModule, Refused
from perfscope.fixengine.request import FixRequest, Report
from perfscope.fixengine.state import created_pointer, lock_path, state_dir_for
from perfscope.util.files import sha256_bytes


def apply(
    fix: FixModule, host: FixHost, req: FixRequest, env: Optional[Environment] = None, planned: Optional[Planned] = None
) -> Report:
    """Check, then patch with a backup and a manifest; one apply or revert at a time per host
    (a lock in the state folder), and a failed write leaves no manifest behind. ``planned``: the
    check already made (with this ``env``), written as it is unless its fix does work at apply time."""
    env = env or probe_env(host, req)
    with host.lock(lock_path(host, req)):
        if planned is None:
            planned = check(fix, host, req, env, applying=True)
        elif planned.after is not None and not planned.prepared:
            planned = patch_bytes(fix, host, env, planned, applying=True)
        return _write(fix, host, req, env, planned)


def _sha_or_absent(host: FixHost, path: str, absent: bool) -> str:
    return sha256_bytes(b"") if absent and not host.exists(path) else host.sha256(path)


def _suffix(path: str) -> str:
    ext = os.path.splitext(path)[1]
    return ext if ext and len(ext) <= 10 and ext[1:].isalnum() else ".bak"


def _write(fix: FixModule, host: FixHost, req: FixRequest, env: Environment, planned: Planned) -> Report:
    rep, after = planned.report, planned.after
    if after is None:
        return rep
    path, before = rep.path, rep.sha256_before
    assert path is not None and before is not None and rep.sha256_after is not None
    absent = before == sha256_bytes(b"") and not host.exists(path)  # a file the fix creates
    if req.expect_sha256 and req.expect_sha256 != before:
        rep.outcome = Refused(
            f"{path} changed since the check (sha256 {before[:12]}…, expected {req.expect_sha256[:12]}…): check again"
        )
        return rep
    m = host.mode(path)
    if m is not None and not m & 0o222:
        rep.outcome = Refused(
            f"{path} is read-only (mode {m:04o}): someone made it so on purpose; "
            "chmod u+w it first if it should be patched"
        )
        return rep
    folder = state_dir_for(host, req, fix, path)
    host.makedirs(folder)
    backup = join(host, folder, f"original-{before}{_suffix(path)}")
    try:
        original = b"" if absent else host.read_bytes(path)
    except FixRefused as e:
        rep.outcome = Refused(str(e))
        return rep
    if sha256_bytes(original) != before:
        rep.outcome = Refused(f"{path} changed since the check: nothing written; check again")
        return rep
    host.write_bytes_atomic(backup, original, mode=0o600)
    if host.sha256(backup) != before:
        rep.outcome = Failed(f"backup {backup} does not read back intact: nothing patched")
        return rep
    manifest = {
        "fix": fix.id,
        "target": rep.target,
        "path": path,
        "variant": rep.variant,
        "strategy": rep.strategy,
        "sha256_before": before,
        "sha256_after": rep.sha256_after,
        "size_before": len(original),
        "size_after": len(after),
        "backup": os.path.basename(backup),
        "host": host.label,
        "applied_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "perfscope": __version__,
        "sglang_version": rep.env.sglang_version if rep.env else None,
    }
    parent = os.path.dirname(path)
    if absent:
        manifest["absent_before"] = True  # revert removes the file (and the folder if the fix made it)
        if not host.exists(parent):
            manifest["created_dir"] = parent
            host.makedirs(parent)
    mpath = join(host, folder, "manifest.json")
    host.write_bytes_atomic(mpath, (json.dumps(manifest, indent=2) + "\n").encode(), mode=0o600)
    if absent and env.sglang_root:
        # the file's name came from facts read off the live server (the model's shape): --revert finds
        # it again from the install alone, with the server down
        host.write_bytes_atomic(
            created_pointer(host, req, fix, env.sglang_root),
            (json.dumps({"path": path, "manifest": mpath}) + "\n").encode(),
            mode=0o600,
        )
    try:
        # last look before writing: the file must still be the one the patch was computed from (the
        # pinned target: the file resolved at the check, refused if anything else is there now)
        if _sha_or_absent(host, path, absent) != before:
            raise FixRefused(f"{path} changed while patching: nothing written; check again")
        host.write_bytes_atomic(path, after, tmp_dir=folder)  # temp file in the state folder, not the package
    except BaseException as e:
        # the file was not replaced (the writer renames only a complete temp file): no manifest
        # may claim it was
        with contextlib.suppress(Exception):
            host.run(["rm", "-f", "--", mpath])
        if isinstance(e, FixRefused):
            rep.outcome = Refused(str(e))
            return rep
        raise
    if host.sha256(path) != rep.sha256_after:
        if absent:
            host.run(["rm", "-f", "--", path])
        else:
            host.write_bytes_atomic(path, original, tmp_dir=folder)
        rep.outcome = Failed(f"{path} did not read back as written; the original was put back")
        return rep
    rep.manifest = mpath
    rep.outcome = Applied(
        f"patched {path} ({rep.target} {rep.variant}, {rep.strategy} strategy); backup and manifest in {folder}",
        details={"backup": backup},
    )
    return rep
