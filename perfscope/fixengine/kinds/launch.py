"""Launch-flag fixes (``fixengine/flags.py``): edit the server's launch command in ``--launch-file``
(a shell script, a systemd unit, a compose file); without one, say the change and the command line
the server was started with, and write nothing."""

from __future__ import annotations

from typing import Optional

from perfscope.errors import InputError
from perfscope.fixengine.flags import LaunchFlagFix, command_of
from perfscope.fixengine.host import FixHost, join
from perfscope.fixengine.kinds.base import FixKind
from perfscope.fixengine.launch import server_command_line
from perfscope.fixengine.model import (
    AlreadyApplied,
    Checked,
    Detection,
    Environment,
    FixModule,
    Outcome,
    Refused,
    Skipped,
    TargetSpec,
)
from perfscope.fixengine.request import FixRequest, Report
from perfscope.fixengine.state import load_manifest, state_dir_for


def _launch_fix(fix: FixModule) -> LaunchFlagFix:
    if not isinstance(fix, LaunchFlagFix):
        raise TypeError(f"{fix.id}: kind 'launch' is for LaunchFlagFix subclasses")
    return fix


class LaunchKind(FixKind):
    name = "launch"
    target_option = "--launch-file"
    changes = "flags"
    needs_server_code = False  # the server's python and sglang install are not needed

    def check_request(self, fix: FixModule, req: FixRequest, action: Optional[str]) -> None:
        if req.target_file or req.sglang_root:
            raise InputError(f"{fix.id} edits the launch command, not a source file: give --launch-file F")
        if action and not req.launch_file:
            raise InputError(
                f"{action} of {fix.id} needs --launch-file F (the server's launch script, systemd unit "
                "or compose file); without it the change is only printed"
            )

    def describe(self, fix: FixModule, host: FixHost, env: Environment, req: FixRequest) -> Optional[Report]:
        return None if req.launch_file else describe_launch(fix, host, env, req)

    def resolve_target(
        self, fix: FixModule, host: FixHost, env: Environment, req: FixRequest, reverting: bool = False
    ) -> tuple[TargetSpec, str, bytes]:
        if not req.launch_file:
            raise InputError(f"{fix.id} edits the server's launch command: give --launch-file F")
        env.facts["launch_file"] = req.launch_file
        return fix.target_for(env, req.target), req.launch_file, host.pin(req.launch_file)

    def as_left(self, fix: FixModule, host: FixHost, req: FixRequest, rep: Report) -> bool:
        # a flag value picked from the trace is not recomputed on a file perfscope already edited
        path = rep.path or ""
        folder = state_dir_for(host, req, fix, path)
        man = load_manifest(host, folder)
        if not (man and man.get("sha256_after") == rep.sha256_before):
            return False
        rep.manifest, rep.strategy, rep.variant = (
            join(host, folder, "manifest.json"),
            man.get("strategy"),
            man.get("variant"),
        )
        rep.outcome = AlreadyApplied(
            f"{path} is as {fix.id} left it (applied {man.get('applied_at')}); --revert restores the original"
        )
        return True

    def patched_without_manifest(self, fix: FixModule, det: Detection, path: str, folder: str) -> Outcome:
        return AlreadyApplied(det.reason)


def describe_launch(fix: FixModule, host: FixHost, env: Environment, req: FixRequest) -> Report:
    """A launch-flag fix without --launch-file: the change, the server's command line; nothing written."""

    rep = Report(fix=fix.id, outcome=Checked(), env=env, target="launch-command")
    rep.notes.extend(env.notes)
    cl = server_command_line(host, req.port) if req.port else None
    lfix = _launch_fix(fix)
    from_cmd = not env.server_args and command_of(cl.argv if cl else None) is not None
    engine, d, current = lfix.describe(env, cl.argv if cl else None)
    rep.extra["flag_changes"] = [c.describe() for c in d.changes]
    rep.extra["server_flags"] = {k: v for k, v in current.items()}
    rep.extra["server_command_line"] = cl.argv if cl and cl.argv else None
    rep.strategy, rep.strategy_reason = "flags", d.why
    if env.server_args:
        shown = ", ".join(
            f"{f.key}={env.server_args.get(f.key)!r}"
            for f in lfix.flags.get(engine, ())
            if f.key and f.key in env.server_args
        )
        if shown:
            rep.notes.append(f"/server_info reports {shown}")
    elif from_cmd:
        rep.notes.append(
            "the server's /server_info was not read (give --url, or --host with --port): its flags "
            f"are read from the command line of the process on port {req.port}"
        )
    else:
        assumed = ", ".join(f"{k} {v}" if v is not True else k for k, v in lfix.assumed.items())
        rep.notes.append(
            "the server's /server_info was not read (give --url, or --host with --port): the change "
            "is decided from the trace"
            + (f", assuming the launch command has {assumed} as the finding implies" if assumed else "")
        )
    if cl and cl.argv:
        rep.notes.append(f"the server (pid {cl.pid}, port {req.port}) was started as: {cl.text()}")
    rep.notes.extend(
        f"predicted step after the fix: {d.predicted_step_ms:.2f} ms" + (f" ({d.prediction})" if d.prediction else "")
        for _ in [0]
        if d.predicted_step_ms is not None
    )
    if d.refused:
        rep.outcome = Refused(d.refused)
    elif d.skipped:
        rep.outcome = Skipped(d.skipped)
    elif not d.changes:
        rep.outcome = AlreadyApplied(f"the server already runs with what {fix.id} sets ({d.why or 'flags right'})")
    else:
        rep.diff = "".join(f"  {c.describe()}{(': ' + c.why) if c.why else ''}\n" for c in d.changes)
        rep.outcome = Checked(
            "no --launch-file: the change is "
            + "; ".join(c.describe() for c in d.changes)
            + " on the server's launch command; nothing changed (give --launch-file F to "
            "edit it, --apply --restart-cmd CMD to apply and re-measure)"
        )
    return rep
