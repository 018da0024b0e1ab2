"""What the engine asks of a kind of fix: where its target is, what it tells without one, how it reads
a file already changed, and which options name it. The engine's check, apply and revert are the same
for every kind (backup, manifest, atomic write, byte-exact revert); a kind is one adapter of this
class, registered in ``KINDS`` (``kinds/__init__.py``)."""

from __future__ import annotations

from typing import Optional

from perfscope.fixengine.host import FixHost
from perfscope.fixengine.model import Detection, Environment, FixModule, Outcome, TargetSpec
from perfscope.fixengine.request import FixRequest, Report


class FixKind:
    name: str = ""  # FixModule.kind of the fixes it serves
    target_option: str = ""  # the option that names the target file by path
    changes: str = ""  # what a fix of this kind changes on the server, in a sentence ("code", "flags")
    needs_server_code: bool = True  # whether the check reads the server's interpreter and sglang install

    def check_request(self, fix: FixModule, req: FixRequest, action: Optional[str]) -> None:
        """Raise InputError for options this kind cannot use (``action``: "--apply", "--revert" or None)."""

    def describe(self, fix: FixModule, host: FixHost, env: Environment, req: FixRequest) -> Optional[Report]:
        """A check's report when the request names no target this kind can edit; None: resolve one."""
        return None

    def resolve_target(
        self, fix: FixModule, host: FixHost, env: Environment, req: FixRequest, reverting: bool = False
    ) -> tuple[TargetSpec, str, bytes]:  # pragma: no cover
        """The target, its path on the host and its bytes (pinned: what is checked is what is written)."""
        raise NotImplementedError

    def as_left(self, fix: FixModule, host: FixHost, req: FixRequest, rep: Report) -> bool:
        """Before detection: whether the file is as this fix left it (``rep.outcome`` then says so)."""
        return False

    def patched_without_manifest(self, fix: FixModule, det: Detection, path: str, folder: str) -> Outcome:
        """How a target that carries the change, with no manifest of perfscope's, ends a check."""
        raise NotImplementedError  # pragma: no cover
