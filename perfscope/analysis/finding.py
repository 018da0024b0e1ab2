"""What a rule reports (:class:`Finding`) and the command that fixes it (:class:`FixCommand`): typed
from the rule to the renderers, turned into JSON only by ``to_dict`` (``--json``, a run folder's
``ranks.json.gz``, the results of Ray and on-host workers) and back by ``from_dict``."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

# the port perfscope fix assumes when none is given (SGLang's default)
DEFAULT_PORT = 30000
# what a command aimed at no host needs to reach the server: one line of a terminal panel
WHERE_SHORT = "no host recorded: add --host HOST, or run it on the server's machine"


def where_hint(run: dict) -> Optional[str]:
    """What the fix command needs to reach the server when the run does not say where it runs
    (None: the run recorded its host)."""
    if run.get("host"):
        return None
    if run.get("url"):
        return (
            f"the trace was taken through {run['url']}: run the command on that server's machine, or add "
            "--host HOST to reach it over SSH"
        )
    return (
        "this trace does not say where its server runs: run the command on the server's machine, or add "
        "--host HOST (its SSH name; --port PORT when not 30000) to reach it over SSH"
    )


@dataclass(frozen=True)
class FixCommand:
    """``perfscope fix ID``, aimed at the server the trace came from when its run folder says (``host``
    as ``perfscope trace`` recorded it; ``port`` when not SGLang's 30000), reading the trace it was
    diagnosed from (``trace``) when there was one input. ``where``: what to add, or where to run it,
    when the run recorded no host."""

    fix: str
    host: Optional[str] = None
    port: Optional[int] = None
    trace: Optional[str] = None
    where: Optional[str] = None

    @classmethod
    def for_run(cls, fix: str, run: dict, trace: Optional[str] = None) -> "FixCommand":
        """The command for a run folder's ``run.json`` (empty for a bare trace) and the one input."""
        host = run.get("host")
        port = (run.get("server_info") or {}).get("port")
        ok_port = isinstance(port, int) and not isinstance(port, bool) and port != DEFAULT_PORT
        return cls(
            fix, host=str(host) if host else None, port=port if ok_port else None, trace=trace, where=where_hint(run)
        )

    @property
    def check(self) -> str:
        """The check (shows the diff, changes nothing), one shell line."""
        cmd = f"perfscope fix {self.fix}"
        if self.host:
            cmd += f" --host {shlex.quote(self.host)}"
            if self.port is not None:
                cmd += f" --port {self.port}"
        if self.trace:
            cmd += f" --trace {shlex.quote(self.trace)}"
        return cmd

    @property
    def apply(self) -> str:
        return self.check + " --apply"

    @property
    def where_short(self) -> Optional[str]:
        return None if self.host else WHERE_SHORT

    @classmethod
    def parse(cls, line: str, where: Optional[str]) -> "FixCommand":
        """The command back from its :attr:`check` line (``--json``'s ``fix_command``)."""
        words = shlex.split(line)
        opts = dict(zip(words[3::2], words[4::2]))
        port = opts.get("--port")
        return cls(
            words[2], host=opts.get("--host"), port=int(port) if port else None, trace=opts.get("--trace"), where=where
        )


# the fields of a finding that describe how the step model replays its fix and how its summary reads
# once predicted: kept in the analysis, never serialised
_NOT_SERIALISED = ("new_duration", "added_us_per_step", "assumes", "alternatives", "summary_at", "command")


@dataclass
class Finding:
    id: str
    title: str
    summary: str  # one sentence a user can act on
    ms_per_step: float
    share: float  # kernel time: of the analysed steps' kernel time; idle time: of the step (cycle); <= 1
    confidence: str
    fix: Optional[str] = None  # id of the fix module that addresses it
    remedy: str = ""  # what to do when there is no fix module (or in addition)
    predicted_step_ms_after_fix: Optional[float] = None
    evidence: dict[str, Any] = field(default_factory=dict)
    share_of: str = "kernel time"  # what ``share`` is a share of: "kernel time", "the step", "the step cycle"
    # what the fix does to the kernels, for the step model (perfscope.analysis.stepmodel): the new
    # duration in µs of kernel i (None: unchanged), and GPU time the fix adds per step. Not serialised.
    new_duration: Optional[Callable[[int], Optional[float]]] = field(default=None, repr=False, compare=False)
    added_us_per_step: float = field(default=0.0, repr=False, compare=False)
    # what the prediction assumes of the kernels it does not change (said in --json and the summary),
    # and other outcomes of the fix the step model also replays: {name: (new_duration, added µs, why)}.
    # The prediction's range spans them. Not serialised (the results are, in evidence["prediction"]).
    assumes: str = field(default="", repr=False, compare=False)
    alternatives: dict = field(default_factory=dict, repr=False, compare=False)
    # the summary of a rule that states the predicted step in it, for a predicted step (ms): the step
    # model's prediction replaces the rule's own, and the summary is written once, with it
    summary_at: Optional[Callable[[float], str]] = field(default=None, repr=False, compare=False)
    # the fix command aimed at the run and its one input (Diagnosis.aim); None: not aimed yet
    command: Optional[FixCommand] = field(default=None, repr=False, compare=False)

    @property
    def fix_command(self) -> Optional[FixCommand]:
        """The command that fixes it: aimed (:meth:`perfscope.analysis.result.Diagnosis.aim`), else the bare one."""
        if not self.fix:
            return None
        return self.command or FixCommand(self.fix)

    def predicted_range(self) -> Optional[tuple[float, float]]:
        """The predicted step after the fix as (low, high) ms: the step model's range (its measured
        uncertainty: the host's unprofiled time and the GPU work's error, perfscope.analysis.hosttime),
        or a point (low == high) where the prediction has none. None: no prediction."""
        pred = self.predicted_step_ms_after_fix
        if not isinstance(pred, (int, float)) or pred <= 0:
            return None
        model = (self.evidence or {}).get("prediction") or {}
        rng = model.get("range_ms")
        if (
            isinstance(rng, (list, tuple))
            and len(rng) == 2
            and all(isinstance(x, (int, float)) for x in rng)
            and rng[0] <= pred <= rng[1]
            and rng[0] < rng[1]
        ):
            return float(rng[0]), float(rng[1])
        return float(pred), float(pred)

    def settled(self) -> "Finding":
        """The finding as the analysis hands it on: without the step model's callables (they hold the trace)."""
        return Finding(
            **{
                f.name: getattr(self, f.name)
                for f in fields(self)
                if f.name not in ("new_duration", "alternatives", "summary_at")
            }
        )

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_SERIALISED}
        fc = self.fix_command
        d["fix_command"] = fc.check if fc else None
        if fc is not None and self.command is not None:  # aimed: what it reads and where it runs
            if fc.trace:
                d["fix_trace"] = fc.trace
            d["fix_where"] = fc.where
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        names = {f.name for f in fields(cls)} - set(_NOT_SERIALISED)
        f = cls(**{k: v for k, v in d.items() if k in names})
        if f.fix and d.get("fix_command") and "fix_where" in d:
            f.command = FixCommand.parse(d["fix_command"], d["fix_where"])
        return f
