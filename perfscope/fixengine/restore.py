"""The revert: verify the backup's sha256 against the manifest, refuse if the current file is neither
the patched nor the original one (unless ``force``), restore byte for byte."""

from __future__ import annotations

import os
from typing import Optional

from perfscope.errors import FixRefused
from perfscope.fixengine.check import base_report, resolve_target
from perfscope.fixengine.edit import unified_diff
from perfscope.fixengine.environment import probe_env
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.model import Environment, Failed, FixModule, Refused, Reverted, Skipped
from perfscope.fixengine.request import FixRequest, Report
from perfscope.fixengine.state import fix_on_top, load_manifest, lock_path, retire_manifest, state_dir_for
from perfscope.util.files import sha256_bytes


def revert(fix: FixModule, host: FixHost, req: FixRequest, env: Optional[Environment] = None) -> Report:
    env = env or probe_env(host, req)
    with host.lock(lock_path(host, req)):
        return _revert(fix, host, req, env)


def _revert(fix: FixModule, host: FixHost, req: FixRequest, env: Environment) -> Report:
    spec, path, data = resolve_target(fix, host, env, req, reverting=True)
    rep = base_report(fix, env, spec, path, data)
    folder = state_dir_for(host, req, fix, path)
    man = load_manifest(host, folder)
    cur = sha256_bytes(data)
    if man is None:
        if fix.marker and fix.marker.encode() in data:
            rep.outcome = Refused(
                f"{path} is patched but {folder} has no manifest, so the original cannot be "
                "restored byte for byte (reinstall sglang, or pass the --state-dir used at apply)"
            )
        else:
            rep.outcome = Skipped(f"{path} is not patched by {fix.id}: nothing to revert")
        return rep
    rep.manifest = join(host, folder, "manifest.json")
    rep.strategy, rep.variant = man.get("strategy"), man.get("variant")
    backup = join(host, folder, man["backup"])
    if not host.exists(backup):
        rep.outcome = Refused(f"backup {backup} is missing: cannot restore the original")
        return rep
    original = host.read_bytes(backup)
    if sha256_bytes(original) != man["sha256_before"]:
        rep.outcome = Failed(f"backup {backup} does not match the manifest's sha256: refusing to restore it")
        return rep
    if cur == man["sha256_before"]:
        rep.outcome = Skipped(f"{path} is already the original")
        retire_manifest(host, folder)
        return rep
    if cur != man["sha256_after"] and not req.force:
        other = fix_on_top(host, req, fix, path, cur, man["sha256_after"])
        if other:
            rep.outcome = Refused(
                f"{path} was patched again by perfscope fix {other[0]} after {fix.id} (its manifest "
                f"{other[1]} has this file's state): revert {other[0]} first, then {fix.id}"
            )
            return rep
        rep.outcome = Refused(
            f"{path} is neither the patched file nor the original (sha256 {cur[:12]}…): it was "
            "changed after the patch (sglang reinstalled or edited?); --force restores the "
            "original anyway"
        )
        return rep
    if man.get("absent_before"):
        # the fix created the file: the original state is no file (and no folder, when it made that too)
        host.run(["rm", "-f", "--", path])
        made = man.get("created_dir")
        if isinstance(made, str) and made == os.path.dirname(path):
            host.run(["rmdir", "--", made])  # only if empty
        if host.exists(path):
            rep.outcome = Failed(f"{path} could not be removed")
            return rep
        rep.sha256_after = man["sha256_before"]
        rep.diff = unified_diff(data, b"", path)
        retire_manifest(host, folder)
        rep.outcome = Reverted(f"removed {path}, which {fix.id} had created: SGLang's install is as before")
        return rep
    try:
        host.write_bytes_atomic(path, original, tmp_dir=folder)  # the pinned target (see _apply)
    except FixRefused as e:
        rep.outcome = Refused(str(e))
        return rep
    if host.sha256(path) != man["sha256_before"]:
        rep.outcome = Failed(f"{path} did not read back as the original after restoring")
        return rep
    rep.sha256_after = man["sha256_before"]
    rep.diff = unified_diff(data, original, path)
    retire_manifest(host, folder)
    rep.outcome = Reverted(f"restored {path} byte for byte (sha256 {man['sha256_before'][:12]}…)")
    return rep
