"""The rule registry and the fix registry agree: every rule's fix id names a fix module in fixes/
(the folder the id names, discovered by the registry, answering that rule), and every fix module
is reachable: its folder is discovered, a rule points to it, and `perfscope fix --list` shows it."""

from __future__ import annotations

import json

import pytest

from clirun import invoke
from paths import REPO
from perfscope.analysis.rules import RULES
from perfscope.fixengine.registry import discover, get

FIXES = REPO / "fixes"
FIX_FOLDERS = sorted(p.name for p in FIXES.iterdir() if (p / "__init__.py").is_file())


def test_rule_ids_are_unique():
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids)), ids


@pytest.mark.parametrize("rule", [r for r in RULES if r.fix], ids=lambda r: r.id)
def test_every_rule_fix_id_names_a_fix_module(rule):
    folder = FIXES / rule.fix.replace("-", "_")
    assert (folder / "__init__.py").is_file() and (folder / "README.md").is_file(), folder
    fix = get(rule.fix)
    assert fix.id == rule.fix and fix.folder.resolve() == folder.resolve()
    assert rule.id in fix.answers, (rule.id, fix.answers)  # the module says it answers this finding


@pytest.mark.parametrize("rule", [r for r in RULES if not r.fix], ids=lambda r: r.id)
def test_a_rule_without_a_fix_module_says_what_to_do(rule):
    assert rule.remedy.strip(), rule.id


@pytest.mark.parametrize("folder", FIX_FOLDERS)
def test_every_fix_module_is_reachable(folder):
    fixes = discover()
    fix = next((f for f in fixes.values() if f.folder.name == folder), None)
    assert fix is not None, f"fixes/{folder} defines no FIX the registry finds"
    assert fix.answers, fix.id
    rules = {r.id: r for r in RULES}
    for fid in fix.answers:  # each finding it answers is a rule that points back to it
        assert fid in rules and rules[fid].fix == fix.id, (fix.id, fid)
    rc, out, err = invoke("fix", "--list", "--json")
    assert rc == 0, err
    assert fix.id in {f["id"] for f in json.loads(out)}
