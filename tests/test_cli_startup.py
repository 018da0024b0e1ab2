"""What a command line costs before its command runs: only the command it names is imported and
built (rich only when something is drawn), and its option values are coerced without pydantic (perfscope/cli/_coerce.py) to exactly
what typer's own pydantic coercion gives, refusals left to typer (its words)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from paths import H200, REPO
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer.main import get_command

from perfscope.cli import _coerce, app

GROUP = get_command(app)
PARAMS = [(name, p) for name, cmd in sorted(GROUP.commands.items()) for p in cmd.params]
VALUES = [None, "7", "0", "-3", "007", " 5", "+5", "5_0", "1.5", "2.", "1e3", "abc", "", "run1/", "~/x",
          str(H200), str(H200 / "nothing-here"), 10, 2.5, True, ("a", "b/"), ["3", "4"], ("1", "x")]


def outcome(rp, value, param, ctx):
    try:
        return "ok", rp.coerce(value, param=param, ctx=ctx)
    except BadParameter as e:
        return "refused", e.message


@pytest.mark.parametrize("name,param", PARAMS, ids=[f"{n}:{p.name}" for n, p in PARAMS])
def test_plain_coercion_is_typers(name, param):
    ctx = Context(GROUP.commands[name], info_name=name)
    plain = _coerce.PlainFirst(param.type_descriptor)
    typers = build_runtime_param(param.type_descriptor)
    for value in [*VALUES, param.default]:
        if (param.multiple or param.nargs == -1) and isinstance(value, str):
            continue  # click hands a many-valued parameter a tuple, never a string
        assert outcome(plain, value, param, ctx) == outcome(typers, value, param, ctx), (name, param.name, value)


def test_a_command_line_imports_its_command_alone(tmp_path):
    """``perfscope diagnose TRACE --json`` imports no other command's module, no pydantic and no rich
    (nothing is drawn on a terminal), and still diagnoses."""
    probe = ("import json, sys\nfrom perfscope.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    code = e.code\nmods = sorted(m for m in sys.modules if m.startswith(('perfscope.cli.', 'pydantic', 'rich')))\n"
             "print(json.dumps({'code': code, 'mods': mods}), file=sys.stderr)\n")
    trace = H200 / "mla_pool_graph.json.xz"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", probe, "diagnose", str(trace), "--json"], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    got = json.loads(r.stderr.strip().splitlines()[-1])
    assert got["code"] == 0, r.stderr
    assert "perfscope.cli.diagnose" in got["mods"]
    others = {f"perfscope.cli.{n}" for n in GROUP.commands} - {"perfscope.cli.diagnose"}
    assert not others & set(got["mods"]), got["mods"]
    assert not [m for m in got["mods"] if m.startswith(("pydantic", "rich"))], got["mods"]
    assert json.loads(r.stdout)["steps"]


def test_a_typer_without_its_coercion_internals_still_runs_every_command(tmp_path):
    """_coerce uses typer's private coercion names; a typer release without them must leave perfscope
    working on typer's own coercion, same output, same refusals. Here the name _coerce imports is taken
    away while it imports (as if absent), then given back for typer's own use."""
    probe = ("import sys\nimport typer._param_types as m\nf = m.coerce_cli_path\ndel m.coerce_cli_path\n"
             "from perfscope.cli import _coerce\nm.coerce_cli_path = f\nassert _coerce.RuntimeParam is None\n"
             "from perfscope.cli import main\nmain(sys.argv[1:])\n")
    trace = H200 / "mla_pool_graph.json.xz"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def run(*args, hidden=True):
        cmd = [sys.executable, "-c", probe, *args] if hidden else [sys.executable, "-m", "perfscope", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    hid, plain = run("diagnose", str(trace), "--json", "--top", "3"), run("diagnose", str(trace), "--json", "--top", "3",
                                                                         hidden=False)
    assert hid.returncode == plain.returncode == 0, hid.stderr
    assert json.loads(hid.stdout) == json.loads(plain.stdout)
    bad, bad_plain = run("diagnose", str(trace), "--top", "x"), run("diagnose", str(trace), "--top", "x", hidden=False)
    assert bad.returncode == bad_plain.returncode == 2 and bad.stderr == bad_plain.stderr and "--top" in bad.stderr
