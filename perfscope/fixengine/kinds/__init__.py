"""Fix kinds: one adapter per ``FixModule.kind`` (``kinds/base.py`` says what an adapter answers).
A new kind is one module here and its line in ``KINDS``."""

from __future__ import annotations

from perfscope.errors import InputError
from perfscope.fixengine.kinds.base import FixKind
from perfscope.fixengine.kinds.launch import LaunchKind
from perfscope.fixengine.kinds.source import SourceKind
from perfscope.fixengine.model import FixModule

KINDS: dict[str, FixKind] = {k.name: k for k in (SourceKind(), LaunchKind())}


def kind_of(fix: FixModule) -> FixKind:
    """The adapter of ``fix``'s kind."""
    kind = KINDS.get(fix.kind)
    if kind is None:
        raise InputError(f"fix {fix.id}: unknown kind {fix.kind!r} (known: {', '.join(sorted(KINDS))})")
    return kind


__all__ = ["KINDS", "FixKind", "kind_of"]
