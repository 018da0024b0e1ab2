"""What a fix action is asked to do (:class:`FixRequest`) and what it reports (:class:`Report`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from perfscope.fixengine.model import Environment, Outcome


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
            "fix": self.fix,
            **self.outcome.to_dict(),
            "target": self.target,
            "path": self.path,
            "variant": self.variant,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "rejected_strategies": self.rejected,
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
            "anchors": self.anchors,
            "notes": self.notes,
            "manifest": self.manifest,
            "diff": self.diff,
            "environment": self.env.to_dict() if self.env else None,
            **self.extra,
        }
