"""The fix engine: fix modules in ``fixes/<id>/``, checked and applied safely (see engine.py)."""

from perfscope.fixengine.engine import FixRequest, Report, apply, plan, probe_env, revert
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
)
from perfscope.fixengine.registry import discover, get

__all__ = [
    "FixRequest",
    "Report",
    "apply",
    "plan",
    "probe_env",
    "revert",
    "discover",
    "get",
    "Environment",
    "FixModule",
    "Outcome",
    "Applied",
    "AlreadyApplied",
    "Checked",
    "Skipped",
    "Refused",
    "Failed",
    "Reverted",
]
