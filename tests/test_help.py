"""`--help` that teaches, walked over every command of the real CLI (its entry point run in-process,
with the environment a user's shell gives it: tests/clirun.py): examples
at the end that use only the command's real options, flags shown as flags, every option
described; `perfscope fix FIX_ID --help` shows that fix module's own document, for every module in
the fix registry."""

from __future__ import annotations

import functools
import os
import re
import shlex

import pytest
from clirun import invoke
from typer.main import get_command

from perfscope.cli import app
from perfscope.fixengine.registry import discover

COMMANDS = sorted(get_command(app).commands)


def helptext(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    r = invoke(*args, "--help", env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def flat(s: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", s).split())


def test_every_command_is_walked():
    assert {"demo", "trace", "diagnose", "report", "fix", "bench", "compare", "rules"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_teaches(name):
    cmd = get_command(app).commands[name]
    out = helptext(name)
    # flags as flags, values named by what they are: no typer type placeholders
    assert not re.search(r"<(bool|str|int|float|path)>", out), out
    # every option and argument is described, and the description is shown
    for p in cmd.params:
        assert p.help, f"{name} {p.name}: no help"
        assert flat(p.help)[:30] in flat(out), (name, p.name)
    # it ends with two to four real examples of this command
    tail = out[out.rindex("Examples"):]
    examples = re.findall(r"\$ (perfscope [^\n│]*)", tail)
    assert 2 <= len(examples) <= 4, tail
    known = {o for p in cmd.params for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]
             if o.startswith("-")} | {"--help"}  # --no-X of a --X/--no-X pair included
    for ex in examples:
        argv = shlex.split(ex.split(" > ")[0])
        assert argv[:2] == ["perfscope", name], ex
        for a in argv[2:]:
            if a.startswith("-"):
                assert a.split("=")[0] in known, (ex, a)
    # the rest of what the help says is the command's own doc (its exit codes included where it has them)
    assert flat(cmd.help.split("\n\n")[0])[:40] in flat(out)


def test_flags_show_as_flags():
    out = helptext("diagnose")
    row = next(ln for ln in out.splitlines() if "--json" in ln and "Print" in ln)
    assert re.search(r"--json\s+Print", flat(row)), row
    assert "--fail-on IDS" in flat(out) and "--top N" in flat(out)


@pytest.mark.parametrize("fid", sorted(discover()))
def test_fix_id_help_shows_that_fix_document(fid):
    fix = discover()[fid]
    out = flat(helptext("fix", fid))
    s = fix.summary()
    assert fix.title in out and "Requirements per strategy" in out
    for t in s["targets"]:
        assert t["name"] in out and t["versions"].split(" ")[0] in out
    for strategy in s["requirements"]:
        assert f"{strategy}:" in out
    assert f"$ perfscope fix {fid} --host gpu-box" in out and f"Every option: perfscope fix --help" in out
    assert "--bench-input-len" not in out and "Show this message and exit" not in out  # not the option list


def test_fix_help_without_a_known_id_is_the_generic_help():
    for args in (("fix",), ("fix", "no-such-fix")):
        out = flat(helptext(*args))
        assert "--restart-cmd CMD" in out and "Requirements per strategy" not in out


def ragged(out: str, width: int = 80) -> list[str]:
    """Lines of help prose that stop well short of the screen's edge although their paragraph goes
    on (the docstring's own line breaks shown on a narrower screen): in the description above the
    panels and in the command table's description column."""
    bad = []
    lines = [ln.rstrip() for ln in out.splitlines()]
    panel = [""] * len(lines)
    for i, ln in enumerate(lines):  # which panel each line is in ("" outside panels)
        panel[i] = ln[3:].split(" ")[0] if ln.startswith("╭─") else ("" if ln.startswith("╰") or not i else panel[i - 1])
    for i, (a, b) in enumerate(zip(lines, lines[1:])):
        if panel[i] == "Commands" and b.startswith("│ "):  # the commands table: "│ name      text  │"
            ta, tb = a.strip("│").rstrip(), b.strip("│").rstrip()
            cont = re.match(r"\s{5,}\S", tb)  # b continues a's description
            if cont and len(ta) < width - 30 and not re.match(r"\s*[-*$]", tb):
                bad.append(a)
        elif not panel[i] and re.match(r" \S", a) and re.match(r" [^\s$]", b) and len(a) < width - 30:
            bad.append(a)
    return bad


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_help_prose_wraps_at_the_screen_not_at_the_source(name):
    """At 80 columns a paragraph of help fills its lines: the docstring's hard line breaks (made for
    ~100 columns) are not kept, which left a fragment of two or three words on every other line."""
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    r = invoke(*([name] if name else []), "--help", env=env)
    assert r.returncode == 0, r.stderr
    assert ragged(r.stdout) == [], r.stdout
    # the root's own options are flags too
    if name is None:
        assert not re.search(r"<(bool|str|int|float|path)>", r.stdout), r.stdout


@pytest.mark.parametrize("args", [(c,) for c in COMMANDS] + [("fix", f) for f in sorted(discover())])
def test_help_cites_only_what_the_user_has(args):
    """No document the user does not have (the project's notes) and no timing of the project's own
    machine in any help; at 80 columns no option's help (the right-hand column: a URL, a path, a
    flag it names) is cut with an ellipsis, and no option name either (test_help_never_folds_a_token)."""
    text = helptext(*args)
    for word in ("field-facts", "this project's", "2-core box"):  # any case: "Field-facts §4" was missed
        assert word not in text.lower(), (args, word)
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    narrow = invoke(*args, "--help", env=env).stdout
    if args[0] == "fix" and len(args) > 1:
        return  # a fix's own document (Markdown) is not the option table
    cut = [ln for ln in narrow.splitlines() if "…" in ln]
    assert not cut, cut


def test_one_default_output_length():
    """trace, bench and fix --restart-cmd measure the same default output length."""
    defaults = {}
    for args, opt in ((("trace",), "--output-len"), (("bench",), "--output-len"), (("fix",), "--bench-output-len")):
        cmd = get_command(app).commands[args[0]]
        defaults[args[0]] = next(p.default for p in cmd.params if opt in p.opts)
    assert defaults == {"trace": 128, "bench": 128, "fix": 128}, defaults


@functools.lru_cache(maxsize=None)
def _help_at(args: tuple, columns: str | None) -> str:
    """``perfscope ARGS --help`` at ``columns`` (piped when None): the same text for every test that
    reads it, drawn once per session."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "dumb"
    if columns:
        env["COLUMNS"] = columns
    r = invoke(*args, "--help", env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _tokens(text: str) -> set[str]:
    """What a user pastes from an option's help: URLs, paths, flags, host[:port] forms."""
    out = set()
    for w in re.sub(r"\[/?[a-z ]*\]", " ", text).split():
        w = w.strip(".,;:()'\"`")
        if len(w) > 3 and ("/" in w or w.startswith("-") or "://" in w or re.search(r"\w:\d", w)):
            out.add(w.rstrip(")"))
    return out


@pytest.mark.parametrize("columns", ["80", None, "200"], ids=["80-columns", "piped", "200-columns"])
@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_help_never_folds_a_token(name, columns):
    """Item 5 of issue 23 for --help: at 80 columns and piped (rich's 80) typer's option table cut
    option names (--accept-new-hos…) and folded value names and the URLs / paths its help names
    mid-token ([USER@]HOST[:SSH / PORT], http://127.0.0.1: / 30000, /etc/ssh/ssh_known / _hosts).
    Every option's names with its value name are one unbroken line and every URL, path or flag of
    its help is whole on one line; at 200 columns the table is kept (name and help on one row)."""
    args = (name,) if name else ()
    out = _help_at(args, columns)
    lines = [re.sub(r"[│╭╮╰╯─]", " ", ln) for ln in out.splitlines()]
    width = int(columns or 80)
    assert max(len(ln) for ln in out.splitlines()) <= width, out
    assert "…" not in out, out
    group = get_command(app)
    cmd = group.commands[name] if name else group
    for p in cmd.params:
        if p.param_type_name != "option" or p.hidden:
            continue
        longs = [o for o in p.opts if o.startswith("--")]
        row = next((ln for raw, ln in zip(out.splitlines(), lines) if raw.startswith("│") and re.match(rf"\s*(\*\s+)?{re.escape(longs[0])}(\s|,|$)", ln)), None)
        assert row is not None, (name, longs[0], out)
        mv = p.metavar
        if mv:
            assert re.search(rf"(^|\s){re.escape(mv)}(\s|$)", row), (name, longs[0], mv, row)
        for tok in _tokens(p.help or ""):
            assert any(tok in ln for ln in lines), (name, longs[0], tok, out)
        if width >= 200:  # the table: the option's help starts on its own row
            assert flat(p.help)[:15] in flat(row), (name, longs[0], row)


def _examples_shown(out: str) -> list[str]:
    """The commands of the Examples panel as a shell reads them: a line ending in ' \\' goes on."""
    body = out[out.rindex("─ Examples "):].splitlines()[1:]
    cmds, going = [], False
    for raw in body:
        if not raw.startswith("│"):
            break
        ln = raw.strip("│").strip()
        if ln.startswith("$ "):
            cmds.append(ln[2:])
        elif going:
            cmds[-1] += " " + ln
        else:
            continue
        going = cmds[-1].endswith(" \\")
        if going:
            cmds[-1] = cmds[-1][:-2]
    return cmds


@pytest.mark.parametrize("columns", ["80", None, "200"], ids=["80-columns", "piped", "200-columns"])
@pytest.mark.parametrize("args", [(c,) for c in COMMANDS] + [("fix", f) for f in sorted(discover())])
def test_examples_paste_back_as_the_same_commands(args, columns):
    """An example wider than the screen was folded at the panel's edge, mid-argument ('systemctl │
    restart sglang'): pasted, it ran another command. Now it is broken between shell words with a
    trailing backslash: read as a shell reads it, each is exactly the command's own example."""
    out = _help_at(args, columns)
    assert max(len(ln) for ln in out.splitlines()) <= int(columns or 80), out
    cmd = get_command(app).commands[args[0]]
    want = [c for c, _ in (cmd.subject_examples(args[1]) if len(args) > 1 else cmd.examples)]
    assert _examples_shown(out) == want, out
    for c in _examples_shown(out):
        assert shlex.split(c)[:2] == ["perfscope", args[0]]


def test_readme_use_block_is_a_path_for_your_own_server():
    """The README's Use section: every perfscope command it shows parses with the real CLI (real
    options, valid values), and it has the recipe for a user's own SGLang server: by --url on its
    machine (SGLang, not only vLLM), by --host over SSH, diagnose and fix after each, and which
    torch the main command installs."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    use = text[text.index("\n## Use\n"):text.index("\n## What `diagnose`")]
    lines = [ln.split("  #")[0].strip() for block in re.findall(r"```\n(.*?)```", use, re.S)
             for ln in block.splitlines() if ln.strip().startswith("perfscope ")]
    group = get_command(app)
    for ln in lines:
        argv = shlex.split(ln)[1:]
        if "--help" in argv:
            continue
        group.commands[argv[0]].make_context(f"perfscope {argv[0]}", argv[1:])  # raises on a bad option
    sglang_url = [ln for ln in lines if ln.startswith("perfscope trace --url") and "--engine vllm" not in ln]
    ssh = [ln for ln in lines if ln.startswith("perfscope trace --host")]
    assert sglang_url and ssh, lines
    assert any(ln.startswith("perfscope fix ") and "--trace run1" in ln for ln in lines)
    assert "--remote-dir" in use and "known_hosts" in use and "torch 2.13.0" in use and "CUDA build" in use
