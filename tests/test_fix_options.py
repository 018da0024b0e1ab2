"""`perfscope fix`'s options: declared once in blocks (cli/_fix_options.py), given to the command as one
typed FixOptions whose checks run once, before any host is reached; RestartOptions checked when made."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from perfscope.cli import _fix_options
from perfscope.cli.fix import command
from perfscope.errors import InputError
from perfscope.fixengine.options import BenchSpec, FixOptions, RestartOptions


def test_every_option_fills_one_field():
    names = [p.name for p in _fix_options.PARAMS]
    assert len(names) == len(set(names))
    assert set(names) == {f.name for f in dataclasses.fields(FixOptions)}
    assert list(inspect.signature(command).parameters) == names  # what typer reads


@pytest.mark.parametrize("given, message", [
    ({"fix_id": None}, "give FIX_ID"),
    ({"apply": True, "revert": True}, "exclude each other"),
    ({"strategy": "fast"}, "--strategy fast"),
    ({"baseline": "old"}, "--baseline 'old'"),
    ({"restart_cmd": "true"}, "--restart-cmd goes with --apply or --revert"),
    ({"apply": True, "restart_cmd": " "}, "--restart-cmd is empty"),
    ({"apply": True, "out": "x"}, "--out goes with --restart-cmd"),
    ({"health_timeout": 0}, "--health-timeout 0"),
    ({"target_file": "a.py", "sglang_root": "/s"}, "not both"),
    ({"max_slowdown": -0.1}, "--max-slowdown -0.1"),
    ({"port": 70000}, "--port 70000"),
])
def test_each_bad_option_is_one_line(given, message):
    with pytest.raises(InputError, match=message):
        FixOptions(**{"fix_id": "eager-decode", **given}).check()


def test_restart_options():
    o = FixOptions(fix_id="fp8-kv-cast", apply=True, restart_cmd="systemctl restart sglang", bench_requests=40,
                   bench_max_requests=32, baseline="current")
    o.check()
    r = o.restart()
    assert r is not None and r.bench == BenchSpec(num_requests=40, max_requests=40) and r.fresh_baseline is False
    assert FixOptions(fix_id="fp8-kv-cast").restart() is None
    assert RestartOptions("true").fresh_baseline is None
    for bad in ({"cmd": ""}, {"cmd": "x", "health_timeout": -1}, {"cmd": "x", "max_slowdown": -1},
                {"cmd": "x", "baseline": "stale"}):
        with pytest.raises(InputError):
            RestartOptions(**bad)
