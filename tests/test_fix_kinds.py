"""Fix kinds are adapters (perfscope/fixengine/kinds/): every fix module's kind has one, and a kind
the registry does not know is one line of error, not a fall-through to another kind's code."""

from __future__ import annotations

import pytest

from perfscope.errors import InputError
from perfscope.fixengine.kinds import KINDS, kind_of
from perfscope.fixengine.model import FixModule
from perfscope.fixengine.registry import discover


def test_every_fix_kind_has_an_adapter():
    fixes = discover()
    assert {f.kind for f in fixes.values()} <= set(KINDS)
    assert {kind_of(f).name for f in fixes.values()} == {"source", "launch"}
    for name, kind in KINDS.items():
        assert kind.name == name and kind.target_option.startswith("--") and kind.changes


def test_an_unknown_kind_is_refused():
    class Odd(FixModule):
        id = "odd"
        kind = "container-image"

    with pytest.raises(InputError, match="unknown kind 'container-image'"):
        kind_of(Odd())
