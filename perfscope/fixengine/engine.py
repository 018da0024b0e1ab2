"""Check, apply and revert a fix on a host, safely: the engine's public names, one job a module.

* check (``check.py``): find the target (``kinds/``: a source file, a launch command), detect its
  variant, choose the strategy, compute the patch and its unified diff; nothing is written;
* apply (``patch.py``): the checked patch, with a byte-exact backup and a manifest (sha256 before /
  after) in the state folder on the host (``state.py``); refused if the file changed since the
  check; written atomically and read back. Applying twice is ``AlreadyApplied``;
* revert (``restore.py``): verify the backup's sha256 against the manifest, refuse if the current
  file is neither the patched nor the original one (unless ``force``), restore byte for byte.

What the host runs is read by ``environment.py``; the request and the report are ``request.py``'s.
"""

from __future__ import annotations

from perfscope.fixengine.check import Planned, base_report, check, plan, resolve_target
from perfscope.fixengine.environment import probe_env
from perfscope.fixengine.kinds.launch import describe_launch
from perfscope.fixengine.patch import apply
from perfscope.fixengine.request import FixRequest, Report
from perfscope.fixengine.restore import revert
from perfscope.fixengine.state import load_manifest, state_dir_for, state_root

__all__ = [
    "FixRequest",
    "Planned",
    "Report",
    "apply",
    "base_report",
    "check",
    "describe_launch",
    "load_manifest",
    "plan",
    "probe_env",
    "resolve_target",
    "revert",
    "state_dir_for",
    "state_root",
]
