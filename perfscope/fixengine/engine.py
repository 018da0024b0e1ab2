"""Check, apply and revert a fix on a host, safely.

* check: find the target, detect its variant, choose the strategy, compute the patch and its
  unified diff; nothing is written.
* apply: the same, then keep a byte-exact backup and a manifest (sha256 before / after) in the
  state folder on the host, refuse if the file changed since the check, write the patched file
  atomically and read it back. Applying twice is ``AlreadyApplied``.
* revert: verify the backup's sha256 against the manifest, refuse if the current file is neither
  the patched nor the original one (unless ``force``), restore byte for byte.

State lives on the host, in ``$XDG_STATE_HOME/perfscope/fixes`` (default
``~/.local/state/perfscope/fixes``) or ``--state-dir``: ``<fix-id>/<sha256(path)[:16]>/``
holds ``manifest.json`` and ``original-<sha256>.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Optional

from perfscope import __version__
from perfscope.errors import FixRefused, InputError, PerfscopeError
from perfscope.fixengine.edit import unified_diff
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.model import (
    AlreadyApplied,
    Applied,
    Checked,
    Environment,
    Failed,
    FixModule,
    Outcome,
    Refused,
    Reverted,
    Skipped,
    TargetSpec,
)
from perfscope.util.files import sha256_bytes


@dataclass
class FixRequest:
    strategy: str = "auto"
    target_file: Optional[str] = None
    sglang_root: Optional[str] = None
    target: Optional[str] = None  # target name, e.g. sglang-fa3
    python: Optional[str] = None
    server_url: Optional[str] = None  # reachable from here (local, or an SSH forward)
    api_key: Optional[str] = field(default=None, repr=False)  # the server's, from --api-key-env; never stored
    port: int = 30000  # the server's port on the host, to find its process
    state_dir: Optional[str] = None
    force: bool = False
    expect_sha256: Optional[str] = None
    overrides: dict = field(default_factory=dict)  # Environment field -> value from options
    launch_file: Optional[str] = None  # a launch-flag fix's target: the server's launch script / unit / compose file
    facts: dict = field(default_factory=dict)  # from --trace: {"findings": [...], "trace": path}
    source_fix: bool = True  # False for launch-flag fixes: the server's python and sglang install are not needed


@dataclass
class Report:
    fix: str
    outcome: Outcome
    env: Optional[Environment] = None
    target: Optional[str] = None
    path: Optional[str] = None
    variant: Optional[str] = None
    strategy: Optional[str] = None
    strategy_reason: str = ""
    rejected: dict = field(default_factory=dict)
    diff: str = ""
    sha256_before: Optional[str] = None
    sha256_after: Optional[str] = None
    anchors: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    manifest: Optional[str] = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "fix": self.fix, **self.outcome.to_dict(), "target": self.target, "path": self.path,
            "variant": self.variant, "strategy": self.strategy, "strategy_reason": self.strategy_reason,
            "rejected_strategies": self.rejected, "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after, "anchors": self.anchors, "notes": self.notes,
            "manifest": self.manifest, "diff": self.diff,
            "environment": self.env.to_dict() if self.env else None, **self.extra,
        }


# ----------------------------------------------------------------------------- environment

_SGLANG_ROOT_PY = (
    "import importlib.util, json\n"
    "s = importlib.util.find_spec('sglang')\n"
    "print(json.dumps(list(s.submodule_search_locations) if s and s.submodule_search_locations else []))\n"
)


def _read_version_py(host: FixHost, root: str) -> Optional[str]:
    for rel in ("_version.py", "version.py"):  # _version.py: generated, exact
        p = join(host, root, rel)
        if host.exists(p):
            m = re.search(rb"""__version__\s*(?::\s*str\s*)?=\s*version\s*=\s*['"]([^'"]+)|__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)""",
                          host.read_bytes(p))
            if m:
                return (m.group(1) or m.group(2)).decode()
    # a wheel install: ../sglang-X.dist-info
    parent = os.path.dirname(root.rstrip("/"))
    r = host.run(["sh", "-c", 'ls -d "$1"/sglang-*.dist-info 2>/dev/null | head -n 1', "sh", parent])
    m = re.search(r"sglang-([^/]+)\.dist-info", r.stdout or "")
    return m.group(1) if m else None


def probe_env(host: FixHost, req: FixRequest, log=None) -> Environment:
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
            for k_env, k_info in (("sglang_version", "version"), ("kv_cache_dtype", "kv_cache_dtype"),
                                  ("attention_backend", "attention_backend"),
                                  ("decode_attention_backend", "decode_attention_backend"), ("dtype", "dtype")):
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
        env.notes.append(f"server settings from the run record ({req.facts['trace']}: /server_info when it was "
                         "traced), not from the live server")
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
                env.notes.append(f"no server process found on port {req.port}: using python3 on PATH "
                                 "(pass --python to name the server's interpreter)")
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
            if vers.get("sglang") and not req.sglang_root:
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
                env.notes.append(f"sglang {ver} in --sglang-root {root}; the interpreter found ({env.python}) "
                                 f"has sglang {env.sglang_version}: the fix reads the tree it patches")
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


# ------------------------------------------------------------------------------------ state


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


def _key(path: str) -> str:
    """The name of a path's folder in the state root (a path may be long, or have any character)."""
    return hashlib.sha256(path.encode()).hexdigest()[:16]


def state_dir_for(host: FixHost, req: FixRequest, fix: FixModule, path: str) -> str:
    return join(host, state_root(host, req), fix.id, _key(path))


def _fix_on_top(host: FixHost, req: FixRequest, fix: FixModule, path: str, cur: str,
                ours_after: str) -> Optional[tuple[str, str]]:
    """(fix id, manifest path) of another perfscope fix of ``path`` in the same state root whose
    manifest explains the file's state ``cur``: applied on top of this one, or still applied."""
    from perfscope.fixengine.registry import discover

    key = _key(path)
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


def load_manifest(host: FixHost, folder: str) -> Optional[dict]:
    p = join(host, folder, "manifest.json")
    if not host.exists(p):
        return None
    from perfscope.util import jsonio

    man = jsonio.loads(host.read_bytes(p), f"{p} (fix manifest; refusing to touch the file, remove it by hand)",
                       error=FixRefused, expect=dict)
    for key in ("backup", "sha256_before", "sha256_after"):
        v = man.get(key)
        if not isinstance(v, str) or not v or (key == "backup" and ("/" in v or v.startswith("."))):
            raise FixRefused(f"{p}: fix manifest has no usable {key!r}; refusing to touch the file "
                             "(remove the manifest by hand)")
    for key in ("strategy", "variant", "applied_at"):
        if man.get(key) is not None and not isinstance(man[key], str):
            raise FixRefused(f"{p}: fix manifest's {key!r} is not text; refusing to touch the file")
    return man


# ----------------------------------------------------------------------------------- target


def _created_pointer(host: FixHost, req: FixRequest, fix: FixModule, sglang_root: str) -> str:
    return join(host, state_root(host, req), fix.id, f"created-in-{_key(sglang_root)}.json")


def _created_path(host: FixHost, req: FixRequest, fix: FixModule, env: Environment) -> Optional[str]:
    """The file this fix created in this install at its last apply (``_created_pointer``), for a revert
    that cannot name it from the server's facts."""
    if not env.sglang_root:
        return None
    p = _created_pointer(host, req, fix, env.sglang_root)
    if not host.exists(p):
        return None
    from perfscope.util import jsonio

    got = jsonio.loads(host.read_bytes(p), p, error=FixRefused, expect=dict)
    path = got.get("path")
    root = env.sglang_root.rstrip("/") + "/"
    return path if isinstance(path, str) and path.startswith(root) and "/../" not in path else None


def resolve_target(fix: FixModule, host: FixHost, env: Environment, req: FixRequest,
                   reverting: bool = False) -> tuple[TargetSpec, str, bytes]:
    gather = getattr(fix, "gather", None)
    if gather is not None:
        gather(host, env)  # facts the fix reads on the host before it knows its target
    if fix.kind == "launch":
        if not req.launch_file:
            raise InputError(f"{fix.id} edits the server's launch command: give --launch-file F")
        env.facts["launch_file"] = req.launch_file
        return fix.target_for(env, req.target), req.launch_file, host.pin(req.launch_file)
    if req.target_file:
        path = req.target_file
        data = host.pin(path)
        if req.target:
            spec = fix.target_for(env, req.target)
        elif hasattr(fix, "target_for_file"):
            spec = fix.target_for_file(data)
        else:
            spec = fix.target_for(env, None)
        return spec, path, data
    try:
        spec = fix.target_for(env, req.target)
    except KeyError:
        names = ", ".join(t.name for t in fix.targets)
        raise InputError(f"--target {req.target}: unknown (this fix knows {names})") from None
    if not spec.relpath:
        made = _created_path(host, req, fix, env) if reverting and spec.creates else None
        if made is not None:  # the server is gone, but the install says what this fix created in it
            return spec, made, (host.pin(made) if host.exists(made) else b"")
        if spec.creates and spec.description:  # a file the fix names from facts it could not read
            raise InputError(f"{fix.id}: cannot name the file to write: {spec.description}")
        raise InputError(f"target {spec.name} has no place in an sglang install: give --target-file")
    if not env.sglang_root:
        where = f" with {env.python}" if env.python else ""
        raise InputError(f"sglang not found{where} on {host.label}: give --python (the server's interpreter), "
                         "--sglang-root DIR or --target-file F")
    path = join(host, env.sglang_root, *spec.relpath.split("/"))
    if spec.creates and not host.exists(path):
        return spec, path, b""  # a file the fix creates: absent is its original state
    return spec, path, host.pin(path)


# --------------------------------------------------------------------------------- actions


def _base_report(fix: FixModule, env: Environment, spec: TargetSpec, path: str, data: bytes) -> Report:
    return Report(fix=fix.id, outcome=Checked(), env=env, target=spec.name, path=path,
                  sha256_before=sha256_bytes(data))


def plan(fix: FixModule, host: FixHost, req: FixRequest, env: Optional[Environment] = None) -> tuple[Report, Optional[bytes], object]:
    """Everything up to the patched bytes, without writing. Returns (report, patched, detection)."""
    env = env or probe_env(host, req)
    if fix.kind == "launch" and not req.launch_file:
        return describe_launch(fix, host, env, req), None, None
    spec, path, data = resolve_target(fix, host, env, req)
    rep = _base_report(fix, env, spec, path, data)
    if fix.kind == "launch":
        # a flag value picked from the trace is not recomputed on a file perfscope already edited
        folder = state_dir_for(host, req, fix, path)
        man = load_manifest(host, folder)
        if man and man.get("sha256_after") == rep.sha256_before:
            rep.manifest, rep.strategy, rep.variant = join(host, folder, "manifest.json"), man.get("strategy"), man.get("variant")
            rep.outcome = AlreadyApplied(f"{path} is as {fix.id} left it (applied {man.get('applied_at')}); "
                                         f"--revert restores the original")
            return rep, None, None
    det = fix.detect(spec, data, env)
    rep.variant = det.variant
    rep.anchors = det.anchors
    rep.notes.extend(det.facts.get("notes", []) if isinstance(det.facts, dict) else [])
    rep.notes.extend(env.notes)
    if det.state == "patched":
        rep.strategy = det.patched_strategy
        folder = state_dir_for(host, req, fix, path)
        man = load_manifest(host, folder)
        rep.manifest = join(host, folder, "manifest.json") if man else None
        if fix.kind == "launch" and not man:
            rep.outcome = AlreadyApplied(det.reason)
        elif man and man.get("sha256_after") == rep.sha256_before:
            rep.outcome = AlreadyApplied(f"{path} is already patched ({man.get('strategy')} strategy, "
                                         f"applied {man.get('applied_at')})")
            rep.strategy = man.get("strategy")
        elif man:
            rep.outcome = AlreadyApplied(f"{path} carries the patch but differs from what perfscope wrote "
                                         "(edited since?): --revert will refuse without --force")
        else:
            rep.outcome = AlreadyApplied(f"{path} carries the patch, but no manifest is in {folder}: perfscope "
                                         "cannot restore the original (reinstall sglang to undo)")
        if req.strategy not in ("auto", rep.strategy):
            rep.outcome = Refused(f"{path} is patched with the {rep.strategy} strategy; revert it first "
                                  f"(perfscope fix {fix.id} --revert) to switch to {req.strategy}")
        return rep, None, det
    if det.state in ("refused", "unknown"):
        rep.outcome = Refused(det.reason)
        return rep, None, det
    if det.state == "not-applicable":
        rep.outcome = Skipped(det.reason)
        return rep, None, det
    why = fix.applicable(env, spec)
    if why:
        rep.outcome = Skipped(why)
        return rep, None, det
    choice = fix.choose_strategy(spec, det, env, req.strategy)
    rep.rejected = choice.rejected
    rep.strategy_reason = choice.reason
    if choice.strategy is None:
        rep.outcome = Refused(choice.reason)
        return rep, None, det
    rep.strategy = choice.strategy
    if env.facts.get("applying"):
        why = fix.prepare(host, env, spec, path, det)
        if why:
            rep.outcome = Refused(why)
            return rep, None, det
    try:
        after, notes = fix.transform(spec, det, data, choice.strategy)
    except (ValueError, KeyError) as e:
        rep.outcome = Refused(f"unknown shape: {e}; refusing to patch by guess")
        return rep, None, det
    rep.notes.extend(notes)
    problems = fix.postconditions(spec, det, data, after, choice.strategy)
    if problems:
        rep.outcome = Failed("the patched file fails its post-conditions: " + "; ".join(problems))
        return rep, None, det
    rep.sha256_after = sha256_bytes(after)
    rep.diff = unified_diff(data, after, path)
    rep.outcome = Checked(f"{spec.name} {det.variant}: the {choice.strategy} patch applies cleanly (nothing "
                          f"changed; add --apply)")
    return rep, after, det


def _lock_path(host: FixHost, req: FixRequest) -> str:
    return join(host, state_root(host, req), ".lock")


def apply(fix: FixModule, host: FixHost, req: FixRequest, env: Optional[Environment] = None) -> Report:
    """Check, then patch with a backup and a manifest; one apply or revert at a time per host
    (a lock in the state folder), and a failed write leaves no manifest behind."""
    env = env or probe_env(host, req)
    with host.lock(_lock_path(host, req)):
        return _apply(fix, host, req, env)


def revert(fix: FixModule, host: FixHost, req: FixRequest, env: Optional[Environment] = None) -> Report:
    env = env or probe_env(host, req)
    with host.lock(_lock_path(host, req)):
        return _revert(fix, host, req, env)


def _sha_or_absent(host: FixHost, path: str, absent: bool) -> str:
    return sha256_bytes(b"") if absent and not host.exists(path) else host.sha256(path)


def _apply(fix: FixModule, host: FixHost, req: FixRequest, env: Environment) -> Report:
    env.facts["applying"] = True
    try:
        rep, after, _ = plan(fix, host, req, env)
    finally:
        env.facts.pop("applying", None)
    if after is None:
        return rep
    path = rep.path
    absent = rep.sha256_before == sha256_bytes(b"") and not host.exists(path)  # a file the fix creates
    if req.expect_sha256 and req.expect_sha256 != rep.sha256_before:
        rep.outcome = Refused(f"{path} changed since the check (sha256 {rep.sha256_before[:12]}…, expected "
                              f"{req.expect_sha256[:12]}…): check again")
        return rep
    m = host.mode(path)
    if m is not None and not m & 0o222:
        rep.outcome = Refused(f"{path} is read-only (mode {m:04o}): someone made it so on purpose; "
                              "chmod u+w it first if it should be patched")
        return rep
    folder = state_dir_for(host, req, fix, path)
    host.makedirs(folder)
    backup = join(host, folder, f"original-{rep.sha256_before}{_suffix(path)}")
    try:
        original = b"" if absent else host.read_bytes(path)
    except FixRefused as e:
        rep.outcome = Refused(str(e))
        return rep
    if sha256_bytes(original) != rep.sha256_before:
        rep.outcome = Refused(f"{path} changed since the check: nothing written; check again")
        return rep
    host.write_bytes_atomic(backup, original, mode=0o600)
    if host.sha256(backup) != rep.sha256_before:
        rep.outcome = Failed(f"backup {backup} does not read back intact: nothing patched")
        return rep
    manifest = {
        "fix": fix.id, "target": rep.target, "path": path, "variant": rep.variant, "strategy": rep.strategy,
        "sha256_before": rep.sha256_before, "sha256_after": rep.sha256_after, "size_before": len(original),
        "size_after": len(after), "backup": os.path.basename(backup), "host": host.label,
        "applied_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "perfscope": __version__,
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
        host.write_bytes_atomic(_created_pointer(host, req, fix, env.sglang_root),
                                (json.dumps({"path": path, "manifest": mpath}) + "\n").encode(), mode=0o600)
    try:
        # last look before writing: the file must still be the one the patch was computed from (the
        # pinned target: the file resolved at the check, refused if anything else is there now)
        if _sha_or_absent(host, path, absent) != rep.sha256_before:
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
    rep.outcome = Applied(f"patched {path} ({rep.target} {rep.variant}, {rep.strategy} strategy); "
                          f"backup and manifest in {folder}", details={"backup": backup})
    return rep


def _suffix(path: str) -> str:
    ext = os.path.splitext(path)[1]
    return ext if ext and len(ext) <= 10 and ext[1:].isalnum() else ".bak"


def describe_launch(fix: FixModule, host: FixHost, env: Environment, req: FixRequest) -> Report:
    """A launch-flag fix without --launch-file: the change, the server's command line; nothing written."""
    from perfscope.fixengine.launch import server_command_line

    rep = Report(fix=fix.id, outcome=Checked(), env=env, target="launch-command")
    rep.notes.extend(env.notes)
    cl = server_command_line(host, req.port) if req.port else None
    from perfscope.fixengine.flags import command_of

    from_cmd = not env.server_args and command_of(cl.argv if cl else None) is not None
    engine, d, current = fix.describe(env, cl.argv if cl else None)
    rep.extra["flag_changes"] = [c.describe() for c in d.changes]
    rep.extra["server_flags"] = {k: v for k, v in current.items()}
    rep.extra["server_command_line"] = cl.argv if cl and cl.argv else None
    rep.strategy, rep.strategy_reason = "flags", d.why
    if env.server_args:
        shown = ", ".join(f"{f.key}={env.server_args.get(f.key)!r}" for f in fix.flags.get(engine, ())
                          if f.key and f.key in env.server_args)
        if shown:
            rep.notes.append(f"/server_info reports {shown}")
    elif from_cmd:
        rep.notes.append("the server's /server_info was not read (give --url, or --host with --port): its flags "
                         f"are read from the command line of the process on port {req.port}")
    else:
        assumed = ", ".join(f"{k} {v}" if v is not True else k for k, v in getattr(fix, "assumed", {}).items())
        rep.notes.append("the server's /server_info was not read (give --url, or --host with --port): the change "
                         "is decided from the trace" + (f", assuming the launch command has {assumed} as the "
                                                        "finding implies" if assumed else ""))
    if cl and cl.argv:
        rep.notes.append(f"the server (pid {cl.pid}, port {req.port}) was started as: {cl.text()}")
    rep.notes.extend(f"predicted step after the fix: {d.predicted_step_ms:.2f} ms" + (f" ({d.prediction})" if d.prediction else "")
                     for _ in [0] if d.predicted_step_ms is not None)
    if d.refused:
        rep.outcome = Refused(d.refused)
    elif d.skipped:
        rep.outcome = Skipped(d.skipped)
    elif not d.changes:
        rep.outcome = AlreadyApplied(f"the server already runs with what {fix.id} sets ({d.why or 'flags right'})")
    else:
        rep.diff = "".join(f"  {c.describe()}{(': ' + c.why) if c.why else ''}\n" for c in d.changes)
        rep.outcome = Checked("no --launch-file: the change is " + "; ".join(c.describe() for c in d.changes)
                              + " on the server's launch command; nothing changed (give --launch-file F to "
                              "edit it, --apply --restart-cmd CMD to apply and re-measure)")
    return rep


def _revert(fix: FixModule, host: FixHost, req: FixRequest, env: Environment) -> Report:
    spec, path, data = resolve_target(fix, host, env, req, reverting=True)
    rep = _base_report(fix, env, spec, path, data)
    folder = state_dir_for(host, req, fix, path)
    man = load_manifest(host, folder)
    cur = rep.sha256_before
    if man is None:
        if fix.marker and fix.marker.encode() in data:
            rep.outcome = Refused(f"{path} is patched but {folder} has no manifest, so the original cannot be "
                                  "restored byte for byte (reinstall sglang, or pass the --state-dir used at apply)")
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
        _retire_manifest(host, folder)
        return rep
    if cur != man["sha256_after"] and not req.force:
        other = _fix_on_top(host, req, fix, path, cur, man["sha256_after"])
        if other:
            rep.outcome = Refused(f"{path} was patched again by perfscope fix {other[0]} after {fix.id} (its manifest "
                                  f"{other[1]} has this file's state): revert {other[0]} first, then {fix.id}")
            return rep
        rep.outcome = Refused(f"{path} is neither the patched file nor the original (sha256 {cur[:12]}…): it was "
                              "changed after the patch (sglang reinstalled or edited?); --force restores the "
                              "original anyway")
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
        _retire_manifest(host, folder)
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
    _retire_manifest(host, folder)
    rep.outcome = Reverted(f"restored {path} byte for byte (sha256 {man['sha256_before'][:12]}…)")
    return rep


def _retire_manifest(host: FixHost, folder: str) -> None:
    src = join(host, folder, "manifest.json")
    data = host.read_bytes(src)
    host.write_bytes_atomic(join(host, folder, f"manifest-reverted-{int(time.time())}.json"), data, mode=0o600)
    host.run(["rm", "-f", src])
