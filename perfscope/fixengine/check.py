"""The check: find the target, detect its variant, choose the strategy, compute the patch and its
unified diff; nothing is written. Its result (:class:`Planned`) is what an apply writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from perfscope.fixengine.edit import unified_diff
from perfscope.fixengine.environment import probe_env
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.kinds import kind_of
from perfscope.fixengine.model import (
    AlreadyApplied,
    Checked,
    Detection,
    Environment,
    Failed,
    FixModule,
    Refused,
    Skipped,
    TargetSpec,
)
from perfscope.fixengine.request import FixRequest, Report
from perfscope.fixengine.state import load_manifest, state_dir_for
from perfscope.util.files import sha256_bytes


@dataclass
class Planned:
    """A check's result: its report and, when the patch applies, the bytes an apply writes."""

    report: Report
    after: Optional[bytes] = None  # the patched file; None: nothing to write (the report says why)
    detection: Optional[Detection] = None
    spec: Optional[TargetSpec] = None
    data: bytes = b""  # the target's bytes the patch was computed from
    strategy: Optional[str] = None
    prepared: bool = False  # the fix's apply-time work (FixModule.prepare) is in ``after``
    notes_before_transform: int = 0


def resolve_target(
    fix: FixModule, host: FixHost, env: Environment, req: FixRequest, reverting: bool = False
) -> tuple[TargetSpec, str, bytes]:
    """The fix's target file: its spec, its path on the host and its (pinned) bytes."""
    gather = getattr(fix, "gather", None)
    if gather is not None:
        gather(host, env)  # facts the fix reads on the host before it knows its target
    return kind_of(fix).resolve_target(fix, host, env, req, reverting)


def base_report(fix: FixModule, env: Environment, spec: TargetSpec, path: str, data: bytes) -> Report:
    return Report(fix=fix.id, outcome=Checked(), env=env, target=spec.name, path=path, sha256_before=sha256_bytes(data))


def has_prepare(fix: FixModule) -> bool:
    """Whether the fix does work of its own at apply time (its patch is computed again then)."""
    return getattr(fix.prepare, "__func__", None) is not FixModule.prepare


def plan(
    fix: FixModule, host: FixHost, req: FixRequest, env: Optional[Environment] = None
) -> tuple[Report, Optional[bytes], Optional[Detection]]:
    """Everything up to the patched bytes, without writing. Returns (report, patched, detection)."""
    p = check(fix, host, req, env)
    return p.report, p.after, p.detection


def check(
    fix: FixModule, host: FixHost, req: FixRequest, env: Optional[Environment] = None, *, applying: bool = False
) -> Planned:
    """The check, as :func:`plan`; ``applying``: the fix's apply-time work runs too (its ``prepare``)."""
    env = env or probe_env(host, req)
    kind = kind_of(fix)
    described = kind.describe(fix, host, env, req)
    if described is not None:
        return Planned(described)
    spec, path, data = resolve_target(fix, host, env, req)
    rep = base_report(fix, env, spec, path, data)
    if kind.as_left(fix, host, req, rep):
        return Planned(rep, spec=spec, data=data)
    det = fix.detect(spec, data, env)
    planned = Planned(rep, detection=det, spec=spec, data=data)
    rep.variant = det.variant
    rep.anchors = det.anchors
    rep.notes.extend(det.facts.get("notes", []) if isinstance(det.facts, dict) else [])
    rep.notes.extend(env.notes)
    if det.state == "patched":
        rep.strategy = det.patched_strategy
        folder = state_dir_for(host, req, fix, path)
        man = load_manifest(host, folder)
        rep.manifest = join(host, folder, "manifest.json") if man else None
        if not man:
            rep.outcome = kind.patched_without_manifest(fix, det, path, folder)
        elif man.get("sha256_after") == rep.sha256_before:
            rep.outcome = AlreadyApplied(
                f"{path} is already patched ({man.get('strategy')} strategy, applied {man.get('applied_at')})"
            )
            rep.strategy = man.get("strategy")
        else:
            rep.outcome = AlreadyApplied(
                f"{path} carries the patch but differs from what perfscope wrote "
                "(edited since?): --revert will refuse without --force"
            )
        if req.strategy not in ("auto", rep.strategy):
            rep.outcome = Refused(
                f"{path} is patched with the {rep.strategy} strategy; revert it first "
                f"(perfscope fix {fix.id} --revert) to switch to {req.strategy}"
            )
        return planned
    if det.state in ("refused", "unknown"):
        rep.outcome = Refused(det.reason)
        return planned
    if det.state == "not-applicable":
        rep.outcome = Skipped(det.reason)
        return planned
    why = fix.applicable(env, spec)
    if why:
        rep.outcome = Skipped(why)
        return planned
    choice = fix.choose_strategy(spec, det, env, req.strategy)
    rep.rejected = choice.rejected
    rep.strategy_reason = choice.reason
    if choice.strategy is None:
        rep.outcome = Refused(choice.reason)
        return planned
    rep.strategy = planned.strategy = choice.strategy
    planned.notes_before_transform = len(rep.notes)
    return patch_bytes(fix, host, env, planned, applying)


def patch_bytes(fix: FixModule, host: FixHost, env: Environment, planned: Planned, applying: bool) -> Planned:
    """The planned patch's bytes: the fix's apply-time work when ``applying``, its transform, its
    post-conditions and the diff (again, for a plan whose fix does work at apply time)."""
    rep, det, spec, strategy = planned.report, planned.detection, planned.spec, planned.strategy
    assert det is not None and spec is not None and strategy is not None and rep.path is not None
    del rep.notes[planned.notes_before_transform :]
    planned.after, planned.prepared = None, applying or not has_prepare(fix)
    if applying:
        why = fix.prepare(host, env, spec, rep.path, det)
        if why:
            rep.outcome = Refused(why)
            return planned
    try:
        after, notes = fix.transform(spec, det, planned.data, strategy)
    except (ValueError, KeyError) as e:
        rep.outcome = Refused(f"unknown shape: {e}; refusing to patch by guess")
        return planned
    rep.notes.extend(notes)
    problems = fix.postconditions(spec, det, planned.data, after, strategy)
    if problems:
        rep.outcome = Failed("the patched file fails its post-conditions: " + "; ".join(problems))
        return planned
    rep.sha256_after = sha256_bytes(after)
    rep.diff = unified_diff(planned.data, after, rep.path)
    rep.outcome = Checked(
        f"{spec.name} {det.variant}: the {strategy} patch applies cleanly (nothing changed; add --apply)"
    )
    planned.after = after
    return planned
