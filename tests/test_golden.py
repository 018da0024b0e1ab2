"""`perfscope diagnose --json` on every real trace and run folder of the repository equals its golden
output (tests/golden/diagnose.json.xz, made by tests/golden_snapshot.py): a change meant to keep
behaviour keeps it byte for byte. A change meant to alter the output regenerates the file
(`python tests/golden_snapshot.py --write`) and its diff is reviewed with the change."""

from __future__ import annotations

import pytest

import golden_snapshot as gs

# diagnose of every real trace (~1-2 min on 2 cores): run it by name after a change to the analysis
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_every_real_input_diagnoses_as_its_golden_output():
    want, got = gs.load(), gs.current()
    assert len(got) >= 60 and any("error" in v for v in got.values())  # refused inputs keep their line
    lines = gs.differences(want, got)
    assert not lines, ("diagnose's output changed (python tests/golden_snapshot.py --diff; "
                       "regenerate with --write when the change is meant):\n" + "\n".join(lines[:40]))


def test_the_comparison_names_what_changed():
    want = {"a": {"findings": [{"id": "x", "ms": 1.0}], "steps": {"count": 5}}, "gone": {}}
    got = {"a": {"findings": [{"id": "x", "ms": 2.0}], "steps": {"count": 5}}, "new": {}}
    lines = gs.differences(want, got)
    assert "new input (not in the golden file): new" in lines and "input gone: gone" in lines
    assert any(ln.startswith("changed: a: .findings[0].ms: 1.0 -> 2.0") for ln in lines), lines
    assert gs.differences(want, want) == []
