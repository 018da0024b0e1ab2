"""Launch-flag fixes: a fix whose change is a server flag on the launch command (``--launch-file``).

A :class:`LaunchFlagFix` declares, per engine, the flags it edits (:class:`Flag`: the flag, the
``/server_info`` key SGLang reports it under, whether it takes a value) and decides the change in
:meth:`LaunchFlagFix.changes` from what it knows: the launch command's current flags, the server's
``/server_info`` (``env.server_args``), the GPU, and the trace (``env.facts``, from ``--trace``).
The engine (engine.py; kinds/launch.py is this kind's adapter) does the rest exactly as for a source
patch: the launch file is the target, the edit is computed from its tokens (launch/), diffed, backed
up, written atomically, reverted byte for byte; ``--restart-cmd`` restarts, re-measures and reverts when unhealthy or slower.

Without ``--launch-file`` nothing is written: the check prints the change and the command line the
server was started with (the process on ``--port``, and the flags ``/server_info`` reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from perfscope.fixengine.launch import (
    LaunchCommand,
    LaunchParseError,
    edit_flags,
    expected_argv,
    find_command,
    flag_value,
)
from perfscope.fixengine.model import Detection, Environment, FixModule, StrategyChoice, TargetSpec

LAUNCH_TARGET = TargetSpec(
    "launch-command",
    None,
    "the server's launch command (--launch-file)",
    ("flags",),
    description="a shell script, a systemd unit's ExecStart= or a compose command:",
)


@dataclass(frozen=True)
class Flag:
    flag: str  # "--disable-cuda-graph"
    key: Optional[str]  # its /server_info key ("disable_cuda_graph"), None if the server does not report it
    takes_value: bool = False


@dataclass
class Decision:
    """What a fix wants on a server: the changes (empty: the flags are already right), or why not."""

    changes: list
    why: str = ""  # the value picked and why (printed as the strategy reason)
    refused: Optional[str] = None  # a fact that must hold does not: refuse (exit 4)
    skipped: Optional[str] = None  # nothing to do here (e.g. a single GPU for an all-reduce fix)
    predicted_step_ms: Optional[float] = None
    prediction: str = ""


class LaunchFlagFix(FixModule):
    kind = "launch"
    strategies = ("flags",)
    targets = (LAUNCH_TARGET,)
    engines: tuple[str, ...] = ("sglang",)
    flags: dict = {}  # engine -> tuple[Flag, ...]: every flag this fix reads or edits
    required_keys: tuple[str, ...] = ()  # /server_info keys the server's version must report (SGLang)
    # the flags as the finding implies them, assumed when neither a launch file nor /server_info says
    assumed: dict = {}

    # ---- what subclasses write
    def decide(self, engine: str, current: dict, env: Environment) -> Decision:  # pragma: no cover
        """``current``: flag -> value (None absent, True a present boolean flag, str a value)."""
        raise NotImplementedError

    # ---- facts
    def check_version(self, engine: str, env: Environment) -> Optional[str]:
        """A refusal when the server's /server_info lacks a key this fix's flags need."""
        if engine != "sglang" or not env.server_args:
            return None
        missing = [k for k in self.required_keys if k not in env.server_args]
        if missing:
            ver = env.sglang_version or env.server_args.get("version") or "?"
            return (
                f"the server (sglang {ver}) does not report {', '.join(missing)} in /server_info: this "
                f"version has no such flag; nothing changed"
            )
        return None

    @staticmethod
    def finding(env: Environment, fid: str) -> dict:
        for f in (env.facts or {}).get("findings") or []:
            if f.get("id") == fid:
                return f
        return {}

    def current_from_command(self, engine: str, cmd: LaunchCommand) -> dict:
        return {f.flag: flag_value(cmd, f.flag, f.takes_value) for f in self.flags.get(engine, ())}

    def current_from_server(self, engine: str, env: Environment) -> dict:
        """The flags as /server_info reports them (the running server's state)."""
        out: dict = {}
        for f in self.flags.get(engine, ()):
            if not f.key or f.key not in env.server_args:
                out[f.flag] = None
                continue
            v = env.server_args[f.key]
            if f.takes_value:
                out[f.flag] = None if v is None else str(v)
            else:
                out[f.flag] = True if v is True else None
        return out

    # ---- engine hooks
    def target_for(self, env: Environment, name: Optional[str]) -> TargetSpec:
        if name not in (None, LAUNCH_TARGET.name):
            raise KeyError(name)
        return LAUNCH_TARGET

    def detect(self, target: TargetSpec, data: bytes, env: Environment) -> Detection:
        path = env.facts.get("launch_file", "the launch file") if env.facts else "the launch file"
        try:
            cmd = find_command(path, data)
        except LaunchParseError as e:
            return Detection(target.name, None, "refused", f"cannot read the launch command exactly: {e}")
        anchors = [{"what": f"{cmd.kind} launch command ({cmd.engine})", "line": cmd.line}]
        if cmd.engine not in self.engines:
            return Detection(
                target.name,
                cmd.kind,
                "refused",
                f"{self.id} knows the flags of {', '.join(self.engines)}, not {cmd.engine} "
                f"(launch command at line {cmd.line})",
                anchors=anchors,
            )
        why = self.check_version(cmd.engine, env)
        if why:
            return Detection(target.name, cmd.kind, "refused", why, anchors=anchors)
        try:
            current = self.current_from_command(cmd.engine, cmd)
        except LaunchParseError as e:
            return Detection(target.name, cmd.kind, "refused", str(e), anchors=anchors)
        d = self.decide(cmd.engine, current, env)
        facts = {"cmd": cmd, "decision": d, "current": current, "notes": _prediction_notes(d)}
        if d.refused:
            return Detection(target.name, cmd.kind, "refused", d.refused, anchors=anchors, facts=facts)
        if d.skipped:
            return Detection(target.name, cmd.kind, "not-applicable", d.skipped, anchors=anchors, facts=facts)
        if not d.changes:
            return Detection(
                target.name,
                cmd.kind,
                "patched",
                f"the launch command already runs with what {self.id} sets ({d.why or 'flags already right'})",
                patched_strategy="flags",
                anchors=anchors,
                facts=facts,
            )
        return Detection(target.name, cmd.kind, "original", anchors=anchors, facts=facts)

    def choose_strategy(
        self, target: TargetSpec, det: Detection, env: Environment, requested: str = "auto"
    ) -> StrategyChoice:
        if requested not in ("auto", "flags"):
            return StrategyChoice(None, f"{self.id} has one strategy, flags (not {requested})")
        d: Decision = det.facts["decision"]
        return StrategyChoice("flags", d.why)

    def transform(self, target: TargetSpec, det: Detection, data: bytes, strategy: str) -> tuple[bytes, list]:
        cmd: LaunchCommand = det.facts["cmd"]
        d: Decision = det.facts["decision"]
        try:
            after, notes = edit_flags(data, cmd, d.changes)
        except LaunchParseError as e:
            raise ValueError(str(e)) from None
        return after, notes

    def postconditions(
        self, target: TargetSpec, det: Detection, before: bytes, after: bytes, strategy: str
    ) -> list[str]:
        cmd: LaunchCommand = det.facts["cmd"]
        d: Decision = det.facts["decision"]
        try:
            new = find_command(det.facts.get("path", "launch file"), after)
        except LaunchParseError as e:
            return [f"the edited launch file does not read back: {e}"]
        want = expected_argv(cmd, d.changes)
        if new.argv != want:
            return [f"the edited command reads back as {new.text()!r}, expected {' '.join(want)!r}"]
        if new.kind != cmd.kind:
            return [f"the edited file reads as a {new.kind} command, was {cmd.kind}"]
        return []

    # ---- without a launch file
    def describe(self, env: Environment, argv: Optional[list] = None) -> tuple[str, Decision, dict]:
        """(engine, decision, current) without a launch file: from /server_info; else from ``argv``,
        the command line of the process serving the port; else the flags the finding implies."""
        engine = _engine_of(env)
        cmd = None if env.server_args else command_of(argv)
        if env.server_args:
            current = self.current_from_server(engine, env)
        elif cmd is not None and cmd.engine in self.engines:
            engine = cmd.engine
            current = self.current_from_command(engine, cmd)
        else:
            current = {f.flag: self.assumed.get(f.flag) for f in self.flags.get(engine, ())}
        why = self.check_version(engine, env)
        if why:
            return engine, Decision([], refused=why), current
        return engine, self.decide(engine, current, env), current

    def summary(self) -> dict:
        s = super().summary()
        s["kind"] = "launch"
        s["flags"] = {e: [f.flag for f in fl] for e, fl in self.flags.items()}
        s["required_server_info_keys"] = list(self.required_keys)
        return s


def command_of(argv: Optional[list]) -> Optional[LaunchCommand]:
    """A running server's command line (its /proc argv) read as a launch command; None if it is not
    one perfscope reads exactly."""
    if not argv:
        return None
    import shlex

    try:
        return find_command("the server's command line", (" ".join(shlex.quote(a) for a in argv) + "\n").encode())
    except LaunchParseError:
        return None


def _engine_of(env: Environment) -> str:
    a = env.server_args or {}
    if a.get("engine") == "perfscope-repro":
        return "repro"
    if a.get("vllm_version") or (env.facts or {}).get("engine") == "vllm":
        return "vllm"
    return "sglang"


def _prediction_notes(d: Decision) -> list[str]:
    if d.predicted_step_ms is None:
        return []
    return [
        f"predicted step after the fix: {d.predicted_step_ms:.2f} ms" + (f" ({d.prediction})" if d.prediction else "")
    ]


def is_amd_gpu(gpu_name: Optional[str]) -> bool:
    """The server's GPU name (``Environment.gpu_name``) is an AMD one; unknown names are not."""
    gpu = (gpu_name or "").lower()
    return bool(gpu) and any(w in gpu for w in ("amd", "instinct", "mi300", "mi250"))


def as_value(v) -> Optional[int]:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return None
